-- Queue a stored turn on a Redis Cluster: the queue's part of submit.lua, in its shard's slot, once. The caller
-- then pushes a ready token naming the shard (the tokens are another slot's: `{turns}`).
-- Returns 1 QUEUED, 0 when the turn is queued or claimed already (a retried submit).
-- KEYS: homes hash, active zset, recent zset, the queue of its lane and tenant, the lane's tenants.
-- ARGV: turn id, submitted at, how many recent turns are kept, tenant, lane, '1' to queue it ('' to only index
--       a turn that waits behind its conversation's: it is queued when that one ends).
-- The homes hash holds each active turn's lane and tenant ("<lane> <tenant>") from here to leave.lua: what the
-- claim (pick.lua) reads on this side, where the turn's request is out of reach. The indexes keep the time a
-- turn was first given (NX): a turn indexed while it waited keeps its submit time when it is queued.
local function index()
  redis.call('ZADD', KEYS[2], 'NX', tonumber(ARGV[2]), ARGV[1])
  redis.call('ZADD', KEYS[3], 'NX', tonumber(ARGV[2]), ARGV[1])
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(tonumber(ARGV[3]) + 1))
end
if ARGV[6] ~= '1' then
  index()
  return 1
end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[5] .. ' ' .. ARGV[4]) == 0 then return 0 end
index()
redis.call('RPUSH', KEYS[4], ARGV[1])
if not redis.call('LPOS', KEYS[5], ARGV[4]) then redis.call('RPUSH', KEYS[5], ARGV[4]) end
return 1
