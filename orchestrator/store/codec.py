"""Pure helpers of the turn store: Lua scripts, the KEYS/ARGV they take, and decoding of what Redis returns.

The async `TurnStore` (orchestrator/store.py) and the sync `Client` (orchestrator/client.py) both talk to
Redis through these functions, so the storage layout and its atomic steps are written once. No I/O here.
What a turn looks like to a reader (`TurnView`) is built in `orchestrator/turn_view.py`.

Layout (keys from `workers.keys`):
- `turn_request` (JSON `TurnRequest`), `turn_status` (a `TurnStatus` value), `turn_state` (opaque JSON of the
  machine's state), `turn_outcome` (JSON `TurnOutcome`), `turn_events` (stream: name, at, data JSON),
  `turn_control` (stream: kind, call, approved, at), `turn_lease` (orchestrator id, with a TTL).
- `TURN_QUEUE` (list of claimable ids), `TURNS_CLAIMING` (ids between BLMOVE and their lease),
  `TURNS_ACTIVE` (zset of non-terminal ids, for orphan detection without SCAN).
- Conversations: `conversation_lock` holds the id of the conversation's one queued-or-running turn; later
  turns wait in `conversation_waiting` and are pushed onto `TURN_QUEUE` by the outcome write of the previous
  one, so a claimer never sees them early and never busy-loops.
Values may come back as bytes or str (the Redis client may or may not decode): `text()` accepts both.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from orchestrator.model import TurnOutcome, TurnRequest, TurnStatus
from workers import keys
from workers.contract import ToolOutcome, redact

TURN_ID_PREFIX = "turn_"
TURN_FINISHED = "turn_finished"
TURN_QUEUED = "turn_queued"
TERMINAL_STATUSES = tuple(s.value for s in TurnStatus if s.terminal)

# A Lua table literal of the terminal statuses, shared by the scripts below.
_TERMINAL_LUA = "{" + ", ".join(f"['{s}'] = true" for s in TERMINAL_STATUSES) + "}"


class TurnEvent(BaseModel):
    """One progress event of a turn (SPEC §7.4), as stored in its events stream."""

    id: str
    name: str
    turn_id: str
    at: float
    data: dict[str, Any] = Field(default_factory=dict)


class ControlRequest(BaseModel):
    """A cancel or approval request for a turn, read by its owner from the control stream."""

    id: str
    kind: Literal["cancel", "approval"]
    call_id: str | None = None
    approved: bool | None = None
    at: float


# --- scripts ---------------------------------------------------------------------------------------------

# KEYS: request, status, active, events, queue, conversation lock ('' if none), conversation waiting ('').
# ARGV: turn id, request JSON, now, event data JSON, events maxlen.
# Returns 0 when the turn already exists (a retried submit), 1 when queued, 2 when its conversation is busy.
SUBMIT_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], 'queued')
redis.call('ZADD', KEYS[3], tonumber(ARGV[3]), ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*',
           'name', 'turn_queued', 'at', ARGV[3], 'data', ARGV[4])
if KEYS[6] ~= '' then
  if redis.call('SET', KEYS[6], ARGV[1], 'NX') then
    redis.call('RPUSH', KEYS[5], ARGV[1])
    return 1
  end
  redis.call('RPUSH', KEYS[7], ARGV[1])
  return 2
end
redis.call('RPUSH', KEYS[5], ARGV[1])
return 1
"""

# KEYS: claiming list, lease, status. ARGV: turn id, orchestrator id, lease TTL ms.
# The lease is always taken with SET NX: whoever sets it owns the turn, so a claim racing a take-over is safe.
CLAIM_LUA = f"""
redis.call('LREM', KEYS[1], 0, ARGV[1])
local st = redis.call('GET', KEYS[3])
if not st or ({_TERMINAL_LUA})[st] then return 0 end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', tonumber(ARGV[3])) then return 0 end
if st == 'queued' then redis.call('SET', KEYS[3], 'running') end
return 1
"""

# KEYS: lease, status, claiming list. ARGV: turn id, orchestrator id, lease TTL ms.
# A queued turn is taken over only from the claiming list (its claimer died before leasing it); one still in
# the queue belongs to whoever pops it.
TAKE_OVER_LUA = f"""
local st = redis.call('GET', KEYS[2])
if not st or ({_TERMINAL_LUA})[st] then return 0 end
if st == 'queued' and not redis.call('LPOS', KEYS[3], ARGV[1]) then return 0 end
if not redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', tonumber(ARGV[3])) then return 0 end
redis.call('LREM', KEYS[3], 0, ARGV[1])
if st == 'queued' then redis.call('SET', KEYS[2], 'running') end
return 1
"""

