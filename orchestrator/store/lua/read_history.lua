-- Read some keys and the lists one of them references, in one round trip (a turn's state with its history and
-- log, its outcome, a conversation's head: each says which lists hold its entries and how many are its own).
-- KEYS: the keys to read (GET each).
-- ARGV: the 1-based indexes of the KEYS whose value may reference lists, in the order to try: the first JSON
--       object with a string `history_key` wins.
-- Returns: each key's value (nil when missing), then the first `history_len` entries of its `history_key` list,
-- then the first `log_len` entries of its `log_key` list ({} for a list not referenced).
local values = {}
for i = 1, #KEYS do values[i] = redis.call('GET', KEYS[i]) end
local history, log = {}, {}
local function head(key, len)
  local n = tonumber(len) or 0
  if type(key) == 'string' and n > 0 then return redis.call('LRANGE', key, 0, n - 1) end
  return {}
end
for _, index in ipairs(ARGV) do
  local raw = values[tonumber(index)]
  if raw then
    local ok, decoded = pcall(cjson.decode, raw)
    if ok and type(decoded) == 'table' and type(decoded['history_key']) == 'string' then
      history = head(decoded['history_key'], decoded['history_len'])
      log = head(decoded['log_key'], decoded['log_len'])
      break
    end
  end
end
values[#KEYS + 1] = history
values[#KEYS + 2] = log
return values
