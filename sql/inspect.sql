-- INSPECT (for operators): the rows whose store key lies in [$1, $2) and
-- ends with ':' $3 (the caller checks the layout: prefix, scope, key), the
-- body of completed ones when $4, the resource each answer created, and
-- whether it is a tombstone (its answer expired: not sent). What is left of
-- a completed answer is until its answer_until (its tombstone comes after),
-- of a tombstone until expires_at. Times are milliseconds.
SELECT key, state, fp, (extract(epoch FROM now() - changed_at) * 1000)::bigint,
       greatest((extract(epoch FROM CASE WHEN answer_until > now() THEN answer_until
                                         ELSE expires_at END - now()) * 1000)::bigint, 0),
       CASE WHEN state = 'L'
            THEN greatest((extract(epoch FROM lease_until - now()) * 1000)::bigint, 0)
            ELSE 0 END,
       cause, about, head, CASE WHEN $4::boolean THEN body END, resource,
       coalesce(answer_until <= now(), false), coalesce(probes, 0)::bigint AS probes,
       probe_result
FROM idemproxy_keys
WHERE key >= $1 AND key < $2 AND right(key, length($3) + 1) = ':' || $3 AND expires_at > now()
LIMIT 1000