# KEYS: active zset, claiming list. ARGV: limit, status key prefix, status suffix, lease prefix, lease suffix.
# Key names are built inside (prefixes from workers.keys): fine on a single Redis, which kombu needs anyway.
FIND_ORPHANS_LUA = """
local limit = tonumber(ARGV[1])
local found, seen = {}, {}
local function lease_missing(id)
  return redis.call('EXISTS', ARGV[4] .. id .. ARGV[5]) == 0
end
for _, id in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  if #found >= limit then return found end
  if not seen[id] and lease_missing(id) then found[#found + 1] = id; seen[id] = true end
end
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if #found >= limit then return found end
  local st = redis.call('GET', ARGV[2] .. id .. ARGV[3])
  if (st == 'running' or st == 'waiting') and not seen[id] and lease_missing(id) then
    found[#found + 1] = id; seen[id] = true
  end
end
return found
"""

# KEYS: the leases. ARGV: orchestrator id, TTL ms. Returns the 1-based indexes of the leases it does not hold.
RENEW_LUA = """
local lost = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, tonumber(ARGV[2]))
  else
    lost[#lost + 1] = i
  end
end
return lost
"""

# KEYS: lease. ARGV: orchestrator id. Deletes the lease only when this orchestrator holds it.
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: state, status, lease. ARGV: state JSON, status, orchestrator id ('' = no fencing).
# Returns 1 when written, 0 when the turn is already terminal, -1 when the lease belongs to someone else.
SAVE_STATE_LUA = f"""
local st = redis.call('GET', KEYS[2])
if st and ({_TERMINAL_LUA})[st] then return 0 end
if ARGV[3] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[3] then return -1 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""

# KEYS: outcome, status, active, events, request, state, control, queue, conversation head, lock, waiting
# ('' for the three conversation keys when the turn has none).
# ARGV: turn id, outcome JSON, status, TTL s, event data JSON, events maxlen, now.
# The first terminal write wins. The turn_finished event is added here, atomically with the outcome, so a
# reader that sees it can always read the outcome. Then the conversation's next turn (if any) is queued.
SAVE_OUTCOME_LUA = f"""
local st = redis.call('GET', KEYS[2])
if st and ({_TERMINAL_LUA})[st] then return 0 end
local ttl = tonumber(ARGV[4])
redis.call('SET', KEYS[1], ARGV[2], 'EX', ttl)
redis.call('SET', KEYS[2], ARGV[3], 'EX', ttl)
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*',
           'name', 'turn_finished', 'at', ARGV[7], 'data', ARGV[5])
for i = 4, 7 do redis.call('EXPIRE', KEYS[i], ttl) end
if KEYS[9] ~= '' then
  redis.call('SET', KEYS[9], ARGV[1], 'EX', ttl)
  if redis.call('GET', KEYS[10]) == ARGV[1] then
    local nxt = redis.call('LPOP', KEYS[11])
    if nxt then
      redis.call('SET', KEYS[10], nxt)
      redis.call('RPUSH', KEYS[8], nxt)
    else
      redis.call('DEL', KEYS[10])
    end
  end
end
return 1
"""

# KEYS: control stream, lease, status. ARGV: inbox prefix, turn id, kind, call id, approved ('1'/'0'/''), now.
# Returns -1 for an unknown turn, 0 for a terminal one, 1 when recorded (and the owner, if any, notified).
CONTROL_LUA = f"""
local st = redis.call('GET', KEYS[3])
if not st then return -1 end
if ({_TERMINAL_LUA})[st] then return 0 end
local id = redis.call('XADD', KEYS[1], '*',
                      'kind', ARGV[3], 'call', ARGV[4], 'approved', ARGV[5], 'at', ARGV[6])
local owner = redis.call('GET', KEYS[2])
if owner then
  redis.call('XADD', ARGV[1] .. owner, 'MAXLEN', '~', '100000', '*', 'kind', 'control', 'turn', ARGV[2],
             'control', ARGV[3], 'call', ARGV[4], 'approved', ARGV[5], 'id', id)
