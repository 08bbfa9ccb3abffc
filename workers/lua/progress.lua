-- One `tool_progress` event of a running call, added to its turn's event stream only while someone can still
-- show it. Returns workers.scripts.ProgressResult: 1 ADDED; 0 ENDED when the turn's stream is gone (expired,
-- or Redis lost it: XADD would create a stream no TTL ever removes) or the turn has its outcome
-- (`turn_finished` stays the last event); 2 CALL_DONE when the call has its outcome (`tool_finished` may be
-- out) or a later execution superseded this one (the fence; no fence at all, Redis lost it, counts as ours,
-- as in write_outcome.lua).
-- KEYS: turn events, turn outcome, call outcome, call fence.
-- ARGV: execution token, events maxlen, then the entry's fields: name, at, data.
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[3]) == 1 then return 2 end
local fence = redis.call('GET', KEYS[4])
-- The fence's token, less the count of executions after it (start.lua: `<token>#<count>`).
if fence and (string.match(fence, '^(.*)#%d+$') or fence) ~= ARGV[1] then return 2 end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'name', ARGV[3], 'at', ARGV[4], 'data', ARGV[5])
return 1
