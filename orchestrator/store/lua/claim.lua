-- Lease a turn just moved to the claiming list, and read the request adopting it starts from. Returns 0 when
-- SKIPPED (terminal, unknown, or leased by someone else); when CLAIMED, {1, request or false, 1 when the turn
-- has a saved state (else 0)}. (Its control requests are read once the orchestrator has registered the turn:
-- one sent before that is in the stream then, one sent after is notified to it.)
-- KEYS: claiming list, lease, status, request, state.
-- ARGV: turn id, orchestrator id, lease TTL ms, queued status, running status, terminal statuses (spaced).
-- The lease is always taken with SET NX: whoever sets it owns the turn, so a claim racing a take-over is safe.
local terminal = {}
for status in string.gmatch(ARGV[6], '%S+') do terminal[status] = true end
redis.call('LREM', KEYS[1], 0, ARGV[1])
local st = redis.call('GET', KEYS[3])
if not st or terminal[st] then return 0 end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', tonumber(ARGV[3])) then return 0 end
if st == ARGV[4] then redis.call('SET', KEYS[3], ARGV[5]) end
return {1, redis.call('GET', KEYS[4]), redis.call('EXISTS', KEYS[5])}
