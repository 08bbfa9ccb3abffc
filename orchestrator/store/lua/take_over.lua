-- Lease an orphaned turn. Returns orchestrator.store.scripts.TakeOverResult: 1 TAKEN, 0 REFUSED.
-- KEYS: lease, status, claiming list.
-- ARGV: turn id, orchestrator id, lease TTL ms, queued status, running status, terminal statuses (spaced).
-- A queued turn is taken over only from the claiming list (its claimer died before leasing it); one still in
-- the queue belongs to whoever pops it.
local terminal = {}
for status in string.gmatch(ARGV[6], '%S+') do terminal[status] = true end
local st = redis.call('GET', KEYS[2])
if not st or terminal[st] then return 0 end
if st == ARGV[4] and not redis.call('LPOS', KEYS[3], ARGV[1]) then return 0 end
if not redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', tonumber(ARGV[3])) then return 0 end
redis.call('LREM', KEYS[3], 0, ARGV[1])
if st == ARGV[4] then redis.call('SET', KEYS[2], ARGV[5]) end
return 1
