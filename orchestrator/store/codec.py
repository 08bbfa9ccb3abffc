"""Pure helpers of the turn store: turn ids, request checks, event fields, decoding what Redis returns.

The operations both stores run (`orchestrator.store.operations`) build their KEYS/ARGV and parse their replies
with these functions; the scripts themselves are `.lua` files (`orchestrator.store.scripts`). No I/O here.
What a turn looks like to a reader (`TurnView`) is built in `orchestrator.store.turn_view`.

Layout (keys from `workers.keys`):
- `turn_request` (JSON `TurnRequest`), `turn_status` (a `TurnStatus` value), `turn_state` (opaque JSON of the
  machine's state), `turn_outcome` (JSON `TurnOutcome`), `turn_events` (stream: name, at, data JSON),
  `turn_control` (stream: kind, call, approved, at, arguments JSON, reason, by), `turn_lease` (orchestrator
  id, with a TTL).
- `TURN_QUEUE` (list of claimable ids), `TURNS_CLAIMING` (ids between BLMOVE and their lease),
  `TURNS_ACTIVE` (zset of non-terminal ids, for orphan detection without SCAN), `TURNS_PARKED` (zset of the
  turns that only wait for people, held by no orchestrator, by when each must be looked at).
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from orchestrator.model import TurnOutcome, TurnRequest, TurnStatus
from workers import keys
from workers.contract import ToolOutcome, ToolSpec, redact
from workers.contract import parse_tool_outcome as read_tool_outcome
from workers.records import STORED

TURN_ID_PREFIX = "turn_"
TURN_FINISHED = "turn_finished"
TURN_QUEUED = "turn_queued"


class TurnEvent(BaseModel):
    """One progress event of a turn, as stored in its events stream."""

    id: str
    name: str
    turn_id: str
    at: float
    data: dict[str, Any] = Field(default_factory=dict)


class ControlRequest(BaseModel):
    """A cancel or approval request for a turn, read by its owner from the control stream (`unreadable`: an
    entry this release cannot read, never written as such)."""

    id: str
    kind: Literal["cancel", "approval", "client_result", "child_result", "unreadable"]
    call_id: str | None = None
    approved: bool | None = None
    at: float
    # An approval's edited arguments (run instead of the model's, once validated) and a person's reason (what
    # a denial tells the model); None in entries written before approvals carried them.
    arguments: dict[str, Any] | None = None
    reason: str | None = None
    # Who answered, as the answering client said; None when it did not (and in older entries).
    decided_by: str | None = None
    # A client-side tool's result, as JSON text (None: none sent; an error travels in `reason`).
    result: str | None = None


# --- builders (pure) -------------------------------------------------------------------------------------


def new_turn_id(conversation_id: str | None = None) -> str:
    """A fresh turn id: `turn_` + uuid4 hex; for a turn of `conversation_id`, one whose keys share the
    conversation's slot on a Redis Cluster (`keys.fit_turn_id`: its last four digits chosen), whatever the
    layout here, so that a client need not know where its turns are stored."""
    if conversation_id is None:
        return TURN_ID_PREFIX + uuid.uuid4().hex
    while True:
        fitted = keys.fit_turn_id(TURN_ID_PREFIX + uuid.uuid4().hex[:28], conversation_id)
        if fitted is not None:
            return fitted


def validate_turn_id(turn_id: str) -> str:
    """A turn id given by a caller: non-empty printable text without whitespace, at most 200 characters."""
    if not turn_id or len(turn_id) > 200 or any(c.isspace() or not c.isprintable() for c in turn_id):
        raise ValueError(f"invalid turn id {turn_id!r}: use 1–200 printable characters without spaces")
    return turn_id


# What a turn's prompt and messages may hold, in bytes of UTF-8: the HTTP API's default body limit. A turn
# far past it (30 MB) held an orchestrator's loop for a minute, every other turn waiting.
MAX_INPUT_BYTES = 1024 * 1024


def check_turn_request(request: TurnRequest) -> None:
    """Rules a `TurnRequest` model cannot state alone; `ValueError` with a clear message."""
    if not (request.prompt and request.prompt.strip()) and not request.messages:
        raise ValueError("a turn needs a non-empty 'prompt' or at least one message in 'messages'")
    if request.conversation_id is not None and not request.conversation_id.strip():
        raise ValueError("'conversation_id' must not be blank")
    problem = find_unstorable_value(request.model_dump())
    if problem is not None:
        raise ValueError(problem)
    if request.forked_from is None:  # a fork's messages are a turn's history, as large as that grew
        _check_input_size(request)


def _check_input_size(request: TurnRequest) -> None:
    size = len((request.prompt or "").encode("utf-8"))
    if request.messages:
        size += sum(len(message.model_dump_json()) for message in request.messages)
    if size > MAX_INPUT_BYTES:
        raise ValueError(
            f"the turn's prompt and messages are {size} bytes, over the {MAX_INPUT_BYTES} allowed: send a "
            "large document to a tool (by reference, in 'context' or a store of your own), not in the prompt"
        )


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


def build_event_fields(name: str, data: Mapping[str, Any], now: float) -> dict[str, str]:
    """Stream fields of one event; sensitive values are redacted here too, whoever built the data."""
    return {"name": name, "at": repr(now), "data": json.dumps(redact(dict(data)), default=str)}


# A step's events are one entry of the turn's stream (`save_step.lua`): the first in the entry's own fields
# (`name`, `at`, `data`, as a lone event is stored), the others in `more`, a JSON array of [name, data].
# The entry's id is its last event's; the events before it have the ids just below it, which the script
# keeps free (`parse_entry`): every event has an id of its own to resume after, in the stream's order.
MORE_FIELD = "more"

StreamId = tuple[int, int]


def parse_stream_id(text: str) -> StreamId:
    """A stream id as a comparable pair: `"1700000000000-3"` → (1700000000000, 3); `"5"` → (5, 0), as XREAD
    reads an id without a sequence number."""
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def build_entry_fields(events: Sequence[tuple[str, Mapping[str, Any]]], now: float) -> list[str]:
    """The fields of the one stream entry that holds `events` (at least one), in XADD's order: the first
    event's `name`, `at` and `data`, then `more` with the others (redacted as `build_event_fields`)."""
    first = build_event_fields(events[0][0], events[0][1], now)
    fields = ["name", first["name"], "at", first["at"], "data", first["data"]]
    if len(events) > 1:
        rest = [[name, redact(dict(data))] for name, data in events[1:]]
        fields += [MORE_FIELD, json.dumps(rest, default=str)]
    return fields


