-- INSPECT (for operators): KEYS[1] a store key; ARGV[1] "1" to include the
-- body. Returns {state, fp, ts, head, body, pttl, now, keep, cause, about,
-- resource, probes, result} (probes and result: probe.lua's)
-- (false for a missing field; ts and now are Redis times in ms), or {} when
-- the key is gone.
local h = redis.call('HMGET', KEYS[1], 'state', 'fp', 'ts', 'head', 'keep', 'cause', 'about',
    'resource', 'probes', 'result')
if not h[1] then
    return {}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local body = false
if ARGV[1] == '1' and h[1] == 'C' then
    body = redis.call('HGET', KEYS[1], 'body')
end
return {h[1], h[2], h[3] or false, h[4] or false, body, redis.call('PTTL', KEYS[1]), now,
    h[5] or false, h[6] or false, h[7] or false, h[8] or false, h[9] or false, h[10] or false}
