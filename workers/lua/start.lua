-- The start of one execution of a call: redelivery dedupe, the fence, running guard, attempt count and the
-- "started" notification in one round trip. Returns {workers.scripts.StartResult, value}: {0 STARTED, attempt},
-- {-1 FINISHED, 0} when the call already has an outcome, {-2 HELD, pttl ms} when another execution holds it,
-- {-3 SUPERSEDED, current attempt} when a later dispatch of the call has started, {-4 TURN_GONE, 0} when the
-- call's turn no longer exists (Redis lost it, or it expired).
-- KEYS: outcome, running, attempts, turn lease ('' when none), fence, turn request ('' when no turn).
-- ARGV: running token, running TTL ms, attempts TTL s, inbox prefix, call id, turn id, worker, started at,
--       inbox maxlen, dispatch attempt.
-- The token is unique per execution: finding it already set means this execution's first try ran and only
-- its reply was lost, so the attempt it counted is returned again. The fence holds the token of the latest
-- execution to start, `<dispatch attempt>|…`; it lives as long as the attempt count.
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 0} end
if KEYS[6] ~= '' and redis.call('EXISTS', KEYS[6]) == 0 then return {-4, 0} end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return {0, tonumber(redis.call('GET', KEYS[3]) or '1')}
end
local current = redis.call('GET', KEYS[5])
if current then
  local current_attempt = tonumber(string.match(current, '^(%d+)|')) or 0
  if current_attempt > tonumber(ARGV[10]) then return {-3, current_attempt} end
end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then
  return {-2, redis.call('PTTL', KEYS[2])}
end
redis.call('SET', KEYS[5], ARGV[1], 'EX', tonumber(ARGV[3]))
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
