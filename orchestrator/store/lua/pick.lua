-- Pick the next queued turn on a Redis Cluster: claim.lua's choice, in the queue's slot ({turns}); lease.lua
-- then leases it in the turn's own slot, and unpick.lua settles the pick (orchestrator.store.cluster).
-- Lanes in order, tenants in turn within a lane, a tenant at its max_running_turns passed over. The picked id
-- goes to the claiming list (a claimer that dies before leasing it leaves it there, for find_orphans) and to its
-- tenant's running set. Returns 0 when nothing is claimable; 2 when this call gave up after too many skipped ids
-- (call again at once); {1, turn id} when PICKED.
-- KEYS: the default tenant's normal queue, parked zset, claiming list, homes hash, then each lane's tenants (in
--       the order of ARGV[1]).
-- ARGV: lanes (spaced), lane queue prefix, running prefix, running suffix, caps ('tenant cap' pairs, spaced),
--       the cap of every other tenant (0: none), most ids to skip.
-- A turn with no home has ended (leave.lua): its ids are dropped from queues and running sets. Ids of other
-- tenants or lanes at the head of the default queue (a woken parked turn) move to their own queue, to its front
-- when the turn ran already.
local caps = {}
local words = {}
for word in string.gmatch(ARGV[5], '%S+') do words[#words + 1] = word end
for i = 1, #words, 2 do caps[words[i]] = tonumber(words[i + 1]) end
local default_cap = tonumber(ARGV[6])
local budget = tonumber(ARGV[7])
local legacy, parked, claiming, homes = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local DEFAULT, NORMAL = 'default', 'normal'

local function running_key(tenant) return ARGV[3] .. tenant .. ARGV[4] end
local function queue_key(lane, tenant)
  if lane == NORMAL and tenant == DEFAULT then return legacy end
  return ARGV[2] .. lane .. ':' .. tenant
end
local function home(id)
  local value = redis.call('HGET', homes, id)
  if not value then return nil end
  local lane, tenant = string.match(value, '^(%S+) (.*)$')
  return tenant, lane
end
local function rotate_in(lane_key, tenant)
  if not redis.call('LPOS', lane_key, tenant) then redis.call('RPUSH', lane_key, tenant) end
end

local lane_keys = {}
local lanes = {}
for lane in string.gmatch(ARGV[1], '%S+') do
  lanes[#lanes + 1] = lane
  lane_keys[lane] = KEYS[4 + #lanes]
end

local skipped = 0
while skipped < budget do
  local id = redis.call('LINDEX', legacy, 0)
  if not id then break end
  local tenant, lane = home(id)
  if tenant == DEFAULT and lane == NORMAL then break end
  redis.call('LPOP', legacy)
  if tenant then
    local started = redis.call('SISMEMBER', running_key(tenant), id) == 1
    redis.call(started and 'LPUSH' or 'RPUSH', queue_key(lane, tenant), id)
    rotate_in(lane_keys[lane], tenant)
  end
  skipped = skipped + 1
end
if redis.call('LLEN', legacy) > 0 then rotate_in(lane_keys[NORMAL], DEFAULT) end

local function running(tenant, cap)
  local key = running_key(tenant)
  local size = redis.call('SCARD', key)
  if size < cap then return size end
  local count = 0
  for _, id in ipairs(redis.call('SMEMBERS', key)) do
    if redis.call('HEXISTS', homes, id) == 0 then
      redis.call('SREM', key, id)
    elseif not redis.call('ZSCORE', parked, id) then
      count = count + 1
    end
  end
  return count
end

local function held_back(tenant, id)
  local cap = caps[tenant] or default_cap
  if cap <= 0 or redis.call('SISMEMBER', running_key(tenant), id) == 1 then return false end
  return running(tenant, cap) >= cap
end

for _, lane in ipairs(lanes) do
  local lane_key = lane_keys[lane]
  local visits = redis.call('LLEN', lane_key)
  while visits > 0 do
    local tenant = redis.call('LPOP', lane_key)
    if not tenant then break end
    local queue = queue_key(lane, tenant)
    local id = redis.call('LINDEX', queue, 0)
    if not id then
      visits = visits - 1
    elseif held_back(tenant, id) then
      redis.call('RPUSH', lane_key, tenant)
      visits = visits - 1
    else
      redis.call('LPOP', queue)
      if redis.call('LLEN', queue) > 0 then redis.call('RPUSH', lane_key, tenant) end
      if redis.call('HEXISTS', homes, id) == 1 then
        redis.call('RPUSH', claiming, id)
        redis.call('SADD', running_key(tenant), id)
        return {1, id}
      end
      skipped = skipped + 1
      if skipped >= budget then return 2 end
    end
  end
end
return 0
