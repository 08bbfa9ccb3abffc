-- Persist a step: the machine's state, the status, the messages the step added to the history and the entries it
-- added to the turn's log, the stubs of the outcomes those messages consumed, and the events the step emitted,
-- all or nothing.
-- Returns orchestrator.store.scripts.SaveResult: 1 SAVED, 0 TERMINAL (the turn already ended), -1 LEASE_LOST
-- (another orchestrator holds the lease), -2 HISTORY_GAP (a list holds fewer entries than the state before this
-- step had: nothing written; save again with the lists whole).
-- KEYS: state, status, lease, events, history list, log list ('' for a list the step adds nothing to), then the
--       outcome key of each call whose answer enters the history with this step.
-- ARGV: state JSON, status, orchestrator id ('' = no fencing), events maxlen, terminal statuses (spaced), audit
--       TTL s, history length before the messages, message count m, log length before its entries, entry count
--       n, '1' when a list that holds entries already may carry a TTL (the first save of a turn's owner: a
--       conversation's history outlives its last turn by a TTL), then the m messages (JSON each), the n log
--       entries, one stub JSON per outcome key, then the number of events e, then (when e > 0) the fields of
--       the one stream entry that holds them (orchestrator.store.codec.build_entry_fields).
-- The step's events are one entry. Its id is its last event's, and the e - 1 ids just below it are its other
-- events' (orchestrator.store.codec.parse_entry): it is chosen past the stream's last entry, so that those
-- are free and every event has an id of its own in the stream's order. A lone event takes the next id.
-- The lists are append-only: a step writes its new entries once. Entries past the expected length were left by
-- a try whose reply was lost, or by a turn of the conversation that was lost with Redis's data: the state is the
-- truth, so they are dropped before the append (a retried save never appends twice).
-- An absent key is '' (or, on a Redis Cluster, the first key again: every key a script is given must be in its
-- slot).
local function given(key) return key ~= nil and key ~= '' and key ~= KEYS[1] end
local terminal = {}
for status in string.gmatch(ARGV[5], '%S+') do terminal[status] = true end
local st = redis.call('GET', KEYS[2])
if st and terminal[st] then return 0 end
if ARGV[3] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[3] then return -1 end
local m, n = tonumber(ARGV[8]), tonumber(ARGV[10])
local lists = {{KEYS[5], tonumber(ARGV[7]), 12, m}, {KEYS[6], tonumber(ARGV[9]), 12 + m, n}}
for _, list in ipairs(lists) do
  if given(list[1]) then
    list[5] = redis.call('LLEN', list[1])
    if list[5] < list[2] then return -2 end
  end
end
-- Pushed in pieces: Lua's unpack takes a bounded number of values.
local function push(key, first, last)
  for i = first, last, 1000 do
    redis.call('RPUSH', key, unpack(ARGV, i, math.min(i + 999, last)))
  end
end
for _, list in ipairs(lists) do
  local key, from, first, count, length = list[1], list[2], list[3], list[4], list[5]
  if given(key) then
    if length > from then
      if from == 0 then redis.call('DEL', key) else redis.call('LTRIM', key, 0, from - 1) end
    end
    push(key, first, first + count - 1)
    -- A running turn's lists never expire; its end sets their TTL (save_outcome.lua). A list this save
    -- created, or one its owner saved into before, has none.
    if from > 0 and ARGV[11] == '1' then redis.call('PERSIST', key) end
  end
end
local audit_ttl = tonumber(ARGV[6])
local stubs = 12 + m + n
for j = 7, #KEYS do
  -- Kept (as a stub) rather than deleted: a worker's start.lua skips a redelivered call whose outcome exists.
  redis.call('SET', KEYS[j], ARGV[stubs + j - 7], 'EX', audit_ttl)
end
redis.call('SET', KEYS[1], ARGV[1])
if st ~= ARGV[2] then redis.call('SET', KEYS[2], ARGV[2]) end
local first = stubs + #KEYS - 6
local count = tonumber(ARGV[first])
if count == 1 then
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', unpack(ARGV, first + 1, #ARGV))
elseif count > 1 then
  -- The stream's last id is its last entry's: nothing else removes entries from a turn's stream.
  local ms, seq = math.floor(tonumber(ARGV[first + 4]) * 1000), 0
  local last = redis.call('XREVRANGE', KEYS[4], '+', '-', 'COUNT', 1)[1]
  if last then
    local last_ms, last_seq = string.match(last[1], '^(%d+)-(%d+)$')
    if tonumber(last_ms) >= ms then ms, seq = tonumber(last_ms), tonumber(last_seq) + 1 end
  end
  local id = string.format('%d-%d', ms, seq + count - 1)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], id, unpack(ARGV, first + 1, #ARGV))
end
return 1
