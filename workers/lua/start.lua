-- The start of one execution of a call: redelivery dedupe, the fence, running guard, attempt count and the
-- "started" notification in one round trip. Returns {workers.scripts.StartResult, value}:
-- {0 STARTED, attempt}; {-1 FINISHED, 0} when the call already has an outcome; {-2 HELD, pttl ms} when
-- another execution holds it; {-3 SUPERSEDED, current attempt} when a later dispatch of the call has started;
-- {-4 TURN_GONE, 0} when the call's turn no longer exists (Redis lost it, or it expired).
-- KEYS: outcome, running, attempts (read only: see below), turn lease, fence, turn request. A call without
--       a turn has no lease and no request: each is '' or, on a Redis Cluster (every key of a script in one
--       slot; '' is in slot 0), the outcome key again; either stands for none
--       (`workers.scripts.build_absent_key`).
-- ARGV: running token, running TTL ms, fence TTL s (the count's too), inbox prefix, call id, turn id, worker,
--       started at, inbox maxlen, dispatch attempt.
-- The token is unique per execution: finding it already holding the running guard means this execution's
-- first try ran and only its reply was lost, so the attempt it counted is returned again. The fence holds the
-- token of the latest execution to start and the call's count of executions, `<dispatch attempt>|…#<count>`
-- (`workers.fence`): one key and one write per start for both. A fence written by an older worker holds the
-- token alone, and that worker kept the count in the attempts key: read then, so that an upgrade mid-call
-- still counts on.
-- A turn with a lease exists (its owner holds it): its request is looked for only when the lease is gone.
-- The notification goes to the owner's inbox, `<inbox prefix><owner>`, with the fields of
-- `workers.scripts.build_started_notification`. With an empty inbox prefix (a Redis Cluster: the inbox is in
-- another slot) nothing is added here and a started execution's reply names the owner for the caller to
-- notify, {0 STARTED, attempt, owner or false}, a repeat's too (its first try's caller may not have).
local function given(key) return key ~= '' and key ~= KEYS[1] end
if redis.call('EXISTS', KEYS[1]) == 1 then return {-1, 0} end
local owner = false
if given(KEYS[4]) then owner = redis.call('GET', KEYS[4]) end
if not owner and given(KEYS[6]) and redis.call('EXISTS', KEYS[6]) == 0 then return {-4, 0} end
local current = redis.call('GET', KEYS[5])
local count = 0
if current then
  local current_attempt = tonumber(string.match(current, '^(%d+)|')) or 0
  if current_attempt > tonumber(ARGV[10]) then return {-3, current_attempt} end
  count = tonumber(string.match(current, '#(%d+)$') or redis.call('GET', KEYS[3]) or '0')
end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then
  -- Held by another execution, or by this one: a repeat, whose fence is still its own (the guard and the
  -- fence are taken together, and a later start takes the fence only with the guard).
  if redis.call('GET', KEYS[2]) == ARGV[1] then
    local attempt = math.max(count, 1)
    if ARGV[4] == '' then return {0, attempt, owner} end
    return {0, attempt}
  end
  return {-2, redis.call('PTTL', KEYS[2])}
end
local n = count + 1
redis.call('SET', KEYS[5], ARGV[1] .. '#' .. n, 'EX', tonumber(ARGV[3]))
if ARGV[4] == '' then return {0, n, owner} end
if owner then
  redis.call('XADD', ARGV[4] .. owner, 'MAXLEN', '~', ARGV[9], '*', 'kind', 'started',
             'turn', ARGV[6], 'call', ARGV[5], 'attempt', tostring(n), 'worker', ARGV[7], 'at', ARGV[8])
end
return {0, n}
