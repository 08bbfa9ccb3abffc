-- Delete a key only while it holds our token: a call's running guard or idempotency lock, a turn's lease.
-- Returns workers.scripts.ReleaseResult: 1 RELEASED, 0 NOT_HELD.
-- KEYS: the key. ARGV: token ('' deletes it whoever holds it).
if ARGV[1] == '' or redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
