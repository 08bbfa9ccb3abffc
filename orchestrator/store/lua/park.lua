-- Park a turn that does nothing but wait for people: its state is saved already; its owner gives up its lease
-- and forgets it, and the turn waits in the parked set, scored by when it must be looked at (its earliest wait's
-- deadline), until an answer (control.lua) or that time (wake.lua) queues it for any orchestrator.
-- Returns orchestrator.store.scripts.ParkResult: 1 PARKED; 0 UNREAD (its control stream holds a request newer
-- than the last its owner read: not parked, the owner reads it first); -1 LEASE_LOST.
-- KEYS: lease, parked zset ('' on a Redis Cluster: the caller added the turn to it first, and takes it out
--       again unless this returns PARKED), control stream.
-- ARGV: orchestrator id, turn id, look at (epoch s), id of the last control entry the owner read ('0': none).
-- A request recorded before this script ran is seen here; one recorded after finds no owner and the turn in the
-- parked set, and queues it: no answer is left unread.
-- An absent key is '' (or, on a Redis Cluster, the first key again: every key a script is given must be in its
-- slot).
local function given(key) return key ~= nil and key ~= '' and key ~= KEYS[1] end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if #redis.call('XRANGE', KEYS[3], '(' .. ARGV[4], '+', 'COUNT', 1) > 0 then return 0 end
if given(KEYS[2]) then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2]) end
redis.call('DEL', KEYS[1])
return 1
