-- Persist a step: the machine's state, the status and the events the step emitted, all or nothing.
-- Returns orchestrator.store.scripts.SaveResult: 1 SAVED, 0 TERMINAL (the turn already ended), -1 LEASE_LOST
-- (another orchestrator holds the lease).
-- KEYS: state, status, lease, events.
-- ARGV: state JSON, status, orchestrator id ('' = no fencing), events maxlen, terminal statuses (spaced),
--       then (name, at, data JSON) per event.
local terminal = {}
for status in string.gmatch(ARGV[5], '%S+') do terminal[status] = true end
local st = redis.call('GET', KEYS[2])
if st and terminal[st] then return 0 end
if ARGV[3] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[3] then return -1 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
for i = 6, #ARGV, 3 do
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'name', ARGV[i], 'at', ARGV[i + 1],
             'data', ARGV[i + 2])
end
return 1