end
return 1
"""


# --- builders (pure) -------------------------------------------------------------------------------------


def new_turn_id() -> str:
    """A fresh turn id: `turn_` + uuid4 hex."""
    return TURN_ID_PREFIX + uuid.uuid4().hex


def validate_turn_id(turn_id: str) -> str:
    """A turn id given by a caller: non-empty printable text without whitespace, at most 200 characters."""
    if not turn_id or len(turn_id) > 200 or any(c.isspace() or not c.isprintable() for c in turn_id):
        raise ValueError(f"invalid turn id {turn_id!r}: use 1–200 printable characters without spaces")
    return turn_id


def build_turn_request(
    *,
    prompt: str | None = None,
    messages: Sequence[Any] | None = None,
    tools: Sequence[str] | None = None,
    model: str | None = None,
    limits: Any = None,
    context: Mapping[str, Any] | None = None,
    conversation_id: str | None = None,
    tool_choice: str | None = None,
) -> TurnRequest:
    """A validated `TurnRequest` from the client's keyword arguments (pydantic `ValidationError` if bad).

    A turn needs something to answer: a `prompt`, `messages`, or both (the prompt is the last user message).
    """
    raw: dict[str, Any] = {
        "prompt": prompt,
        "messages": list(messages or []),
        "tools": list(tools) if tools is not None else None,
        "model": model,
        "context": dict(context or {}),
        "conversation_id": conversation_id,
        "tool_choice": tool_choice,
    }
    if limits is not None:
        raw["limits"] = limits.model_dump() if isinstance(limits, BaseModel) else limits
    request = TurnRequest.model_validate(raw)
    check_turn_request(request)
    return request


def check_turn_request(request: TurnRequest) -> None:
    """Rules a `TurnRequest` model cannot state alone; `ValueError` with a clear message."""
    if not (request.prompt and request.prompt.strip()) and not request.messages:
        raise ValueError("a turn needs a non-empty 'prompt' or at least one message in 'messages'")
    if request.conversation_id is not None and not request.conversation_id.strip():
        raise ValueError("'conversation_id' must not be blank")
    problem = find_unstorable_value(request.model_dump())
    if problem is not None:
        raise ValueError(problem)


def find_unstorable_value(value: Any) -> str | None:
    """What JSON in UTF-8 cannot carry in `value` (a non-finite number, an unpaired surrogate), or None.

    A turn is stored as JSON text, so either would fail (or silently change) at the write; refusing it at
    validation gives the caller a message naming the field instead. The walk is iterative: a value nested
    deeper than Python's recursion limit is still checked.
    """
    pending: list[tuple[str, Any]] = [("", value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"{path or 'value'}: {item!r} is not a JSON number; send a finite number or a string"
        if isinstance(item, str):
            problem = describe_unpaired_surrogate(item)
            if problem is not None:
                return f"{path or 'value'}: {problem}"
        elif isinstance(item, dict):
            for key, child in item.items():
                name = key if isinstance(key, str) else repr(key)
                problem = describe_unpaired_surrogate(name)
                if problem is not None:
                    return f"{path or 'value'}: a key holds {problem}"
                pending.append((f"{path}.{name}" if path else name, child))
        elif isinstance(item, list | tuple):
            pending.extend((f"{path}[{i}]", child) for i, child in enumerate(item))
    return None


def describe_unpaired_surrogate(value: str) -> str | None:
    """None for text UTF-8 can encode; else where its first unpaired surrogate is (e.g. a lone `\\ud800`)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(value[exc.start])
        return (
            f"an unpaired surrogate \\u{code:04x} at index {exc.start} is not valid Unicode text; "
            "send a character or a complete surrogate pair"
        )
    return None


def build_submit_call(request: TurnRequest, turn_id: str, now: float) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of SUBMIT_LUA."""
    conversation = request.conversation_id
    event = {"turn_id": turn_id, "conversation_id": conversation, "model": request.model}
    keys_ = [
        keys.turn_request(turn_id),
        keys.turn_status(turn_id),
        keys.TURNS_ACTIVE,
        keys.turn_events(turn_id),
        keys.TURN_QUEUE,
        keys.conversation_lock(conversation) if conversation else "",
        keys.conversation_waiting(conversation) if conversation else "",
    ]
    args = [turn_id, request.model_dump_json(), repr(now), json.dumps(event), str(keys.EVENTS_MAXLEN)]
    return keys_, args


def build_save_outcome_call(
    turn_id: str, outcome: TurnOutcome, conversation_id: str | None, now: float
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of SAVE_OUTCOME_LUA."""
    keys_ = [
        keys.turn_outcome(turn_id),
        keys.turn_status(turn_id),
        keys.TURNS_ACTIVE,
        keys.turn_events(turn_id),
        keys.turn_request(turn_id),
        keys.turn_state(turn_id),
        keys.turn_control(turn_id),
        keys.TURN_QUEUE,
        keys.conversation_head(conversation_id) if conversation_id else "",
        keys.conversation_lock(conversation_id) if conversation_id else "",
        keys.conversation_waiting(conversation_id) if conversation_id else "",
    ]
    summary = {
        "turn_id": turn_id,
        "status": outcome.status,
        "stop_reason": outcome.stop_reason,
        "limit_reached": outcome.limit_reached,
        "llm_calls": outcome.llm_calls,
        "tool_executions": outcome.tool_executions,
        "usage": outcome.usage.model_dump(mode="json"),
    }
    args = [
        turn_id,
        outcome.model_dump_json(),
        outcome.status,
        str(keys.TURN_TTL_S),
        json.dumps(summary),
        str(keys.EVENTS_MAXLEN),
        repr(now),
    ]
    return keys_, args


