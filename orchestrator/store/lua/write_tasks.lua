-- Write a batch of tool-task messages into the broker's lists, with their `task-sent` events, in one round
-- trip: the commands kombu's Redis transport would run for them (`runtime.task_wire`), for a broker that is
-- this Redis. A Redis refusing writes (out of memory, read-only) refuses the script before its first write. Only three kinds of command come here, each an opcode in ARGV:
--   'L', message        LPUSH the message onto the next key (a queue's list)
--   'E', milliseconds   PEXPIRE the next key (a queue declared with an expiry)
--   'P', channel, event PUBLISH the event (a fanout exchange: Celery's task events)
-- KEYS: the keys of the L and E commands, in their order. ARGV: the opcodes and their arguments.
-- Returns the number of commands run.
local k, i, n = 0, 1, 0
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'L' then
    k = k + 1
    redis.call('LPUSH', KEYS[k], ARGV[i + 1])
    i = i + 2
  elseif op == 'E' then
    k = k + 1
    redis.call('PEXPIRE', KEYS[k], ARGV[i + 1])
    i = i + 2
  elseif op == 'P' then
    redis.call('PUBLISH', ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  else
    return redis.error_reply('write_tasks: unknown opcode ' .. tostring(op))
  end
  n = n + 1
end
return n
