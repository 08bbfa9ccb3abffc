-- Non-terminal turns nobody leases: ids a dead claimer left in the claiming list, then active turns in a
-- leased status without a lease and not parked (a parked turn is queued by its wake-up, never taken over).
-- Returns their ids (at most the limit).
-- KEYS: active zset, claiming list, parked zset.
-- ARGV: limit, status key prefix, status suffix, lease prefix, lease suffix, leased statuses (spaced).
-- Key names are built here (prefixes from workers.keys): fine on a single Redis, which kombu needs anyway.
local limit = tonumber(ARGV[1])
local leased = {}
for status in string.gmatch(ARGV[6], '%S+') do leased[status] = true end
local found, seen = {}, {}
local function lease_missing(id)
  return redis.call('EXISTS', ARGV[4] .. id .. ARGV[5]) == 0
end
for _, id in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  if #found >= limit then return found end
  if not seen[id] and lease_missing(id) then found[#found + 1] = id; seen[id] = true end
end
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if #found >= limit then return found end
  local st = redis.call('GET', ARGV[2] .. id .. ARGV[3])
  if st and leased[st] and not seen[id] and lease_missing(id) and not redis.call('ZSCORE', KEYS[3], id) then
    found[#found + 1] = id; seen[id] = true
  end
end
return found
