-- The terminal write of a turn: outcome, status, its finished event, TTLs, then the conversation's next turn.
-- Returns orchestrator.store.scripts.FinishResult: 1 FINISHED, 0 ALREADY_TERMINAL (the first write won).
-- KEYS: outcome, status, active, events, request, state, control, queue, conversation head, lock, waiting
--       ('' for the three conversation keys when the turn has none), history list, log list, lease ('' to keep
--       it), ready tokens.
-- ARGV: turn id, outcome JSON (its messages referenced: history key and length), status, turn TTL s, event
--       data JSON, events maxlen, now, terminal statuses (spaced), finished event name, conversation TTL s,
--       head JSON (the same reference, for the conversation's next turn), the finishing orchestrator's id,
--       running prefix, running suffix, lane queue prefix, lane tenants prefix, how many ready tokens are kept,
--       request prefix, request suffix, the turn's tenant ('' when the caller does not know it: read from the
--       request, which costs decoding it whole).
-- The turn leaves its tenant's running set (claim.lua), and a ready token wakes a claimer for the place it
-- freed when its tenant has turns queued; the conversation's next turn goes to the queue of its own lane and tenant (as submit.lua's).
-- The lease is released here when that orchestrator holds it, whichever terminal write won: the turn is over
-- for its owner either way, and a separate release would cost it one more round trip per turn.
-- The finished event is added here, atomically with the outcome, so a reader that sees it can always read the
-- outcome. A conversation's history list and head live CONVERSATION_TTL_S from its last turn's end; a turn's
-- own history list lives as long as the turn's other keys.
-- On a Redis Cluster the active key and the queue are '': the turn's own keys and its conversation's (one slot:
-- a conversation's turn ids are chosen so) are written here; the queue's part is leave.lua's, in the turn's
-- queue shard, and the conversation's next turn, which holds the lock from here, is queued by the caller
-- (orchestrator.store.cluster).
-- An absent key is '' (or, on a Redis Cluster, the first key again: every key a script is given must be in its
-- slot).
local function given(key) return key ~= nil and key ~= '' and key ~= KEYS[1] end
if given(KEYS[14]) and redis.call('GET', KEYS[14]) == ARGV[12] then redis.call('DEL', KEYS[14]) end
local terminal = {}
for status in string.gmatch(ARGV[8], '%S+') do terminal[status] = true end
local st = redis.call('GET', KEYS[2])
if st and terminal[st] then return 0 end
local ttl = tonumber(ARGV[4])
redis.call('SET', KEYS[1], ARGV[2], 'EX', ttl)
redis.call('SET', KEYS[2], ARGV[3], 'EX', ttl)
if given(KEYS[3]) then redis.call('ZREM', KEYS[3], ARGV[1]) end
local function tenant_and_lane(raw)
  local ok, request = pcall(cjson.decode, raw or '')
  if not ok or type(request) ~= 'table' then return 'default', 'normal' end
  local tenant, lane = request['tenant'], request['priority']
  if type(tenant) ~= 'string' then tenant = 'default' end
  if lane ~= 'interactive' and lane ~= 'batch' then lane = 'normal' end
  return tenant, lane
end
local function ring()
  if redis.call('RPUSH', KEYS[15], '1') > tonumber(ARGV[17]) then
    redis.call('LTRIM', KEYS[15], -tonumber(ARGV[17]), -1)
  end
end
-- The place freed matters only to turns queued behind a cap: a tenant with none queued wakes nobody (an
-- orchestrator woken for nothing runs a claim that finds nothing).
local function waiting(tenant)
  local queues = {KEYS[8], ARGV[15] .. 'interactive:' .. tenant, ARGV[15] .. 'batch:' .. tenant}
  if tenant ~= 'default' then queues[#queues + 1] = ARGV[15] .. 'normal:' .. tenant end
  return redis.call('EXISTS', unpack(queues)) > 0
end
if given(KEYS[3]) then
  local tenant = ARGV[20]
  if not tenant or tenant == '' then tenant = tenant_and_lane(redis.call('GET', KEYS[5])) end
  if redis.call('SREM', ARGV[13] .. tenant .. ARGV[14], ARGV[1]) == 1 and waiting(tenant) then ring() end
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'name', ARGV[9], 'at', ARGV[7], 'data', ARGV[5])
for i = 4, 7 do redis.call('EXPIRE', KEYS[i], ttl) end
redis.call('EXPIRE', KEYS[13], ttl)
if given(KEYS[9]) then
  local conversation_ttl = tonumber(ARGV[10])
  redis.call('SET', KEYS[9], ARGV[11], 'EX', conversation_ttl)
  redis.call('EXPIRE', KEYS[12], conversation_ttl)
  if redis.call('GET', KEYS[10]) == ARGV[1] then
    local nxt = redis.call('LPOP', KEYS[11])
    if nxt then
      redis.call('SET', KEYS[10], nxt)
      -- On a cluster the next turn is queued by the caller, in its shard (it holds the lock from here).
      if given(KEYS[8]) then
        local next_tenant, lane = tenant_and_lane(redis.call('GET', ARGV[18] .. nxt .. ARGV[19]))
        local queue, lane_key = KEYS[8], ARGV[16] .. lane
        if next_tenant ~= 'default' or lane ~= 'normal' then queue = ARGV[15] .. lane .. ':' .. next_tenant end
        redis.call('RPUSH', queue, nxt)
        if not redis.call('LPOS', lane_key, next_tenant) then redis.call('RPUSH', lane_key, next_tenant) end
        ring()
      end
    else
      redis.call('DEL', KEYS[10])
    end
  end
else
  redis.call('EXPIRE', KEYS[12], ttl)
end
return 1
