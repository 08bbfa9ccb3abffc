-- Claim an idempotency key for one execution. Returns {workers.scripts.IdempotencyClaim, value}: {1 STORED,
-- record} for a stored success, {0 CLAIMED, ''} when this execution holds the lock (now, or already: a repeat
-- after a lost reply), {2 BUSY, pttl ms} when another holds it — an identical call, or another execution of the
-- same call (a redispatch while a frozen worker still holds it): either way it waits.
-- KEYS: idempotency record, its lock. ARGV: the execution's token (the lock's holder), lock TTL ms.
local record = redis.call('GET', KEYS[1])
if record then return {1, record} end
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then return {2, tostring(redis.call('PTTL', KEYS[2]))} end
redis.call('SET', KEYS[2], ARGV[1], 'PX', tonumber(ARGV[2]))
return {0, ''}
