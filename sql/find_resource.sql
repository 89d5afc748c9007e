-- FIND RESOURCE (for operators): the rows whose answer created the
-- resource $3 (the index on resource), their store keys in [$1, $2) (the
-- caller checks the layout), as inspect.sql lists them.
SELECT key, state, fp, (extract(epoch FROM now() - changed_at) * 1000)::bigint,
       greatest((extract(epoch FROM coalesce(answer_until, expires_at) - now()) * 1000)::bigint,
                0),
       0::bigint, cause, about, head, CASE WHEN $4::boolean THEN body END, resource
FROM idemproxy_keys
WHERE resource = $3 AND key >= $1 AND key < $2 AND expires_at > now()
  AND NOT coalesce(answer_until <= now(), false) -- a tombstone created nothing that lives
LIMIT 1000
