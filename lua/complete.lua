-- COMPLETE: KEYS[1] the idempotency key; ARGV[1] token, ARGV[2] record head,
-- ARGV[3] body, ARGV[4] TTL (ms), ARGV[5] the resource the answer created
-- ("" when none: kept for a 422; the link key is written after, by SET,
-- being in another slot of a cluster); KEYS[2], on one server only, the
-- tombstone (ARGV[6] the fingerprint, ARGV[7] its TTL in ms), written with
-- the answer. Stores the response if ARGV[1] holds the
-- lock, or held it when the key became unknown (a holder that comes back);
-- a retry that finds its own response stored is "ok" too. token and fp
-- stay, so duplicates are still compared with the fingerprint.
-- Returns "ok" or "stale".
local h = redis.call('HMGET', KEYS[1], 'state', 'token')
if not h[1] or h[2] ~= ARGV[1] then
    return 'stale'
end
if h[1] == 'C' then
    return 'ok'
end
if h[1] == 'U' then
    redis.call('HDEL', KEYS[1], 'cause', 'about', 'probes', 'result', 'next', 'absent')
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'state', 'C', 'head', ARGV[2], 'body', ARGV[3], 'ts',
    tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[1], 'resource', ARGV[5])
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if KEYS[2] then -- its tombstone, on one server: ARGV[6] the fingerprint, ARGV[7] its TTL (ms)
    redis.call('SET', KEYS[2], ARGV[6], 'PX', ARGV[7])
end
redis.call('PUBLISH', 'idemproxy:done', KEYS[1]) -- wakes duplicates held by --wait
return 'ok'
