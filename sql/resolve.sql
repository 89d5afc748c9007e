-- RESOLVE (for operators): $1 the store key, $2 head, $3 body, $4 TTL (ms)
-- for a row that keeps none. Completes the key with the operator's answer
-- if its outcome is unknown. Answers 'ok', 'not_unknown', or no row (gone).
WITH u AS (
    UPDATE idemproxy_keys
    SET state = 'C', head = $2, body = $3, cause = NULL, about = NULL, changed_at = now(),
        lease_until = NULL,
        expires_at = now() + (CASE WHEN keep_ms > 0 THEN keep_ms ELSE $4::bigint END)
                             * interval '1 millisecond'
    WHERE key = $1 AND state = 'U' AND expires_at > now()
    RETURNING key
)
SELECT 'ok'::text FROM u, LATERAL pg_notify('idemproxy_done', u.key)
UNION ALL
SELECT 'not_unknown' FROM idemproxy_keys
WHERE key = $1 AND expires_at > now() AND NOT EXISTS (SELECT FROM u)
