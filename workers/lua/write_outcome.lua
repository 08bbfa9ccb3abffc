-- First writer wins: the one outcome of a call (docs/design/tool-calls.md, "One answer per call").
-- Returns workers.scripts.WriteResult: 1 WON, 0 LOST,
-- 2 FENCED (a later execution of the call has started: this one was superseded and writes nothing).
-- KEYS: outcome, late list, turn lease (none without a turn), reply list (none when no one blocks on it), fence
--       (none, or absent: the writer is not an execution, e.g. the orchestrator's synthetic outcomes), running
--       guard (absent: the writer releases none). A key that is none is '' or, on a Redis Cluster (every key of
--       a script in one slot; '' is in slot 0), the outcome key again (`workers.scripts.build_absent_key`).
-- ARGV: outcome JSON, TTL s, inbox prefix, call id, turn id, inbox maxlen, largest outcome carried inline (bytes),
--       the writer's dispatch attempt, the writer's token or a prefix of it ('': any execution of that attempt),
--       the late list's TTL s (the audit TTL); with a running guard, its holder's token ('': whoever holds it)
--       and '1' when that is a prefix (the worker's parent writing for the execution its dead pool process ran).
-- A losing write is kept in the late list for audit. The owner is looked up here so the notification always
-- goes to the turn's current owner; it carries the outcome itself when small, sparing the owner a read of it
-- ('' otherwise): the fields of `workers.scripts.build_outcome_notification`. A missing fence (no execution
-- started, or it expired) lets the write through.
-- The running guard goes with the write, whatever its result, while its holder holds it (release.lua's rule).
-- With an empty inbox prefix (a Redis Cluster: the inbox is in another slot) nothing is added to an inbox and
-- the reply is {result, owner}: the owner a winning write must notify (false when none, and for LOST/FENCED).
local function given(i) return KEYS[i] ~= nil and KEYS[i] ~= '' and KEYS[i] ~= KEYS[1] end
local function held_by_holder(held)
  if ARGV[11] == '' or held == ARGV[11] then return true end
  return ARGV[12] == '1' and string.sub(held, 1, #ARGV[11]) == ARGV[11]
end
-- The fence's token: its value less the count of executions start.lua keeps after it (`<token>#<count>`).
local current = false
if given(5) then
  current = redis.call('GET', KEYS[5])
  if current then current = string.match(current, '^(.*)#%d+$') or current end
end
local function release()
  if not given(6) then return end
  -- start.lua takes the guard and sets the fence to the same token together, and a later start takes the
  -- fence only with the guard: a fence the holder holds leaves the guard the holder's or gone, not read.
  if current and held_by_holder(current) then
    redis.call('DEL', KEYS[6])
    return
  end
  local held = redis.call('GET', KEYS[6])
  if held and held_by_holder(held) then redis.call('DEL', KEYS[6]) end
end
local function reply(result, owner)
  release()
  if ARGV[3] == '' then return {result, owner or false} end
  return result
end
if current then
  local current_attempt = tonumber(string.match(current, '^(%d+)|')) or 0
  if current_attempt > tonumber(ARGV[8]) or string.sub(current, 1, #ARGV[9]) ~= ARGV[9] then
    return reply(2, false)
  end
end
local ttl = tonumber(ARGV[2])
local won = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ttl)
if not won then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[10]) or ttl)
  return reply(0, false)
end
local owner = false
if given(3) then owner = redis.call('GET', KEYS[3]) end
if owner and ARGV[3] ~= '' then
  redis.call('XADD', ARGV[3] .. owner, 'MAXLEN', '~', ARGV[6], '*',
             'kind', 'outcome', 'turn', ARGV[5], 'call', ARGV[4],
             'outcome', #ARGV[1] <= tonumber(ARGV[7]) and ARGV[1] or '')
end
if given(4) then
  redis.call('RPUSH', KEYS[4], ARGV[4])
  redis.call('EXPIRE', KEYS[4], ttl)
end
return reply(1, owner)
