-- REAP (the background job): deletes up to $1 expired rows, oldest first,
-- and drops the answer of up to $1 rows that became tombstones (their
-- answer_until passed: what is left is the key, its fingerprint and when it
-- ends), skipping rows another proxy's job (or a request) holds: no long
-- lock. Answers how many rows it deleted, and how many it emptied.
WITH d AS (
    DELETE FROM idemproxy_keys
    WHERE key IN (SELECT key FROM idemproxy_keys WHERE expires_at <= now()
                  ORDER BY expires_at LIMIT $1::bigint FOR UPDATE SKIP LOCKED)
      AND expires_at <= now()
    RETURNING 1
), t AS (
    UPDATE idemproxy_keys SET head = NULL, body = NULL
    WHERE key IN (SELECT key FROM idemproxy_keys
                  WHERE answer_until <= now() AND head IS NOT NULL AND expires_at > now()
                  ORDER BY answer_until LIMIT $1::bigint FOR UPDATE SKIP LOCKED)
      AND answer_until <= now() AND expires_at > now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM t)
