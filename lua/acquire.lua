-- ACQUIRE: KEYS[1] the idempotency key; ARGV[1] fingerprint (hex), ARGV[2]
-- fencing token, ARGV[3] lock TTL (ms). The key is one hash: state (L locked,
-- C completed), fp, token, ts (Redis time in ms of the last state change,
-- for operators), and once completed head and body.
-- Returns {"acquired"}, {"mismatch"}, {"in_flight"} or {"completed", head, body}.
-- One HMGET reads all five fields: a replay, the common case of a known key,
-- costs one call (head and body are absent while the key is locked). Sent
-- again with the same token (its connection was lost before the answer, or
-- a cluster failed over), it finds its own lock and says "acquired" again.
local h = redis.call('HMGET', KEYS[1], 'state', 'fp', 'head', 'body', 'token')
local state, fp = h[1], h[2]
if not state then
    local t = redis.call('TIME')
    redis.call('HSET', KEYS[1], 'state', 'L', 'fp', ARGV[1], 'token', ARGV[2], 'ts',
        tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {'acquired'}
end
if fp ~= ARGV[1] then
    return {'mismatch'}
end
if state == 'L' then
    if h[5] == ARGV[2] then
        return {'acquired'}
    end
    return {'in_flight'}
end
return {'completed', h[3], h[4]}
