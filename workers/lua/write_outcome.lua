-- First writer wins (SPEC §4.9): the one outcome of a call. Returns workers.scripts.WriteResult: 1 WON, 0 LOST.
-- KEYS: outcome, late list, turn lease ('' when no turn), reply list ('' when none).
-- ARGV: outcome JSON, TTL s, inbox prefix, call id, turn id, inbox maxlen, largest outcome carried inline (bytes).
-- A losing write is kept in the late list for audit. The owner is looked up here so the notification always
-- goes to the turn's current owner; it carries the outcome itself when small, sparing the owner a read of it
-- ('' otherwise).
local ttl = tonumber(ARGV[2])
local won = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ttl)
if not won then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  redis.call('EXPIRE', KEYS[2], ttl)
  return 0
end
if KEYS[3] ~= '' then
  local owner = redis.call('GET', KEYS[3])
  if owner then
    redis.call('XADD', ARGV[3] .. owner, 'MAXLEN', '~', ARGV[6], '*',
               'kind', 'outcome', 'turn', ARGV[5], 'call', ARGV[4],
               'outcome', #ARGV[1] <= tonumber(ARGV[7]) and ARGV[1] or '')
  end
end
if KEYS[4] ~= '' then
  redis.call('RPUSH', KEYS[4], ARGV[4])
  redis.call('EXPIRE', KEYS[4], ttl)
end
return 1
