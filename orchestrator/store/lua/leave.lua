-- A turn's end on a Redis Cluster, in the queue's slot ({turns}): the queue's part of save_outcome.lua. The turn
-- leaves the homes hash, the active index and its tenant's running set; a ready token wakes a claimer for the
-- place it freed. Idempotent: a sweep runs it again for an ended turn whose owner died before it did.
-- KEYS: homes hash, active zset, claiming list, ready tokens. ARGV: turn id, running prefix, running suffix, how
-- many ready tokens are kept. Returns 1 when the turn was still there.
local home = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('LREM', KEYS[3], 0, ARGV[1])
local removed = redis.call('ZREM', KEYS[2], ARGV[1])
if home then
  local tenant = string.match(home, '^%S+ (.*)$')
  if redis.call('SREM', ARGV[2] .. tenant .. ARGV[3], ARGV[1]) == 1 then
    redis.call('RPUSH', KEYS[4], '1')
    redis.call('LTRIM', KEYS[4], -tonumber(ARGV[4]), -1)
  end
end
return removed
