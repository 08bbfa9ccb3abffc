-- Keep a live orchestrator's inbox, and forget orchestrators that stopped beating: a dead one's keys vanish.
-- The inbox's expiry is pushed back (PEXPIRE needs no memory: a Redis out of memory still takes it); a
-- missing inbox is first created empty, so that a worker's notification never creates one without expiry.
-- Members of the orchestrators' set last seen before the inbox TTL are removed.
-- KEYS: the inbox, the orchestrators' set. ARGV: TTL ms, now (epoch s). Returns 1 when the inbox was created.
local created = 0
if redis.call('PEXPIRE', KEYS[1], ARGV[1]) == 0 then
  redis.call('XADD', KEYS[1], 'MAXLEN', '0', '*', 'kind', 'open')
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  created = 1
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (tonumber(ARGV[2]) - tonumber(ARGV[1]) / 1000))
return created
