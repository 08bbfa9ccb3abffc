-- Settle a pick (pick.lua) once lease.lua answered, on a Redis Cluster, in the queue's slot: the id leaves the
-- claiming list, and its tenant's running set too when the turn turned out to have ended.
-- KEYS: claiming list, the tenant's running set. ARGV: turn id, '1' when the turn has ended.
redis.call('LREM', KEYS[1], 0, ARGV[1])
if ARGV[2] == '1' then redis.call('SREM', KEYS[2], ARGV[1]) end
return 1
