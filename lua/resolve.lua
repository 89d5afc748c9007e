-- RESOLVE (for operators): KEYS[1] a store key; ARGV[1] record head, ARGV[2]
-- body, ARGV[3] TTL (ms) for a record that does not say its own (keep).
-- Completes the key with the operator's answer if its outcome is unknown.
-- Returns "ok", "gone" or "not_unknown".
local h = redis.call('HMGET', KEYS[1], 'state', 'keep')
if not h[1] then
    return 'gone'
end
if h[1] ~= 'U' then
    return 'not_unknown'
end
local t = redis.call('TIME')
redis.call('HDEL', KEYS[1], 'cause', 'about', 'probes', 'result', 'next', 'absent')
redis.call('HSET', KEYS[1], 'state', 'C', 'head', ARGV[1], 'body', ARGV[2], 'ts',
    tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local keep = tonumber(h[2] or '0')
redis.call('PEXPIRE', KEYS[1], keep > 0 and keep or ARGV[3])
redis.call('PUBLISH', 'idemproxy:done', KEYS[1]) -- wakes duplicates held by --wait
return 'ok'
