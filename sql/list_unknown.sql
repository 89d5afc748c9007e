-- LIST UNKNOWN (for operators): a page of the unknown rows after the row
-- numbered $1 whose store key lies in [$2, $3), in the order they were
-- made, $4 at most; the columns of inspect.sql and the row's number.
SELECT key, state, fp, (extract(epoch FROM now() - changed_at) * 1000)::bigint,
       greatest((extract(epoch FROM expires_at - now()) * 1000)::bigint, 0), 0::bigint,
       cause, about, NULL::bytea, NULL::bytea, id, coalesce(probes, 0)::bigint AS probes,
       probe_result
FROM idemproxy_keys
WHERE state = 'U' AND id > $1::bigint AND key >= $2 AND key < $3 AND expires_at > now()
ORDER BY id
LIMIT $4::bigint
