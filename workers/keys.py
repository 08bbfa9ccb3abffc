"""Every Redis key toolloop uses, with its TTL, in one place — and the atomic scripts both sides share.

Workers are the leaf package, so the storage layout lives here and the orchestrator imports it; no other
module spells a key. Keys share the prefix `toolloop:` so that one Redis can hold several apps.
"""

from __future__ import annotations

PREFIX = "toolloop:"

# --- retention -------------------------------------------------------------------------------------------
OUTCOME_TTL_S = 7 * 24 * 3600  # one call's outcome envelope (and its late duplicates, for audit)
FULL_RESULT_TTL_S = 24 * 3600  # the untruncated result of an oversized call (SPEC §4.7)
IDEMPOTENCY_TTL_S = 24 * 3600  # a stored success that replays (SPEC §4.8)
CATALOGUE_STALE_S = 60.0  # a worker's catalogue entry older than this is ignored
CATALOGUE_REFRESH_S = 15.0  # how often a worker republishes its catalogue entry
TURN_TTL_S = 7 * 24 * 3600  # a turn's request, state, events and outcome after it ends
INBOX_MAXLEN = 100_000  # approximate cap of an orchestrator's inbox stream
EVENTS_MAXLEN = 10_000  # approximate cap of one turn's event stream

# --- tools -----------------------------------------------------------------------------------------------
CATALOGUE = PREFIX + "catalogue"  # hash: worker id -> {"seen_at": epoch, "tools": [ToolSpec…]}


def outcome(call_id: str) -> str:
    """The one outcome of a call: first writer wins (SET NX)."""
    return f"{PREFIX}outcome:{call_id}"


def late_outcomes(call_id: str) -> str:
    """Outcomes that lost the race for `outcome(call_id)`: kept for audit, never shown to a model."""
    return f"{PREFIX}outcome:{call_id}:late"


def full_result(call_id: str) -> str:
    return f"{PREFIX}result:{call_id}"


def attempts(call_id: str) -> str:
    """INCR per execution start: counts attempts across retries and redeliveries."""
    return f"{PREFIX}attempts:{call_id}"


def running(call_id: str) -> str:
    """Held while one execution runs, so a redelivered copy of the message does not run it in parallel."""
    return f"{PREFIX}running:{call_id}"


def idempotency(tool: str, key_digest: str) -> str:
    return f"{PREFIX}idem:{tool}:{key_digest}"


def idempotency_lock(idempotency_key: str) -> str:
    """Held (value: call id) while a call runs under `idempotency_key`; an identical call waits for it."""
    return f"{idempotency_key}:lock"


def reply(call_id: str) -> str:
    """A list a direct caller (no orchestrator) blocks on for one call's outcome."""
    return f"{PREFIX}reply:{call_id}"


# --- turns -----------------------------------------------------------------------------------------------
TURN_QUEUE = PREFIX + "turns:pending"  # list of turn ids waiting for an orchestrator
ORCHESTRATORS = PREFIX + "orchestrators"  # zset: orchestrator id -> last heartbeat (epoch)
INBOX_PREFIX = PREFIX + "inbox:"  # + orchestrator id: stream of outcome/started notifications


def inbox(orchestrator_id: str) -> str:
    return INBOX_PREFIX + orchestrator_id


def turn_request(turn_id: str) -> str:
    return f"{PREFIX}turn:{turn_id}:request"


def turn_state(turn_id: str) -> str:
    return f"{PREFIX}turn:{turn_id}:state"


def turn_outcome(turn_id: str) -> str:
    return f"{PREFIX}turn:{turn_id}:outcome"


def turn_events(turn_id: str) -> str:
    return f"{PREFIX}turn:{turn_id}:events"


def turn_lease(turn_id: str) -> str:
    """Which orchestrator owns a turn (value: its id), with a TTL its heartbeat renews."""
    return f"{PREFIX}turn:{turn_id}:lease"


def turn_control(turn_id: str) -> str:
    """Stream of cancel/approval requests for a turn, read by its owner."""
    return f"{PREFIX}turn:{turn_id}:control"


def conversation_head(conversation_id: str) -> str:
    """The id of the last turn of a conversation: the next turn starts from its history."""
    return f"{PREFIX}conversation:{conversation_id}:head"


# zset: non-terminal turn id -> submitted at (epoch); orphans are found here
TURNS_ACTIVE = PREFIX + "turns:active"
# list: ids moved out of TURN_QUEUE (BLMOVE) until their lease is set
TURNS_CLAIMING = PREFIX + "turns:claiming"


def turn_status(turn_id: str) -> str:
    """The turn's `TurnStatus` value (queued, running, waiting, or terminal)."""
    return f"{PREFIX}turn:{turn_id}:status"


def conversation_waiting(conversation_id: str) -> str:
    """List of a conversation's turns submitted while another of its turns was not yet terminal (FIFO)."""
    return f"{PREFIX}conversation:{conversation_id}:waiting"


def conversation_lock(conversation_id: str) -> str:
    """Held by the running turn of a conversation, so two of its turns never run at once."""
    return f"{PREFIX}conversation:{conversation_id}:lock"


# --- scripts ---------------------------------------------------------------------------------------------

# First writer wins (SPEC §4.9). KEYS: outcome, late list, turn lease ('' when no turn), reply list ('' when
# none). ARGV: outcome JSON, TTL seconds, inbox prefix, call id, turn id. Returns 1 when this write won.
# The owner is looked up inside the script so a notification always goes to the turn's current owner; it
# carries the outcome itself when small (8 KiB), sparing the owner a read of it ('' otherwise).
WRITE_OUTCOME_LUA = """
local won = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', tonumber(ARGV[2]))
if not won then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[2]))
  return 0
end
if KEYS[3] ~= '' then
  local owner = redis.call('GET', KEYS[3])
  if owner then
    redis.call('XADD', ARGV[3] .. owner, 'MAXLEN', '~', '100000', '*',
               'kind', 'outcome', 'turn', ARGV[5], 'call', ARGV[4],
               'outcome', #ARGV[1] <= 8192 and ARGV[1] or '')
  end
end
if KEYS[4] ~= '' then
  redis.call('RPUSH', KEYS[4], ARGV[4])
  redis.call('EXPIRE', KEYS[4], tonumber(ARGV[2]))
end
return 1
"""

# Tell a turn's current owner something happened to one of its calls (e.g. a worker started it).
# KEYS: turn lease. ARGV: inbox prefix, then field/value pairs. Returns 1 when an owner was found.
NOTIFY_OWNER_LUA = """
local owner = redis.call('GET', KEYS[1])
if not owner then return 0 end
local fields = {}
for i = 2, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('XADD', ARGV[1] .. owner, 'MAXLEN', '~', '100000', '*', unpack(fields))
return 1
"""


def build_write_outcome_call(
    call_id: str, turn_id: str | None, outcome_json: str, reply_key: str | None = None
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV for WRITE_OUTCOME_LUA, so both sides write outcomes identically."""
    keys = [
        outcome(call_id),
        late_outcomes(call_id),
        turn_lease(turn_id) if turn_id else "",
        reply_key or "",
    ]
    args = [outcome_json, str(OUTCOME_TTL_S), INBOX_PREFIX, call_id, turn_id or ""]
    return keys, args
