-- EXTEND: KEYS[1] the idempotency key; ARGV[1] token, ARGV[2] lock TTL (ms).
-- Restarts the lock's TTL if ARGV[1] still holds it. Returns "ok" or "stale".
local h = redis.call('HMGET', KEYS[1], 'state', 'token')
if h[1] ~= 'L' or h[2] ~= ARGV[1] then
    return 'stale'
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 'ok'