def build_control_call(
    turn_id: str, kind: str, call_id: str | None, approved: bool | None, now: float
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of CONTROL_LUA."""
    keys_ = [keys.turn_control(turn_id), keys.turn_lease(turn_id), keys.turn_status(turn_id)]
    approved_arg = "" if approved is None else ("1" if approved else "0")
    args = [keys.INBOX_PREFIX, turn_id, kind, call_id or "", approved_arg, repr(now)]
    return keys_, args


def build_orphan_args(limit: int) -> list[str]:
    """ARGV of FIND_ORPHANS_LUA: the limit and the prefix/suffix of the status and lease keys."""
    status_prefix, status_suffix = keys.turn_status("\0").split("\0")
    lease_prefix, lease_suffix = keys.turn_lease("\0").split("\0")
    return [str(limit), status_prefix, status_suffix, lease_prefix, lease_suffix]


def build_event_fields(name: str, data: Mapping[str, Any], now: float) -> dict[str, str]:
    """Stream fields of one event; sensitive values are redacted here too, whoever built the data."""
    return {"name": name, "at": repr(now), "data": json.dumps(redact(dict(data)), default=str)}


def build_inbox_ack_id(entry_id: str) -> str:
    """The MINID that trims an inbox up to and including `entry_id` (the next possible id)."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def now_s() -> float:
    """Wall-clock epoch seconds: what every timestamp in the store is."""
    return time.time()


# --- parsers (pure) --------------------------------------------------------------------------------------


def text(value: Any) -> str:
    """A Redis reply as str, whether or not the client decodes responses."""
    return value.decode() if isinstance(value, bytes) else value


def parse_fields(fields: Mapping[Any, Any]) -> dict[str, str]:
    """A stream entry's field map with str keys and values."""
    return {text(k): text(v) for k, v in fields.items()}


def parse_status(value: bytes | str | None) -> TurnStatus | None:
    """A stored status, or None when the turn is unknown."""
    return None if value is None else TurnStatus(text(value))


def parse_outcome(value: bytes | str | None) -> TurnOutcome | None:
    """A stored `TurnOutcome`, or None."""
    return None if value is None else TurnOutcome.model_validate_json(value)


def parse_request(value: bytes | str | None) -> TurnRequest | None:
    """A stored `TurnRequest`, or None."""
    return None if value is None else TurnRequest.model_validate_json(value)


def parse_tool_outcome(value: bytes | str | None) -> ToolOutcome | None:
    """A stored tool `ToolOutcome` envelope, or None."""
    return None if value is None else ToolOutcome.model_validate_json(value)


def parse_event(turn_id: str, entry_id: bytes | str, fields: Mapping[Any, Any]) -> TurnEvent:
    """One entry of a turn's events stream."""
    decoded = parse_fields(fields)
    return TurnEvent(
        id=text(entry_id),
        name=decoded.get("name", ""),
        turn_id=turn_id,
        at=float(decoded.get("at", "0")),
        data=json.loads(decoded.get("data", "{}")),
    )


def parse_control(entry_id: bytes | str, fields: Mapping[Any, Any]) -> ControlRequest:
    """One entry of a turn's control stream."""
    decoded = parse_fields(fields)
    approved = decoded.get("approved", "")
    return ControlRequest.model_validate(
        {
            "id": text(entry_id),
            "kind": decoded["kind"],
            "call_id": decoded.get("call") or None,
            "approved": None if approved == "" else approved == "1",
            "at": float(decoded.get("at", "0")),
        }
    )


def parse_stream_reply(reply: Any) -> list[tuple[str, Mapping[Any, Any]]]:
    """The entries of an XREAD reply (RESP2 `[[stream, entries]]` or RESP3 `{stream: [entries]}`), or []."""
    if not reply:
        return []
    if isinstance(reply, dict):
        groups = [entries for wrapped in reply.values() for entries in wrapped]
    else:
        groups = [entries for _, entries in reply]
    return [(text(entry_id), fields) for entries in groups for entry_id, fields in entries]
