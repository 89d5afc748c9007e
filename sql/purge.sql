-- PURGE (for operators): $1 the store key. Deletes its row, whatever its
-- state, so that its request may run again. One row: done; none: there
-- was no such key (an expired row is deleted all the same).
WITH d AS (DELETE FROM idemproxy_keys WHERE key = $1 RETURNING expires_at > now() AS live)
SELECT true FROM d WHERE live
