-- Extend the leases an orchestrator holds. Returns the 1-based indexes (in KEYS) of those it does not hold.
-- KEYS: the leases. ARGV: orchestrator id, TTL ms.
local lost = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, tonumber(ARGV[2]))
  else
    lost[#lost + 1] = i
  end
end
return lost
