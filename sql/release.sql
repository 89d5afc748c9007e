-- RELEASE: $1 the store key, $2 token. Deletes the lock if $2 holds it, or
-- the unknown record it held (its holder learned the outcome after all);
-- a completed key is never deleted. One duplicate held by --wait may take
-- the key. One row: done (a key already gone too); none: stale.
WITH d AS (
    DELETE FROM idemproxy_keys
    WHERE key = $1 AND token = $2 AND state <> 'C' AND expires_at > now()
    RETURNING key
)
SELECT true FROM d, LATERAL pg_notify('idemproxy_done', d.key)
UNION ALL
SELECT true
WHERE NOT EXISTS (SELECT FROM d)
  AND NOT EXISTS (SELECT FROM idemproxy_keys WHERE key = $1 AND expires_at > now())
