-- Store a turn and queue it, or park it behind its conversation's queued-or-running turn.
-- Returns orchestrator.store.scripts.SubmitResult: 0 EXISTS (a retried submit), 1 QUEUED, 2 WAITING.
-- KEYS: request, status, active, events, the queue of its lane and tenant, conversation lock ('' if none),
--       conversation waiting (''), recent turns, the lane's tenants, the ready tokens.
-- ARGV: turn id, request JSON, now, event data JSON, events maxlen, queued status, queued event name, how many
--       recent turns are kept, tenant, how many ready tokens are kept, and on a Redis Cluster how long the
--       turn's keys live unless a lease (lease.lua) or its wait behind its conversation's turn keeps them.
-- The recent turns (a zset by submit time, trimmed to the newest ARGV[8]) are what `GET /v1/turns` lists.
-- A queued turn puts its tenant in its lane's rotation (once) and a ready token for a blocked claimer.
-- On a Redis Cluster the active key is '': the turn's own keys (and its conversation's, in the same slot: a
-- conversation's turn ids are chosen so) are written here, and the queue's part is enqueue.lua's, in the
-- turn's queue shard (orchestrator.store.cluster).
-- An absent key is '' (or, on a Redis Cluster, the first key again: every key a script is given must be in its
-- slot).
local function given(key) return key ~= nil and key ~= '' and key ~= KEYS[1] end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[6])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'name', ARGV[7], 'at', ARGV[3], 'data', ARGV[4])
-- On a cluster the queue's side is absent ('' active key): a turn that may run now is queued by the caller.
-- Until it is, its keys expire (ARGV[11]): a caller that died in between, and never got the id to submit it
-- again, leaves nothing for good.
local queue_side = given(KEYS[3])
if not queue_side and ARGV[11] then
  for _, key in ipairs({KEYS[1], KEYS[2], KEYS[4]}) do redis.call('EXPIRE', key, tonumber(ARGV[11])) end
end
if queue_side then
  redis.call('ZADD', KEYS[3], tonumber(ARGV[3]), ARGV[1])
  redis.call('ZADD', KEYS[8], tonumber(ARGV[3]), ARGV[1])
  redis.call('ZREMRANGEBYRANK', KEYS[8], 0, -(tonumber(ARGV[8]) + 1))
end
local function queue()
  if not queue_side then return end
  redis.call('RPUSH', KEYS[5], ARGV[1])
  if not redis.call('LPOS', KEYS[9], ARGV[9]) then redis.call('RPUSH', KEYS[9], ARGV[9]) end
  -- Trimmed only past its cap: RPUSH tells the length.
  if redis.call('RPUSH', KEYS[10], '1') > tonumber(ARGV[10]) then
    redis.call('LTRIM', KEYS[10], -tonumber(ARGV[10]), -1)
  end
end
if given(KEYS[6]) then
  if redis.call('SET', KEYS[6], ARGV[1], 'NX') then
    queue()
    return 1
  end
  redis.call('RPUSH', KEYS[7], ARGV[1])
  return 2
end
queue()
return 1
