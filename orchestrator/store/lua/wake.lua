-- Wake the parked turns due by ARGV[1]: each leaves the parked set and goes to the front of the turn queue, where
-- any orchestrator claims it and resumes it (its wait's timer then fires). Atomic: one orchestrator wakes each.
-- Returns the ids woken (at most the limit).
-- KEYS: parked zset, turn queue, then (on one Redis) the ready tokens. ARGV: due by (epoch s), limit, how many
-- ready tokens are kept.
-- Each woken turn pushes a ready token, as a submit does: a blocked claimer takes it at once. On a Redis
-- Cluster the tokens are in another slot: the caller announces the woken turns (orchestrator.store.cluster).
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(due) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('LPUSH', KEYS[2], id)
  -- Trimmed only past its cap: RPUSH tells the length.
  if KEYS[3] and redis.call('RPUSH', KEYS[3], '1') > tonumber(ARGV[3]) then
    redis.call('LTRIM', KEYS[3], -tonumber(ARGV[3]), -1)
  end
end
return due
