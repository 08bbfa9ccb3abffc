-- Wake the parked turns due by ARGV[1]: each leaves the parked set and goes to the front of the turn queue, where
-- any orchestrator claims it and resumes it (its wait's timer then fires). Atomic: one orchestrator wakes each.
-- Returns the ids woken (at most the limit).
-- KEYS: parked zset, turn queue. ARGV: due by (epoch s), limit.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('LPUSH', KEYS[2], id)
end
return due
