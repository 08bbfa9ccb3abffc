-- Store a turn and queue it, or park it behind its conversation's queued-or-running turn.
-- Returns orchestrator.store.scripts.SubmitResult: 0 EXISTS (a retried submit), 1 QUEUED, 2 WAITING.
-- KEYS: request, status, active, events, queue, conversation lock ('' if none), conversation waiting (''),
--       recent turns.
-- ARGV: turn id, request JSON, now, event data JSON, events maxlen, queued status, queued event name, how many
--       recent turns are kept.
-- The recent turns (a zset by submit time, trimmed to the newest ARGV[8]) are what `GET /v1/turns` lists.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[6])
redis.call('ZADD', KEYS[3], tonumber(ARGV[3]), ARGV[1])
redis.call('ZADD', KEYS[8], tonumber(ARGV[3]), ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[8], 0, -(tonumber(ARGV[8]) + 1))
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'name', ARGV[7], 'at', ARGV[3], 'data', ARGV[4])
if KEYS[6] ~= '' then
  if redis.call('SET', KEYS[6], ARGV[1], 'NX') then
    redis.call('RPUSH', KEYS[5], ARGV[1])
    return 1
  end
  redis.call('RPUSH', KEYS[7], ARGV[1])
  return 2
end
redis.call('RPUSH', KEYS[5], ARGV[1])
return 1
