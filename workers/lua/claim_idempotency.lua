-- Claim an idempotency key for one call. Returns {workers.scripts.IdempotencyClaim, value}: {1 STORED, record}
-- for a stored success, {0 CLAIMED, ''} when this call holds the lock (now, or already: a redelivery of the
-- same call), {2 BUSY, pttl ms} when another call holds it.
-- KEYS: idempotency record, its lock. ARGV: call id (the lock's holder), lock TTL ms.
local record = redis.call('GET', KEYS[1])
if record then return {1, record} end
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then return {2, tostring(redis.call('PTTL', KEYS[2]))} end
redis.call('SET', KEYS[2], ARGV[1], 'PX', tonumber(ARGV[2]))
return {0, ''}
