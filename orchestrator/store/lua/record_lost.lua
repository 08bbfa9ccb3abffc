-- Record a turn whose keys Redis lost (it came back without its data): a terminal `failed` record, so that
-- readers, waiting clients and late writers all meet an ended turn instead of an unknown one.
-- Returns orchestrator.store.losses.LostResult: 1 RECORDED, 0 PRESENT (the turn still has its keys: it was not
-- lost, or its loss is recorded already — nothing is overwritten).
-- KEYS: request, status, outcome, events, active ('' on a Redis Cluster: the caller then runs leave.lua).
-- ARGV: turn id, request JSON, status (failed), outcome JSON, TTL s, event data JSON, events maxlen, now,
--       finished event name.
-- The status is written with the outcome and `turn_finished`, as by save_outcome.lua: whoever sees the event
-- can read the outcome, and save_step.lua and save_outcome.lua refuse to write over a terminal status.
-- An absent key is '' (or, on a Redis Cluster, the first key again: every key a script is given must be in its
-- slot).
local function given(key) return key ~= nil and key ~= '' and key ~= KEYS[1] end
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local ttl = tonumber(ARGV[5])
redis.call('SET', KEYS[1], ARGV[2], 'EX', ttl)
redis.call('SET', KEYS[3], ARGV[4], 'EX', ttl)
redis.call('SET', KEYS[2], ARGV[3], 'EX', ttl)
if given(KEYS[5]) then redis.call('ZREM', KEYS[5], ARGV[1]) end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'name', ARGV[9], 'at', ARGV[8], 'data', ARGV[6])
redis.call('EXPIRE', KEYS[4], ttl)
return 1
