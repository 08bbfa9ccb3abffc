-- Lease a turn pick.lua picked, on a Redis Cluster, in the turn's slot: as claim.lua's lease. Returns {1, request
-- or false, 1 when the turn has a saved state (else 0)} when LEASED; {0} when the turn has ended or is unknown;
-- {-1} when another orchestrator holds it.
-- KEYS: status, lease, request, state, events.
-- A first lease keeps the keys submit.lua gave an expiry until the turn was queued (their end sets it again).
-- ARGV: orchestrator id, lease TTL ms, queued status, running status, terminal statuses (spaced).
local terminal = {}
for status in string.gmatch(ARGV[5], '%S+') do terminal[status] = true end
local st = redis.call('GET', KEYS[1])
if not st or terminal[st] then return {0} end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then return {-1} end
if st == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[4])
  for _, key in ipairs({KEYS[3], KEYS[5]}) do redis.call('PERSIST', key) end
end
return {1, redis.call('GET', KEYS[3]) or false, redis.call('EXISTS', KEYS[4])}