def parse_entry(turn_id: str, entry_id: bytes | str, fields: Mapping[Any, Any]) -> list[TurnEvent]:
    """The events of one entry of a turn's events stream, each with its own id (see `MORE_FIELD`)."""
    decoded = parse_fields(fields)
    at = float(decoded.get("at", "0"))
    found: list[tuple[str, Any]] = [(decoded.get("name", ""), json.loads(decoded.get("data", "{}")))]
    more = decoded.get(MORE_FIELD)
    if more:
        found += [(str(name), data) for name, data in json.loads(more)]
    ms, seq = parse_stream_id(text(entry_id))
    first = seq - (len(found) - 1)
    return [
        TurnEvent(id=f"{ms}-{first + k}", name=name, turn_id=turn_id, at=at, data=data if data else {})
        for k, (name, data) in enumerate(found)
    ]


def parse_entries(
    turn_id: str, entries: Iterable[tuple[Any, Mapping[Any, Any]]], after: str = "0"
) -> list[TurnEvent]:
    """The events of these entries that come after the stream id `after`: an entry read after an id holds
    the events before it too when that id is one of its own."""
    cursor = parse_stream_id(after)
    return [
        event
        for entry_id, fields in entries
        for event in parse_entry(turn_id, entry_id, fields)
        if parse_stream_id(event.id) > cursor
    ]


def dump_control_arguments(arguments: Mapping[str, Any] | None) -> str:
    """An approval's edited arguments as the control stream stores them: JSON text, "" for none."""
    if arguments is None:
        return ""
    if not isinstance(arguments, Mapping):
        raise ValueError("'arguments' must be a JSON object of the tool's arguments")
    problem = find_unstorable_value(dict(arguments))
    if problem is not None:
        raise ValueError(f"arguments: {problem}")
    return json.dumps(dict(arguments), ensure_ascii=False, separators=(",", ":"))


# The largest result a client-side tool's caller may send (as the model reads it): a tool's default
# `max_result_bytes`, past which a worker's result would be cut.
CLIENT_RESULT_MAX_BYTES: int = ToolSpec.model_fields["max_result_bytes"].default


def dump_client_result(result: Any, max_bytes: int) -> str:
    """A client-side tool's result as the control stream stores it (JSON text); `ValueError` for a value
    JSON cannot carry, or one over `max_bytes` as the model would read it."""
    problem = find_unstorable_value(result)
    if problem is not None:
        raise ValueError(f"result: {problem}")
    try:
        text = json.dumps(result, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"result: not JSON ({exc})") from None
    shown = result if isinstance(result, str) else text
    if len(shown.encode()) > max_bytes:
        raise ValueError(f"result: {len(shown.encode())} bytes, over the tool's limit of {max_bytes}")
    return text


def build_inbox_ack_id(entry_id: str) -> str:
    """The MINID that trims an inbox up to and including `entry_id` (the next possible id)."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def build_turn_summary(turn_id: str, outcome: TurnOutcome) -> dict[str, Any]:
    """The `turn_finished` event's data: how the turn ended, without its messages."""
    return {
        "turn_id": turn_id,
        "status": outcome.status,
        "stop_reason": outcome.stop_reason,
        "limit_reached": outcome.limit_reached,
        "llm_calls": outcome.llm_calls,
        "tool_executions": outcome.tool_executions,
        "usage": outcome.usage.model_dump(mode="json"),
    }


