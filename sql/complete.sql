-- COMPLETE: $1 the store key, $2 token, $3 head, $4 body, $5 TTL (ms), $6 the
-- resource the answer created ('' when none), $7 the tombstone's TTL (ms, 0:
-- none): the row is kept that much longer, a tombstone from answer_until
-- on (doc/configuration.md, Tombstones).
-- Stores the answer if $2 holds the lock, or held it when the key became
-- unknown (a holder that comes back), and wakes duplicates held by --wait
-- (NOTIFY idemproxy_done, delivered at commit). A retry that finds its own
-- answer stored is answered too. One row: done; none: stale.
WITH u AS (
    UPDATE idemproxy_keys
    SET state = 'C', head = $3, body = $4, resource = NULLIF($6::text, ''), changed_at = now(),
        lease_until = NULL,
        cause = NULL, about = NULL,
        expires_at = now() + ($5::bigint + $7::bigint) * interval '1 millisecond',
        answer_until = CASE WHEN $7::bigint > 0
                            THEN now() + $5::bigint * interval '1 millisecond' END
    WHERE key = $1 AND token = $2 AND state <> 'C' AND expires_at > now()
    RETURNING key
)
SELECT true FROM u, LATERAL pg_notify('idemproxy_done', u.key)
UNION ALL
SELECT true FROM idemproxy_keys
WHERE key = $1 AND token = $2 AND state = 'C' AND expires_at > now()
  AND NOT coalesce(answer_until <= now(), false) AND NOT EXISTS (SELECT FROM u)
