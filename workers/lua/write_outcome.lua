-- First writer wins: the one outcome of a call (docs/design/tool-calls.md, "One answer per call").
-- Returns workers.scripts.WriteResult: 1 WON, 0 LOST,
-- 2 FENCED (a later execution of the call has started: this one was superseded and writes nothing).
-- KEYS: outcome, late list, turn lease ('' when no turn), reply list ('' when none), fence ('' or absent: the
--       writer is not an execution, e.g. the orchestrator's synthetic outcomes).
-- ARGV: outcome JSON, TTL s, inbox prefix, call id, turn id, inbox maxlen, largest outcome carried inline (bytes),
--       the writer's dispatch attempt, the writer's token or a prefix of it ('': any execution of that attempt),
--       the late list's TTL s (the audit TTL).
-- A losing write is kept in the late list for audit. The owner is looked up here so the notification always
-- goes to the turn's current owner; it carries the outcome itself when small, sparing the owner a read of it
-- ('' otherwise). A missing fence (no execution started, or it expired) lets the write through.
if KEYS[5] and KEYS[5] ~= '' then
  local current = redis.call('GET', KEYS[5])
  if current then
    local current_attempt = tonumber(string.match(current, '^(%d+)|')) or 0
    if current_attempt > tonumber(ARGV[8]) or string.sub(current, 1, #ARGV[9]) ~= ARGV[9] then return 2 end
  end
end
local ttl = tonumber(ARGV[2])
local won = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ttl)
if not won then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[10]) or ttl)
  return 0
end
if KEYS[3] ~= '' then
  local owner = redis.call('GET', KEYS[3])
  if owner then
    redis.call('XADD', ARGV[3] .. owner, 'MAXLEN', '~', ARGV[6], '*',
               'kind', 'outcome', 'turn', ARGV[5], 'call', ARGV[4],
               'outcome', #ARGV[1] <= tonumber(ARGV[7]) and ARGV[1] or '')
  end
end
if KEYS[4] ~= '' then
  redis.call('RPUSH', KEYS[4], ARGV[4])
  redis.call('EXPIRE', KEYS[4], ttl)
end
return 1
