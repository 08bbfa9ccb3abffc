-- Claim the next queued turn: lanes in order (interactive, normal, batch), and within a lane the tenants in
-- turn (round robin: the tenant served goes to the back of the lane's rotation), skipping a tenant at its
-- max_running_turns; lease it and read the request adopting it starts from.
-- Returns 0 when nothing is claimable; 2 when this call gave up after too many skipped ids (call again at
-- once); {1, turn id, request or false, 1 when the turn has a saved state (else 0)} when CLAIMED.
-- KEYS: the previous releases' queue (the default tenant's normal lane), parked zset, then each lane's
--       tenants (in the order of ARGV[14]), then the ready tokens.
-- With nothing claimable the ready tokens are dropped: each announced a turn claimed since (a claimer takes
-- the queue's next turns without waiting for their tokens) or a place freed that nothing queued can use, and
-- every orchestrator woken by one would only run this script to find nothing. A turn queued later pushes a
-- token of its own.
-- ARGV: orchestrator id, lease TTL ms, queued status, running status, terminal statuses (spaced),
--       status prefix, status suffix, lease prefix, lease suffix, request prefix, request suffix, state
--       prefix, state suffix, lanes (spaced), lane queue prefix, running prefix, running suffix,
--       caps ('tenant cap' pairs, spaced), the cap of every other tenant (0: none), most ids to skip.
-- Key names are built here (prefixes from workers.keys): fine on a single Redis, which kombu needs anyway.
-- A tenant's running set holds the turns it claimed and that have not ended: its terminal write removes
-- each (save_outcome.lua), and so does this script, when it counts a set at the cap, for a turn that ended
-- or expired otherwise; a parked turn (waiting for people, no lease) is not counted. A turn in the set
-- already (woken from parking, put back by a lost claim) is never held back by the cap.
local terminal = {}
for status in string.gmatch(ARGV[5], '%S+') do terminal[status] = true end
local caps = {}
local words = {}
for word in string.gmatch(ARGV[18], '%S+') do words[#words + 1] = word end
for i = 1, #words, 2 do caps[words[i]] = tonumber(words[i + 1]) end
local default_cap = tonumber(ARGV[19])
local budget = tonumber(ARGV[20])
local legacy, parked = KEYS[1], KEYS[2]
local DEFAULT, NORMAL = 'default', 'normal'

local function status_key(id) return ARGV[6] .. id .. ARGV[7] end
local function running_key(tenant) return ARGV[16] .. tenant .. ARGV[17] end
local function queue_key(lane, tenant)
  if lane == NORMAL and tenant == DEFAULT then return legacy end
  return ARGV[15] .. lane .. ':' .. tenant
end

-- A request read once per call: the queue's head is read for its tenant, then again as the turn leased.
local requests = {}
local function request_of(id)
  if requests[id] == nil then requests[id] = redis.call('GET', ARGV[10] .. id .. ARGV[11]) end
  return requests[id]
end

-- The tenant and lane a request names ('default', 'normal' when it names none, or does not parse).
local function tenant_and_lane(id)
  local raw = request_of(id)
  if not raw then return DEFAULT, NORMAL end
  local ok, request = pcall(cjson.decode, raw)
  if not ok or type(request) ~= 'table' then return DEFAULT, NORMAL end
  local tenant, lane = request['tenant'], request['priority']
  if type(tenant) ~= 'string' then tenant = DEFAULT end
  if lane ~= 'interactive' and lane ~= 'batch' then lane = NORMAL end
  return tenant, lane
end

local function rotate_in(lane_key, tenant)
  if not redis.call('LPOS', lane_key, tenant) then redis.call('RPUSH', lane_key, tenant) end
end

local lane_keys = {}
local lanes = {}
for lane in string.gmatch(ARGV[14], '%S+') do
  lanes[#lanes + 1] = lane
  lane_keys[lane] = KEYS[2 + #lanes]
end

-- Ids of other tenants or lanes at the head of the previous releases' queue (a woken parked turn, pushed to
-- its front; a release that knows no tenants) move to their own queue: to its front when the turn ran
-- already (it was queued before any of that queue's), else to its back.
local moved = 0
while moved < budget do
  local id = redis.call('LINDEX', legacy, 0)
  if not id then break end
  local tenant, lane = tenant_and_lane(id)
  if tenant == DEFAULT and lane == NORMAL then break end
  redis.call('LPOP', legacy)
  local started = redis.call('SISMEMBER', running_key(tenant), id) == 1
  redis.call(started and 'LPUSH' or 'RPUSH', queue_key(lane, tenant), id)
  rotate_in(lane_keys[lane], tenant)
  moved = moved + 1
end
if redis.call('LLEN', legacy) > 0 then rotate_in(lane_keys[NORMAL], DEFAULT) end

-- How many of the tenant's turns run now, counted against `cap`: its set cleaned first when it is full.
local function running(tenant, cap)
  local key = running_key(tenant)
  local size = redis.call('SCARD', key)
  if size < cap then return size end
  local count = 0
  for _, id in ipairs(redis.call('SMEMBERS', key)) do
    local st = redis.call('GET', status_key(id))
    if not st or terminal[st] then
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

local function lease(id, tenant)
  local st = redis.call('GET', status_key(id))
  if not st or terminal[st] then return nil end
  if not redis.call('SET', ARGV[8] .. id .. ARGV[9], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then return nil end
  if st == ARGV[3] then redis.call('SET', status_key(id), ARGV[4]) end
  redis.call('SADD', running_key(tenant), id)
  local has_state = redis.call('EXISTS', ARGV[12] .. id .. ARGV[13])
  return {1, id, request_of(id), has_state}
end

local skipped = 0
for _, lane in ipairs(lanes) do
  local lane_key = lane_keys[lane]
  -- Each tenant of the lane is visited at most once per call, plus the ids skipped (ended, leased).
  local visits = redis.call('LLEN', lane_key)
  while visits > 0 do
    local tenant = redis.call('LPOP', lane_key)
    if not tenant then break end
    local queue = queue_key(lane, tenant)
    local id = redis.call('LINDEX', queue, 0)
    if not id then
      visits = visits - 1  -- nothing queued: out of the rotation until its next submit
    elseif held_back(tenant, id) then
      redis.call('RPUSH', lane_key, tenant)
      visits = visits - 1
    else
      redis.call('LPOP', queue)
      if redis.call('LLEN', queue) > 0 then redis.call('RPUSH', lane_key, tenant) end
      local claimed = lease(id, tenant)
      if claimed then return claimed end
      skipped = skipped + 1
      if skipped >= budget then return 2 end
    end
  end
end
redis.call('DEL', KEYS[3 + #lanes])
return 0
