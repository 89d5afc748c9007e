-- ACQUIRE: KEYS[1] the idempotency key, KEYS[2] (one server only) its
-- tombstone: where there is no record but a tombstone, {"expired"} and
-- nothing written; ARGV[1] fingerprint (hex), ARGV[2]
-- fencing token, ARGV[3] lease (ms), ARGV[4] keep (ms), ARGV[5] "1" to take
-- over a lapsed lock or an unknown key (on-unknown-outcome retry), "0" to
-- make a lapsed lock unknown (refuse), ARGV[6] what an unknown record says
-- of its request ("route method target"), ARGV[7] "1" to probe: where there
-- is no record, answer {"absent"} and write nothing (the caller looks for a
-- tombstone, a key of its own, then sends it again with "0": doc/stores.md,
-- The state machine), ARGV[8] the acquiring request's trace context (a W3C
-- traceparent; "": none). The key is one hash: state (L
-- locked, C completed, U unknown), fp, token, ts (Redis time in ms of the
-- last state change, for operators), keep, and trace when the request that
-- locked it had one (written with the lock, replaced by a take-over, left
-- by complete, unknown and resolve); once completed head and body;
-- once unknown cause and about, and its probes' fields (probe.lua), which
-- are deleted when it becomes unknown or is locked again.
-- The record outlives its lease: a lock's key expires lease + keep from its
-- last extend, so its lease has run out once its PTTL is keep or less. A
-- lock made before keep existed has none: its lease is its whole TTL.
-- Returns {"acquired"}, {"expired"}, {"absent"}, {"mismatch", resource ("" when none), trace},
-- {"in_flight", trace}, {"completed", head, body, trace} or {"unknown", cause,
-- about, became ("1": made unknown just now), trace}, where trace is the
-- trace context kept with the key ("" when none; made unknown just now:
-- its holder's).
-- One HMGET reads what every answer needs: a replay, the common case of a
-- known key, costs one call. Sent again with the same token (its connection
-- was lost before the answer, or a cluster failed over), it finds its own
-- lock and says "acquired" again.
local h = redis.call('HMGET', KEYS[1], 'state', 'fp', 'head', 'body', 'token', 'keep', 'cause',
    'about', 'resource', 'trace')
local state, fp, trace = h[1], h[2], h[10] or ''
local function now()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function lock()
    if state then -- taken over (a lapsed lock, an unknown key): an unknown record's fields go,
        -- and so does the trace context of the request that held it
        redis.call('HDEL', KEYS[1], 'cause', 'about', 'probes', 'result', 'next', 'absent', 'trace')
    end
    redis.call('HSET', KEYS[1], 'state', 'L', 'fp', ARGV[1], 'token', ARGV[2], 'ts', now(),
        'keep', ARGV[4])
    if (ARGV[8] or '') ~= '' then
        redis.call('HSET', KEYS[1], 'trace', ARGV[8])
    end
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) + tonumber(ARGV[4]))
    return {'acquired'}
end
if not state then
    if ARGV[7] == '1' then
        return {'absent'}
    end
    if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then
        return {'expired'}
    end
    return lock()
end
if fp ~= ARGV[1] then
    return {'mismatch', h[9] or '', trace}
end
if state == 'L' then
    if h[5] == ARGV[2] then
        return {'acquired'}
    end
    local keep = tonumber(h[6] or '0')
    if keep == 0 or redis.call('PTTL', KEYS[1]) > keep then
        return {'in_flight', trace}
    end
    if ARGV[5] == '1' then
        return lock()
    end
    redis.call('HDEL', KEYS[1], 'probes', 'result', 'next', 'absent')
    redis.call('HSET', KEYS[1], 'state', 'U', 'cause', 'holder_lost', 'about', ARGV[6], 'ts', now())
    redis.call('PEXPIRE', KEYS[1], keep)
    return {'unknown', 'holder_lost', ARGV[6], '1', trace}
end
if state == 'U' then
    if ARGV[5] == '1' then
        return lock()
    end
    return {'unknown', h[7] or '', h[8] or '', '0', trace}
end
return {'completed', h[3], h[4], trace}
