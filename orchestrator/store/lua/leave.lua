-- A turn's end on a Redis Cluster, in its shard's slot: the queue's part of save_outcome.lua. The turn leaves
-- the homes hash, the active index, the claiming list and its tenant's running set. Idempotent: a sweep runs it
-- again for an ended turn whose owner died before it did.
-- KEYS: homes hash, active zset, claiming list. ARGV: turn id, running prefix, running suffix.
-- Returns {1 when the turn was still active (else 0), 1 when it freed a place in its tenant's running set}: the
-- caller then pushes a ready token for the shard, as a held-back turn may be claimable now.
local home = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('LREM', KEYS[3], 0, ARGV[1])
local removed = redis.call('ZREM', KEYS[2], ARGV[1])
local freed = 0
if home then
  local tenant = string.match(home, '^%S+ (.*)$')
  freed = redis.call('SREM', ARGV[2] .. tenant .. ARGV[3], ARGV[1])
end
return {removed, freed}
