-- UNKNOWN: KEYS[1] the idempotency key; ARGV[1] token, ARGV[2] cause,
-- ARGV[3] about ("route method target"), ARGV[4] keep (ms). The holder of
-- ARGV[1] cannot tell whether its request ran upstream: the key becomes
-- unknown, kept ARGV[4]. Sent again, it finds its own unknown record: "ok".
-- Returns "ok" or "stale".
local h = redis.call('HMGET', KEYS[1], 'state', 'token')
if not h[1] or h[2] ~= ARGV[1] or h[1] == 'C' then
    return 'stale'
end
if h[1] == 'U' then
    return 'ok'
end
local t = redis.call('TIME')
redis.call('HDEL', KEYS[1], 'probes', 'result', 'next', 'absent') -- its probes start from none
redis.call('HSET', KEYS[1], 'state', 'U', 'cause', ARGV[2], 'about', ARGV[3], 'ts',
    tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PUBLISH', 'idemproxy:done', KEYS[1]) -- duplicates held by --wait get the answer
return 'ok'
