-- Wake one parked turn on a Redis Cluster, in the queue's slot: control.lua's wake-up of a turn with no owner.
-- KEYS: parked zset, the default queue. ARGV: turn id. Returns 1 when it was parked (now queued at the front).
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('LPUSH', KEYS[2], ARGV[1])
return 1
