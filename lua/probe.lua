-- PROBE: a step of an unknown key's reconcile (store.h, store_probe()).
-- KEYS[1] a store key; ARGV[1] the step: "claim" (ARGV[2] settle, ARGV[3]
-- every (ms), ARGV[4] attempts), "found" (ARGV[2] record head, ARGV[3]
-- body, ARGV[4] TTL (ms) for a record that does not say its own, as
-- resolve.lua; ARGV[5] the Redis time in ms its claim gave), "absent" or
-- "failed" (ARGV[2] that time). A found, absent or failed whose claim came
-- before the key became unknown (ts) is of an earlier unknown period:
-- "known", nothing written. Beside acquire.lua's fields, an unknown key's hash keeps its
-- probes: probes (the claims made), result ("absent" or "failed"; none
-- yet: missing), next (Redis time in ms before which no other claim) and
-- absent (the claim time of the first absent of the current run).
-- unknown.lua and acquire.lua delete them when the key becomes unknown or
-- is locked again, so a key made unknown a second time starts from none.
-- A claim changes neither the key's TTL nor ts (when it became unknown).
-- Returns "gone", "known" (not unknown: nothing written), {"claimed", now
-- (ms), probes}, {"later", ms to wait}, "spent", "noted" or "released".
local h = redis.call('HMGET', KEYS[1], 'state', 'ts', 'keep', 'probes', 'result', 'next',
    'absent')
if not h[1] then
    return 'gone'
end
if h[1] ~= 'U' then
    return 'known'
end
local function now()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local step = ARGV[1]
if step == 'claim' then
    local probes = tonumber(h[4] or '0')
    if probes >= tonumber(ARGV[4]) then
        return 'spent'
    end
    local t, from, paced = now(), tonumber(h[2] or '0') + tonumber(ARGV[2]), tonumber(h[6] or '0')
    if paced > from then
        from = paced
    end
    if t < from then
        return {'later', from - t}
    end
    redis.call('HSET', KEYS[1], 'probes', probes + 1, 'next', t + tonumber(ARGV[3]))
    return {'claimed', t, probes + 1}
end
local sent = tonumber(step == 'found' and ARGV[5] or ARGV[2])
if sent < tonumber(h[2] or '0') then -- claimed before the key last became unknown
    return 'known'
end
if step == 'found' then -- completed as resolve.lua does
    redis.call('HDEL', KEYS[1], 'cause', 'about', 'probes', 'result', 'next', 'absent')
    redis.call('HSET', KEYS[1], 'state', 'C', 'head', ARGV[2], 'body', ARGV[3], 'ts', now())
    local keep = tonumber(h[3] or '0')
    redis.call('PEXPIRE', KEYS[1], keep > 0 and keep or ARGV[4])
    redis.call('PUBLISH', 'idemproxy:done', KEYS[1]) -- wakes duplicates held by --wait
    return 'noted'
end
if step == 'absent' then
    if h[5] ~= 'absent' then -- the first of a run
        redis.call('HSET', KEYS[1], 'result', 'absent', 'absent', ARGV[2])
        return 'noted'
    end
    local first = tonumber(h[7] or '0')
    if sent >= first + 1000 then -- store.h's STORE_ABSENT_GAP_MS
        redis.call('DEL', KEYS[1])
        redis.call('PUBLISH', 'idemproxy:done', KEYS[1]) -- its next retry may run
        return 'released'
    end
    if sent < first then -- answers of two probes that crossed
        redis.call('HSET', KEYS[1], 'absent', ARGV[2])
    end
    return 'noted'
end
if step ~= 'failed' then
    return redis.error_reply('probe.lua: no such step')
end
redis.call('HSET', KEYS[1], 'result', 'failed') -- an absent run ends
return 'noted'
