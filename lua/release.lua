-- RELEASE: KEYS[1] the idempotency key; ARGV[1] token. Deletes the lock if
-- ARGV[1] holds it, or the unknown record it held (its holder learned the
-- outcome after all); a key already gone is "ok"; a completed key is never
-- deleted. Returns "ok" or "stale".
local h = redis.call('HMGET', KEYS[1], 'state', 'token')
if not h[1] then
    return 'ok'
end
if h[2] ~= ARGV[1] or h[1] == 'C' then
    return 'stale'
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', 'idemproxy:done', KEYS[1]) -- one duplicate held by --wait may take it
return 'ok'
