-- Every non-terminal turn with its status, oldest submitted first: id, status ('' when it has none), id, ...
-- (what `toolloop pending` looks through, in one round trip however many turns are active).
-- KEYS: active zset. ARGV: status key prefix, status suffix.
local out = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('GET', ARGV[1] .. id .. ARGV[2]) or ''
end
return out
