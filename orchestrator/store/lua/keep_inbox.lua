-- Keep a live orchestrator's inbox, and forget orchestrators that stopped beating: a dead one's keys vanish.
-- The inbox's expiry is pushed back (PEXPIRE needs no memory: a Redis out of memory still takes it); a
-- missing inbox is first created empty, so that a worker's notification never creates one without expiry.
-- Members of the orchestrators' set last seen before the inbox TTL are removed.
-- KEYS: the inbox, the orchestrators' set ('' on a Redis Cluster: another slot, trimmed by its own command).
-- ARGV: TTL ms, now (epoch s). Returns 1 when the inbox was created.
-- An absent key is '' (or, on a Redis Cluster, the first key again: every key a script is given must be in its
-- slot).
local function given(key) return key ~= nil and key ~= '' and key ~= KEYS[1] end
local created = 0
if redis.call('PEXPIRE', KEYS[1], ARGV[1]) == 0 then
  redis.call('XADD', KEYS[1], 'MAXLEN', '0', '*', 'kind', 'open')
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  created = 1
end
if not given(KEYS[2]) then return created end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (tonumber(ARGV[2]) - tonumber(ARGV[1]) / 1000))
return created
