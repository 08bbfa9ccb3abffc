-- Record a cancel, an approval, a client-side tool's result or a child turn's end for a turn and tell its owner, if it has one; a parked turn (no owner: it
-- only waits for people, park.lua) is woken instead: queued at the front, for any orchestrator to claim.
-- Returns orchestrator.store.scripts.ControlResult: -1 UNKNOWN (no such turn), 0 TERMINAL, 1 RECORDED,
-- 2 DECIDED (an answer of this kind about this call was recorded already: the first answer stands).
-- KEYS: control stream, lease, status, parked zset, turn queue, ready tokens ('' for the last three on a Redis
--       Cluster).
-- ARGV: inbox prefix ('' on a Redis Cluster: the owner's inbox is in another slot), turn id, kind, call id, approved ('1'/'0'/''), now, inbox maxlen, terminal statuses
--       (spaced), an approval's edited arguments (JSON, '' for none), a reason ('' for none), who decided
--       ('' for not said), a client-side tool's result (JSON, '' for none: an error is the reason), how many
--       ready tokens are kept.
-- A woken turn pushes a ready token, as a submit does: a blocked claimer takes it at once.
-- On a Redis Cluster (an empty inbox prefix) the owner is told, or the parked turn woken, by the caller: the
-- reply is then {result, owner or false, control entry id} (orchestrator.store.cluster).
-- Entries written before arguments, reasons, deciders and results existed lack those fields: readers take them
-- as none.
-- An absent key is '' (or, on a Redis Cluster, the first key again: every key a script is given must be in its
-- slot).
local function given(key) return key ~= nil and key ~= '' and key ~= KEYS[1] end
local terminal = {}
for status in string.gmatch(ARGV[8], '%S+') do terminal[status] = true end
local st = redis.call('GET', KEYS[3])
if not st then return -1 end
if terminal[st] then return 0 end
if ARGV[3] == 'approval' or ARGV[3] == 'client_result' or ARGV[3] == 'child_result' then
  -- A turn's control stream holds a handful of entries: its cancels and approvals.
  local entries = redis.call('XRANGE', KEYS[1], '-', '+')
  for _, entry in ipairs(entries) do
    local fields = entry[2]
    local kind, call
    for i = 1, #fields, 2 do
      if fields[i] == 'kind' then kind = fields[i + 1] elseif fields[i] == 'call' then call = fields[i + 1] end
    end
    if kind == ARGV[3] and call == ARGV[4] then return 2 end
  end
end
local id = redis.call('XADD', KEYS[1], '*',
                      'kind', ARGV[3], 'call', ARGV[4], 'approved', ARGV[5], 'at', ARGV[6],
                      'arguments', ARGV[9] or '', 'reason', ARGV[10] or '', 'by', ARGV[11] or '',
                      'result', ARGV[12] or '')
local owner = redis.call('GET', KEYS[2])
if ARGV[1] == '' then return {1, owner or false, id} end
if owner then
  redis.call('XADD', ARGV[1] .. owner, 'MAXLEN', '~', ARGV[7], '*', 'kind', 'control', 'turn', ARGV[2],
             'control', ARGV[3], 'call', ARGV[4], 'approved', ARGV[5], 'id', id)
elseif given(KEYS[4]) and redis.call('ZREM', KEYS[4], ARGV[2]) == 1 then
  redis.call('LPUSH', KEYS[5], ARGV[2])
  if given(KEYS[6]) and redis.call('RPUSH', KEYS[6], '1') > tonumber(ARGV[13]) then
    redis.call('LTRIM', KEYS[6], -tonumber(ARGV[13]), -1)
  end
end
return 1
