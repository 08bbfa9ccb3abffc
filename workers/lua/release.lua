-- Delete a key only while it holds our token: a call's running guard or idempotency lock, a turn's lease.
-- Returns workers.scripts.ReleaseResult: 1 RELEASED, 0 NOT_HELD.
-- KEYS: the key. ARGV: token ('' deletes it whoever holds it); optional '1' when the token is a prefix (the
-- worker's parent releasing for the execution its dead pool process ran: `<attempt>|<worker>:<pid>:`).
local held = redis.call('GET', KEYS[1])
if not held then return 0 end
if ARGV[1] == '' or held == ARGV[1] or (ARGV[2] == '1' and string.sub(held, 1, #ARGV[1]) == ARGV[1]) then
  return redis.call('DEL', KEYS[1])
end
return 0
