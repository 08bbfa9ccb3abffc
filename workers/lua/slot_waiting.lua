-- A `tool_waiting_for_slot` event of a call that found its tool's slots taken (`workers.concurrency`), added
-- to its turn's event stream once per dispatch attempt, and only while someone can still show it (as
-- progress.lua: never a stream for a turn that is gone, nothing after its outcome or the call's).
-- Returns workers.scripts.SlotWaitingResult: 1 ADDED; 0 ENDED when the turn's stream is gone or the turn has
-- its outcome; 2 CALL_DONE when the call has its outcome; 3 TOLD when this dispatch attempt was told already.
-- KEYS: turn events, turn outcome, call outcome, the call's told marker.
-- ARGV: dispatch attempt, marker TTL s, events maxlen, then the entry's fields: name, at, data.
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[3]) == 1 then return 2 end
if redis.call('GET', KEYS[4]) == ARGV[1] then return 3 end
redis.call('SET', KEYS[4], ARGV[1], 'EX', tonumber(ARGV[2]))
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], '*', 'name', ARGV[4], 'at', ARGV[5], 'data', ARGV[6])
return 1
