-- EXTEND: KEYS[1] the idempotency key; ARGV[1] token, ARGV[2] lease (ms).
-- Renews the lease if ARGV[1] still holds the lock: the key then expires
-- lease + keep from now (acquire.lua). A bare PEXPIRE, which Redis allows
-- even at maxmemory under noeviction. Returns "ok" or "stale".
local h = redis.call('HMGET', KEYS[1], 'state', 'token', 'keep')
if h[1] ~= 'L' or h[2] ~= ARGV[1] then
    return 'stale'
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) + tonumber(h[3] or '0'))
return 'ok'
