-- REAP (the background job): deletes up to $1 expired rows, oldest first,
-- skipping rows another proxy's job (or a request) holds: no long lock.
-- Answers how many it deleted.
WITH d AS (
    DELETE FROM idemproxy_keys
    WHERE key IN (SELECT key FROM idemproxy_keys WHERE expires_at <= now()
                  ORDER BY expires_at LIMIT $1::bigint FOR UPDATE SKIP LOCKED)
      AND expires_at <= now()
    RETURNING 1
)
SELECT count(*) FROM d
