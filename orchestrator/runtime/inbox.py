"""Reading an orchestrator's inbox: notifications from workers and clients, turned into machine events (pure).

Every orchestrator blocks on one Redis stream (`keys.inbox(id)`) for all the turns it owns. Three kinds of
entry arrive there:

- `outcome` (turn, call, outcome): the first-writer-wins outcome write of a call succeeded. A small outcome
  comes with it (its JSON, written by the same script: exactly the winner); a large one is read from its key
  (one MGET per batch), so the stream stays small. A lost notification loses nothing: the key is the record.
- `started` (turn, call, attempt, worker, at): a worker began an attempt of a call.
- `control` (turn, control=cancel|approval|client_result, call, approved, id): a client asked to cancel,
  approve, or answered a client-side tool's call; the request itself is read from the turn's control stream,
  which is the record (with an approval's edited arguments and a denial's reason, a client-side tool's result
  or error).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.machine.events import (
    ApprovalGiven,
    CancelRequested,
    ChildTurnFinished,
    ClientResultGiven,
    ToolStarted,
)
from orchestrator.model import ChildReport
from orchestrator.store.codec import ControlRequest
from workers.contract import ToolOutcome, parse_tool_outcome


@dataclass
class InboxBatch:
    """One read of the inbox, sorted by what it takes to turn each entry into events."""

    # turn id -> wire call ids whose outcome was written
    outcomes: dict[str, list[str]] = field(default_factory=dict)
    # wire call id -> the outcome JSON carried by its notification (small outcomes only)
    payloads: dict[str, str] = field(default_factory=dict)
    started: dict[str, list[ToolStarted]] = field(default_factory=dict)
    # turns with new control requests to read from their control stream
    control: set[str] = field(default_factory=set)

    @property
    def turns(self) -> set[str]:
        """Every turn this batch concerns."""
        return set(self.outcomes) | set(self.started) | self.control


def parse_inbox(entries: Sequence[tuple[str, Mapping[str, str]]], *, now: float | None = None) -> InboxBatch:
    """Sort inbox entries by kind; malformed ones (no turn, unknown kind) are skipped, never fatal."""
    batch = InboxBatch()
    at_default = time.time() if now is None else now
    for _entry_id, fields in entries:
        turn_id = fields.get("turn") or ""
        kind = fields.get("kind")
        if not turn_id:
            continue
        call_id = fields.get("call") or ""
        if kind == "outcome" and call_id:
            batch.outcomes.setdefault(turn_id, []).append(call_id)
            if fields.get("outcome"):
                batch.payloads[call_id] = fields["outcome"]
        elif kind == "started" and call_id:
            started = ToolStarted(
                call_id=parse_wire_call_id(turn_id, call_id),
                attempt=_as_int(fields.get("attempt"), 1),
                worker=fields.get("worker") or None,
                at=_as_float(fields.get("at"), at_default),
            )
            batch.started.setdefault(turn_id, []).append(started)
        elif kind == "control":
            batch.control.add(turn_id)
    return batch


def build_control_event(
    request: ControlRequest,
) -> CancelRequested | ApprovalGiven | ClientResultGiven | ChildTurnFinished | None:
    """The machine event of one control request; None for an answer that names no call, and for an entry
    this release cannot read."""
    if request.kind == "unreadable":
        return None
    if request.kind == "cancel":
        return CancelRequested(at=request.at, reason=request.reason)
    if not request.call_id:
        return None
    if request.kind == "child_result":
        if request.result is None:
            return None
        report = ChildReport.model_validate_json(request.result)
        return ChildTurnFinished(
            call_id=request.call_id,
            at=request.at,
            turn_id=report.turn_id,
            status=report.status,
            result=report.result,
            error=report.error,
            usage=report.usage,
        )
    if request.kind == "client_result":
        if request.result is None:
            return ClientResultGiven(call_id=request.call_id, at=request.at, error=request.reason or "error")
        return ClientResultGiven(call_id=request.call_id, at=request.at, result=json.loads(request.result))
    # A denial's reason reaches the model in the call's answer; the machine validates edited arguments.
    return ApprovalGiven(
        call_id=request.call_id,
        approved=bool(request.approved),
        at=request.at,
        reason=request.reason,
        arguments=request.arguments if request.approved else None,
        decided_by=request.decided_by,
    )


def _as_int(raw: str | None, default: int) -> int:
    try:
        return int(raw) if raw else default
    except ValueError:
        return default


def _as_float(raw: str | None, default: float) -> float:
    try:
        return float(raw) if raw else default
    except ValueError:
        return default


# Models number their tool calls per response ("call_r0_0", "toolu_…", or ids we synthesise per turn), so a
# call id is unique within its turn but not across turns. Redis keys (outcome, attempts, running guard) and
# Celery see the call under a turn-scoped id; the machine and the history keep the model's id.
WIRE_CALL_ID_SEPARATOR = "/"


def build_wire_call_id(turn_id: str, call_id: str) -> str:
    """The id a call has in Redis and Celery: unique across turns."""
    return f"{turn_id}{WIRE_CALL_ID_SEPARATOR}{call_id}"


def parse_wire_call_id(turn_id: str, wire_id: str) -> str:
    """The model's call id back from a wire id of `turn_id` (an id without the turn's prefix as is)."""
    prefix = f"{turn_id}{WIRE_CALL_ID_SEPARATOR}"
    return wire_id[len(prefix) :] if wire_id.startswith(prefix) else wire_id


def to_wire_outcome(outcome: ToolOutcome) -> ToolOutcome:
    """An outcome the machine asked for, under its call's wire id (the machine always sets its turn id)."""
    if outcome.turn_id is None:
        return outcome
    return outcome.model_copy(update={"call_id": build_wire_call_id(outcome.turn_id, outcome.call_id)})


def to_local_outcome(outcome: ToolOutcome) -> ToolOutcome:
    """An outcome read from Redis, under the model's call id, as the machine knows the call."""
    if outcome.turn_id is None:
        return outcome
    return outcome.model_copy(update={"call_id": parse_wire_call_id(outcome.turn_id, outcome.call_id)})


def parse_payloads(payloads: Mapping[str, str]) -> dict[str, ToolOutcome]:
    """The outcomes notifications carried, by wire call id; one that does not parse is left out (read from
    its key instead), never fatal."""
    parsed: dict[str, ToolOutcome] = {}
    for call_id, raw in payloads.items():
        try:
            parsed[call_id] = parse_tool_outcome(raw)
        except ValueError:
            continue
    return parsed
