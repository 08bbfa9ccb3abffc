-- Add a batch of progress events to a turn's events stream, in order, in one round trip (a model call's
-- streamed pieces flushed together). `turn_finished` never comes here: save_outcome.lua publishes it.
-- KEYS: the turn's events stream.
-- ARGV: events maxlen, then (name, at, data JSON) per event.
-- Returns the stream id of the last event added.
local id = ''
for i = 2, #ARGV, 3 do
  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'name', ARGV[i], 'at', ARGV[i + 1],
    'data', ARGV[i + 2])
end
return id
