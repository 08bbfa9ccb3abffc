-- The start of one execution of a call: redelivery dedupe, running guard, attempt count and the "started"
-- notification in one round trip. Returns {workers.scripts.StartResult, value}: {0 STARTED, attempt},
-- {-1 FINISHED, 0} when the call already has an outcome, {-2 HELD, pttl ms} when another execution holds it.
-- KEYS: outcome, running, attempts, turn lease ('' when none).
-- ARGV: running token, running TTL ms, attempts TTL s, inbox prefix, call id, turn id, worker, started at,
--       inbox maxlen.
-- The token is unique per execution: finding it already set means this execution's first try ran and only
-- its reply was lost, so the attempt it counted is returned again.
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 0} end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return {0, tonumber(redis.call('GET', KEYS[3]) or '1')}
end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then
  return {-2, redis.call('PTTL', KEYS[2])}
end
local n = redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], tonumber(ARGV[3]))
if KEYS[4] ~= '' then
  local owner = redis.call('GET', KEYS[4])
  if owner then
    redis.call('XADD', ARGV[4] .. owner, 'MAXLEN', '~', ARGV[9], '*', 'kind', 'started',
               'turn', ARGV[6], 'call', ARGV[5], 'attempt', tostring(n), 'worker', ARGV[7], 'at', ARGV[8])
  end
end
return {0, n}