def now_s() -> float:
    """Wall-clock epoch seconds: what every timestamp in the store is."""
    return time.time()


# --- parsers (pure) --------------------------------------------------------------------------------------


def text(value: Any) -> str:
    """A Redis reply as str, whether or not the client decodes responses (as a decoding client does, with
    `surrogateescape`: a compressed record stays its bytes, `workers.packing`)."""
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def parse_fields(fields: Mapping[Any, Any]) -> dict[str, str]:
    """A stream entry's field map with str keys and values."""
    return {text(k): text(v) for k, v in fields.items()}


def parse_status(value: bytes | str | None) -> TurnStatus | None:
    """A stored status, or None when the turn is unknown."""
    return None if value is None else TurnStatus(text(value))


def parse_outcome(value: bytes | str | None) -> TurnOutcome | None:
    """A stored `TurnOutcome`, or None."""
    return None if value is None else TurnOutcome.model_validate_json(value, context=STORED)


def dump_request(request: TurnRequest) -> str:
    """The stored JSON of a request, its fields at their defaults left out, at the top and in `limits` and
    `model_settings`: a request that uses no newer field stays readable by an older orchestrator during a
    rolling deploy (releases before `workers.records` refuse fields they do not know there), and is smaller.
    Other nested values are kept whole (a message's `role` is its discriminator)."""
    dumped = request.model_dump(mode="json")
    defaults = TurnRequest().model_dump(mode="json")
    for name in ("limits", "model_settings"):
        dumped[name] = {k: v for k, v in dumped[name].items() if v != defaults[name][k]}
        defaults[name] = {}
    return json.dumps({k: v for k, v in dumped.items() if k not in defaults or v != defaults[k]})


def parse_request(value: bytes | str | None) -> TurnRequest | None:
    """A stored `TurnRequest`, or None; fields a newer release added are ignored (`workers.records`)."""
    return None if value is None else TurnRequest.model_validate_json(value, context=STORED)


def parse_tool_outcome(value: bytes | str | None) -> ToolOutcome | None:
    """A stored tool `ToolOutcome` envelope, or None."""
    return None if value is None else read_tool_outcome(value)


def parse_control(entry_id: bytes | str, fields: Mapping[Any, Any]) -> ControlRequest:
    """One entry of a turn's control stream; one this release cannot read (a kind a newer release added, a
    malformed entry) is kind `unreadable`: its reader moves past it, never fails on it."""
    try:
        return _parse_control(entry_id, fields)
    except (KeyError, ValueError):
        return ControlRequest(id=text(entry_id), kind="unreadable", at=0.0)


def _parse_control(entry_id: bytes | str, fields: Mapping[Any, Any]) -> ControlRequest:
    decoded = parse_fields(fields)
    approved = decoded.get("approved", "")
    arguments = decoded.get("arguments") or ""
    if decoded.get("result"):
        json.loads(decoded["result"])  # a result that is not JSON makes the entry unreadable, here
    return ControlRequest.model_validate(
        {
            "id": text(entry_id),
            "kind": decoded["kind"],
            "call_id": decoded.get("call") or None,
            "approved": None if approved == "" else approved == "1",
            "at": float(decoded.get("at", "0")),
            "arguments": json.loads(arguments) if arguments else None,
            "reason": decoded.get("reason") or None,
            "decided_by": decoded.get("by") or None,
            "result": decoded.get("result") or None,
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


@dataclass(frozen=True)
class ClaimedTurn:
    """A turn `claim.lua` leased, with the request adopting it starts from (None if missing) and whether it
    has a saved state (then adopting reads that, and the request with it). `unreadable` says why a stored
    request could not be read (a release this one cannot read wrote it): the turn is left to another."""

    turn_id: str
    request: TurnRequest | None
    has_state: bool
    unreadable: str | None = None


class ClaimAgain:
    """The type of `CLAIM_AGAIN`."""


# `claim.lua` passed over many ids that ended or are leased, and stopped short: claim again at once.
CLAIM_AGAIN = ClaimAgain()


def parse_claim(reply: Any) -> ClaimedTurn | ClaimAgain | None:
    """`claim.lua`'s reply: None when nothing was claimable, `CLAIM_AGAIN` when it stopped short. A request
    that does not parse is reported in the claim (`unreadable`), never raised: the claim loop must go on, and
    the lease it holds be released."""
    if not isinstance(reply, list):
        return CLAIM_AGAIN if int(reply or 0) == 2 else None
    _, raw_id, raw, has_state = reply
    turn_id = text(raw_id)
    try:
        request = parse_request(raw or None)
    except ValueError as exc:
        problem = f"its request does not parse: {exc}"
        return ClaimedTurn(turn_id, None, bool(int(has_state)), unreadable=problem)
    return ClaimedTurn(turn_id, request, bool(int(has_state)))
