-- Park a turn that does nothing but wait for people: its state is saved already; its owner gives up its lease
-- and forgets it, and the turn waits in the parked set, scored by when it must be looked at (its earliest wait's
-- deadline), until an answer (control.lua) or that time (wake.lua) queues it for any orchestrator.
-- Returns orchestrator.store.scripts.ParkResult: 1 PARKED; 0 UNREAD (its control stream holds a request newer
-- than the last its owner read: not parked, the owner reads it first); -1 LEASE_LOST.
-- KEYS: lease, parked zset, control stream.
-- ARGV: orchestrator id, turn id, look at (epoch s), id of the last control entry the owner read ('0': none).
-- A request recorded before this script ran is seen here; one recorded after finds no owner and the turn in the
-- parked set, and queues it: no answer is left unread.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if #redis.call('XRANGE', KEYS[3], '(' .. ARGV[4], '+', 'COUNT', 1) > 0 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
redis.call('DEL', KEYS[1])
return 1
