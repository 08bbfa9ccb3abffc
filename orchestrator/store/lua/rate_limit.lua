-- Model rate limits shared by the fleet: admit a model call against its model's budgets, or settle one after
-- its answer. Each budget is a sliding window: a sorted set of the calls in it (member: the call's id,
-- score: ms) and a hash of their tokens (field per call, and the window's sum under SUM_FIELD); and a line
-- of the calls told to wait (member: id, score: the ms it was told to come back), so that each waiter is
-- given a slot of its own rather than all of them the first one to free. Time is Redis's own (TIME), so
-- that every orchestrator counts on one clock, whatever theirs say.
-- KEYS: the model's pause key, then per budget its calls (zset), its tokens (hash) and its line (zset).
-- ARGV[1] = 'admit': reservation id, tokens wanted, then per budget: window ms, max requests, max tokens
--   (0: not limited that way). Returns {0, 0} when every budget had room (the call is counted in each), else
--   {what held it, ms to wait, which budget (1-based; 0 for the pause)}: 1 the pause, 2 requests, 3 tokens;
--   of several, the longest wait.
-- ARGV[1] = 'settle': reservation id, 'refund' | 'count', ms since the answer began, used tokens ('': as
--   reserved), pause ms. A refund takes the call out of each window; a count moves it to when its answer
--   began (the provider counted it by then) and sets its tokens to those used. A pause (> 0 ms) holds the
--   model until that long from now, unless it is held longer already. Returns 1.
local SUM_FIELD = '~sum'
local CHUNK = 500
-- A waiter this late coming back has lost its place in the line.
local LATE_MS = 2000
-- HINCRBY by a difference: never by 0, which Lua may write '-0', a number Redis does not read.
local function add(tokens, amount)
  if amount ~= 0 then redis.call('HINCRBY', tokens, SUM_FIELD, amount) end
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local budgets = (#KEYS - 1) / 3
local id = ARGV[2]

-- Calls older than the window leave it, with their tokens.
local function expire(calls, tokens, window)
  local old = redis.call('ZRANGEBYSCORE', calls, '-inf', now - window)
  for i = 1, #old, CHUNK do
    local ids = {unpack(old, i, math.min(i + CHUNK - 1, #old))}
    local freed = 0
    for _, value in ipairs(redis.call('HMGET', tokens, unpack(ids))) do
      freed = freed + (tonumber(value) or 0)
    end
    add(tokens, -freed)
    redis.call('HDEL', tokens, unpack(ids))
  end
  if #old > 0 then redis.call('ZREMRANGEBYSCORE', calls, '-inf', now - window) end
end

-- Ms until `free` tokens have left the window (until it empties when it never holds that many).
local function wait_for_tokens(calls, tokens, window, free)
  local freed, last = 0, now - window
  local start = 0
  while true do
    local rows = redis.call('ZRANGE', calls, start, start + CHUNK - 1, 'WITHSCORES')
    if #rows == 0 then break end
    local ids = {}
    for i = 1, #rows, 2 do ids[#ids + 1] = rows[i] end
    local values = redis.call('HMGET', tokens, unpack(ids))
    for i = 1, #ids do
      freed = freed + (tonumber(values[i]) or 0)
      last = tonumber(rows[2 * i])
      if freed >= free then return last + window - now end
    end
    start = start + CHUNK
  end
  return last + window - now
end

local function admit()
  local paused = tonumber(redis.call('GET', KEYS[1]) or '0')
  if paused > now then return {1, paused - now, 0} end
  local want = tonumber(ARGV[3])
  local held, wait, which = 0, 0, 0
  for b = 1, budgets do
    local calls, tokens, line = KEYS[3 * b - 1], KEYS[3 * b], KEYS[3 * b + 1]
    local window = tonumber(ARGV[1 + 3 * b])
    local max_requests, max_tokens = tonumber(ARGV[2 + 3 * b]), tonumber(ARGV[3 + 3 * b])
    expire(calls, tokens, window)
    local count = redis.call('ZCARD', calls)
    -- Ahead of a newcomer: the whole line; of a waiter back, those told to come back before it.
    redis.call('ZREMRANGEBYSCORE', line, '-inf', now - LATE_MS)
    local mine = redis.call('ZSCORE', line, id)
    local ahead
    if mine then
      redis.call('ZREM', line, id)
      ahead = redis.call('ZCOUNT', line, '-inf', '(' .. mine)
    else
      ahead = redis.call('ZCARD', line)
    end
    local this = 0
    local why = 0
    if max_requests > 0 and count + ahead >= max_requests then
      -- The call waits for the k-th call in the window to leave it (past them all: a window later, spaced).
      local k = count + ahead - max_requests
      if k < count then
        this = tonumber(redis.call('ZRANGE', calls, k, k, 'WITHSCORES')[2]) + window - now
      else
        this = window + math.floor((k - count + 1) * window / max_requests)
      end
      why = 2
    end
    local used = tonumber(redis.call('HGET', tokens, SUM_FIELD) or '0')
    -- A call larger than the whole budget goes alone, in an empty window, rather than never.
    if max_tokens > 0 and used > 0 and used + want > max_tokens then
      local after = wait_for_tokens(calls, tokens, window, used + want - max_tokens)
      if after > this then this, why = after, 3 end
    end
    if why > 0 and math.max(this, 1) > wait then held, wait, which = why, math.max(this, 1), b end
  end
  if held > 0 then
    for b = 1, budgets do
      redis.call('ZADD', KEYS[3 * b + 1], now + wait, id)
      redis.call('PEXPIRE', KEYS[3 * b + 1], wait + LATE_MS)
    end
    return {held, wait, which}
  end
  for b = 1, budgets do
    local calls, tokens = KEYS[3 * b - 1], KEYS[3 * b]
    local window = tonumber(ARGV[1 + 3 * b])
    redis.call('ZADD', calls, now, id)
    redis.call('HSET', tokens, id, want)
    add(tokens, want)
    redis.call('PEXPIRE', calls, window + 1000)
    redis.call('PEXPIRE', tokens, window + 1000)
  end
  return {0, 0}
end

local function settle()
  local mode, ago, used, pause = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  for b = 1, budgets do
    local calls, tokens = KEYS[3 * b - 1], KEYS[3 * b]
    local reserved = tonumber(redis.call('HGET', tokens, id) or 'nil')
    -- A call whose window has passed is counted no more: nothing to give back or correct.
    if reserved ~= nil then
      if mode == 'refund' then
        redis.call('ZREM', calls, id)
        redis.call('HDEL', tokens, id)
        add(tokens, -reserved)
      else
        redis.call('ZADD', calls, 'XX', now - ago, id)
        if used ~= nil then
          redis.call('HSET', tokens, id, used)
          add(tokens, used - reserved)
        end
      end
    end
  end
  if pause > 0 then
    local until_ms = now + pause
    if until_ms > tonumber(redis.call('GET', KEYS[1]) or '0') then
      redis.call('SET', KEYS[1], until_ms, 'PX', pause)
    end
  end
  return 1
end

if ARGV[1] == 'admit' then return admit() end
return settle()
