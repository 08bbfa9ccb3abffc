-- Lease an orphaned turn. Returns orchestrator.store.scripts.TakeOverResult: 1 TAKEN, 0 REFUSED.
-- KEYS: lease, status, claiming list ('' on a Redis Cluster, where it is in another slot).
-- ARGV: turn id, orchestrator id, lease TTL ms, queued status, running status, terminal statuses (spaced),
--       '1' when the caller saw the id in the claiming list (read there when the list is '').
-- A queued turn is taken over only from the claiming list (its claimer died before leasing it); one still in
-- the queue belongs to whoever pops it. On a cluster the caller takes the id out of the claiming list after.
-- An absent key is '' (or, on a Redis Cluster, the first key again: every key a script is given must be in its
-- slot).
local function given(key) return key ~= nil and key ~= '' and key ~= KEYS[1] end
local terminal = {}
for status in string.gmatch(ARGV[6], '%S+') do terminal[status] = true end
local st = redis.call('GET', KEYS[2])
if not st or terminal[st] then return 0 end
local claiming
if not given(KEYS[3]) then claiming = ARGV[7] == '1' else claiming = redis.call('LPOS', KEYS[3], ARGV[1]) end
if st == ARGV[4] and not claiming then return 0 end
if not redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', tonumber(ARGV[3])) then return 0 end
if given(KEYS[3]) then redis.call('LREM', KEYS[3], 0, ARGV[1]) end
if st == ARGV[4] then redis.call('SET', KEYS[2], ARGV[5]) end
return 1
