-- EXTEND: $1 the store key, $2 token, $3 lease (ms). Renews the lease if
-- $2 still holds the lock; the row is kept its keep time beyond it. One
-- row: done; none: stale.
UPDATE idemproxy_keys
SET lease_until = now() + $3::bigint * interval '1 millisecond',
    expires_at = now() + ($3::bigint + keep_ms) * interval '1 millisecond'
WHERE key = $1 AND token = $2 AND state = 'L' AND expires_at > now()
RETURNING true
