-- The terminal write of a turn: outcome, status, its finished event, TTLs, then the conversation's next turn.
-- Returns orchestrator.store.scripts.FinishResult: 1 FINISHED, 0 ALREADY_TERMINAL (the first write won).
-- KEYS: outcome, status, active, events, request, state, control, queue, conversation head, lock, waiting
--       ('' for the three conversation keys when the turn has none).
-- ARGV: turn id, outcome JSON, status, TTL s, event data JSON, events maxlen, now, terminal statuses (spaced),
--       finished event name.
-- The finished event is added here, atomically with the outcome, so a reader that sees it can always read the
-- outcome.
local terminal = {}
for status in string.gmatch(ARGV[8], '%S+') do terminal[status] = true end
local st = redis.call('GET', KEYS[2])
if st and terminal[st] then return 0 end
local ttl = tonumber(ARGV[4])
redis.call('SET', KEYS[1], ARGV[2], 'EX', ttl)
redis.call('SET', KEYS[2], ARGV[3], 'EX', ttl)
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'name', ARGV[9], 'at', ARGV[7], 'data', ARGV[5])
for i = 4, 7 do redis.call('EXPIRE', KEYS[i], ttl) end
if KEYS[9] ~= '' then
  redis.call('SET', KEYS[9], ARGV[1], 'EX', ttl)
  if redis.call('GET', KEYS[10]) == ARGV[1] then
    local nxt = redis.call('LPOP', KEYS[11])
    if nxt then
      redis.call('SET', KEYS[10], nxt)
      redis.call('RPUSH', KEYS[8], nxt)
    else
      redis.call('DEL', KEYS[10])
    end
  end
end
return 1
