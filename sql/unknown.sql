-- UNKNOWN: $1 the store key, $2 token, $3 cause, $4 about, $5 keep (ms).
-- The holder of $2 cannot tell whether its request ran upstream: the key
-- becomes unknown, and duplicates held by --wait get that answer. Sent
-- again, it finds its own unknown record. One row: done; none: stale.
WITH u AS (
    UPDATE idemproxy_keys
    SET state = 'U', cause = $3, about = $4, changed_at = now(), lease_until = NULL,
        probes = NULL, probe_next = NULL, probe_result = NULL, absent_at = NULL,
        expires_at = now() + $5::bigint * interval '1 millisecond'
    WHERE key = $1 AND token = $2 AND state = 'L' AND expires_at > now()
    RETURNING key
)
SELECT true FROM u, LATERAL pg_notify('idemproxy_done', u.key)
UNION ALL
SELECT true FROM idemproxy_keys
WHERE key = $1 AND token = $2 AND state = 'U' AND expires_at > now() AND NOT EXISTS (SELECT FROM u)
