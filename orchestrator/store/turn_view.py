"""What a turn looks like to a reader (`Client.get`, `GET /v1/turns/{id}`, `toolloop show`): pure, no I/O.

`build_turn_view` takes the four values one MGET of `view_keys` returns. Before the turn ends, its
transcript and the calls waiting for approval come from the machine's persisted state
(`orchestrator.machine.state`); once it ends, from its outcome.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter

from orchestrator.machine.state import load_state
from orchestrator.model import Message, TurnOutcome, TurnRequest, TurnStatus, UserMessage
from orchestrator.store.codec import parse_outcome, parse_request, parse_status
from workers import keys
from workers.contract import redact

_MESSAGES = TypeAdapter(list[Message])


class PendingApproval(BaseModel):
    """A tool call waiting for a person to approve or deny it (SPEC §5.8), as a page shows it."""

    call_id: str
    tool: str
    # Redacted with `workers.contract.redact`: whoever renders the buttons never sees a secret.
    arguments: dict[str, Any] = Field(default_factory=dict)


class TurnView(BaseModel):
    """What `Client.get` returns: status, request, the transcript so far, and the outcome once ended.

    `pending_approvals` lists the calls a waiting turn needs an answer for, so a page can render its
    approve/deny buttons from one GET, without following the events stream.
    """

    id: str
    status: TurnStatus
    request: TurnRequest
    messages: list[Message] = Field(default_factory=list)
    outcome: TurnOutcome | None = None
    pending_approvals: list[PendingApproval] = Field(default_factory=list)


def build_initial_messages(request: TurnRequest) -> list[Message]:
    """The transcript of a turn nobody has started yet: its messages, then its prompt as a user message."""
    messages: list[Message] = list(request.messages)
    if request.prompt:
        messages.append(UserMessage(content=request.prompt))
    return messages


def parse_state_messages(state_json: bytes | str | None) -> list[Message] | None:
    """The history inside the machine's serialised state, if it has one (`history` or `messages`).

    The state's format belongs to the state machine; this reads only the history list, and tolerates any
    other shape by returning None, so a view never fails because the state grew a field.
    """
    if state_json is None:
        return None
    try:
        decoded = json.loads(state_json)
    except ValueError:
        return None
    if not isinstance(decoded, dict):
        return None
    for field in ("history", "messages"):
        if isinstance(decoded.get(field), list):
            try:
                return _MESSAGES.validate_python(decoded[field])
            except ValueError:
                return None
    return None


def parse_pending_approvals(state_json: bytes | str | None) -> list[PendingApproval]:
    """The calls of the persisted machine state still waiting for approval, in call order, redacted.

    A call waits while the machine marks it so and has neither its outcome nor a decided one (a denial
    or a stop already on its way). A state this code cannot read gives [], as in `parse_state_messages`:
    a view never fails because of the state.
    """
    if state_json is None:
        return []
    try:
        state = load_state(state_json)
    except ValueError:  # StateVersionError, bad JSON and pydantic's ValidationError are all ValueErrors
        return []
    if state.current is None:
        return []
    return [
        PendingApproval(call_id=call.call_id, tool=call.tool, arguments=redact(call.arguments))
        for call in state.current.calls
        if call.waiting_approval and call.requested is None and call.outcome is None
    ]


def build_turn_view(
    turn_id: str,
    request_raw: bytes | str | None,
    status_raw: bytes | str | None,
    state_raw: bytes | str | None,
    outcome_raw: bytes | str | None,
) -> TurnView | None:
    """A `TurnView` from the four stored values, or None when the turn is unknown (or expired)."""
    request = parse_request(request_raw)
    status = parse_status(status_raw)
    if request is None or status is None:
        return None
    outcome = parse_outcome(outcome_raw)
    if outcome is not None:
        return TurnView(
            id=turn_id, status=status, request=request, messages=list(outcome.messages), outcome=outcome
        )
    return TurnView(
        id=turn_id,
        status=status,
        request=request,
        messages=parse_state_messages(state_raw) or build_initial_messages(request),
        pending_approvals=parse_pending_approvals(state_raw),
    )


def view_keys(turn_id: str) -> list[str]:
    """The keys `build_turn_view` reads, in its argument order (one MGET)."""
    return [
        keys.turn_request(turn_id),
        keys.turn_status(turn_id),
        keys.turn_state(turn_id),
        keys.turn_outcome(turn_id),
    ]
