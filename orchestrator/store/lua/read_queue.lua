-- Read one shard of the turn queue on a Redis Cluster, at one moment: the claiming list, the active index and
-- the parked set (what find_orphans.lua reads on one Redis). KEYS: claiming list, active zset, parked zset.
return {redis.call('LRANGE', KEYS[1], 0, -1), redis.call('ZRANGE', KEYS[2], 0, -1), redis.call('ZRANGE', KEYS[3], 0, -1)}
