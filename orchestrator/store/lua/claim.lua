-- Lease a turn just moved to the claiming list. Returns orchestrator.store.scripts.ClaimResult: 1 CLAIMED,
-- 0 SKIPPED (terminal, unknown, or leased by someone else).
-- KEYS: claiming list, lease, status.
-- ARGV: turn id, orchestrator id, lease TTL ms, queued status, running status, terminal statuses (spaced).
-- The lease is always taken with SET NX: whoever sets it owns the turn, so a claim racing a take-over is safe.
local terminal = {}
for status in string.gmatch(ARGV[6], '%S+') do terminal[status] = true end
redis.call('LREM', KEYS[1], 0, ARGV[1])
local st = redis.call('GET', KEYS[3])
if not st or terminal[st] then return 0 end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', tonumber(ARGV[3])) then return 0 end
if st == ARGV[4] then redis.call('SET', KEYS[3], ARGV[5]) end
return 1
