-- The concurrency slots of a tool (`workers.concurrency`): a sorted set per limit, the fleet's slots of the
-- tool and a tenant's slots of it, each member an execution's token scored by when its slot expires (ms,
-- Redis's own clock, TIME, so that every worker counts on one clock). An entry outlives its execution only
-- when nobody released it (a killed worker): it is dropped once expired, and a key with no live entry
-- expires with its last one.
-- KEYS: the tool's slots, the tenant's slots of the tool. A limit the tool does not have has no key: '' or, on
--   a Redis Cluster (every key of a script in one slot; '' is in slot 0), the other key again (both are in
--   the tool's slot).
-- ARGV[1] = 'acquire': holder (the execution's token), the tool's limit, the tenant's limit (0 for a limit
--   the tool does not have: its key is left alone), slot TTL ms. Takes a slot in each limit, or in none.
--   Returns {workers.scripts.SlotResult, value}: {1 ACQUIRED, 0} (also when the holder holds them already: a
--   repeat after a lost reply), {0 TOOL_FULL, slots held} or {2 TENANT_FULL, slots held}; the tool's limit
--   is looked at first.
-- ARGV[1] = 'release': holder, '1' when the holder is a prefix of tokens (the worker's parent releasing for
--   a pool process it lost: `<attempt>|<worker>:<pid>:`). Returns how many entries it removed (a key given
--   twice gives up its entries once).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local holder = ARGV[2]

if ARGV[1] == 'release' then
  local removed = 0
  for _, key in ipairs(KEYS) do
    if key ~= '' then
      if ARGV[3] == '1' then
        -- At most a limit's worth of live entries: a scan is as cheap as a lookup.
        for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
          if string.sub(member, 1, #holder) == holder then
            removed = removed + redis.call('ZREM', key, member)
          end
        end
      else
        removed = removed + redis.call('ZREM', key, holder)
      end
    end
  end
  return removed
end

local limits = {tonumber(ARGV[3]), tonumber(ARGV[4])}
local expires_at = now + tonumber(ARGV[5])
local function limited(index) return KEYS[index] ~= '' and limits[index] > 0 end
for index, key in ipairs(KEYS) do
  if limited(index) then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    local held = redis.call('ZCARD', key)
    if not redis.call('ZSCORE', key, holder) and held >= limits[index] then
      return {index == 1 and 0 or 2, held}
    end
  end
end
for index, key in ipairs(KEYS) do
  if limited(index) then
    redis.call('ZADD', key, expires_at, holder)
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', key, tonumber(last[2]) + 1000)
  end
end
return {1, 0}
