"""What a turn looks like to a reader (`Client.get`, `GET /v1/turns/{id}`, `toolloop show`): pure, no I/O.

`build_turn_view` takes the four values of `view_keys` and the history one of them references, as one call of
`read_history.lua` returns them (`orchestrator.store.history`). Before the turn ends, its transcript and the
calls waiting for approval come from the machine's persisted state (`orchestrator.machine.state`) and its
history list; once it ends, from its outcome.

Everything a view shows is redacted with `workers.contract.redact`: the values of
sensitive keys in the request's context, in the arguments of every tool call (request messages, transcript,
outcome), and in the provider's raw argument strings. `build_shown_outcome` does the same for whoever shows
a bare outcome (`Client.wait`, `toolloop submit --wait`). The stored turn stays whole: tools receive their
context and arguments as submitted and asked for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter

from orchestrator.machine.state import TurnState, load_state
from orchestrator.model import (
    ApprovalDecision,
    AssistantMessage,
    ChildTurn,
    Message,
    ToolCall,
    TurnOutcome,
    TurnRequest,
    TurnStatus,
    UserMessage,
)
from orchestrator.store.codec import parse_request, parse_status, text
from orchestrator.store.history import parse_outcome as parse_stored_outcome
from orchestrator.store.history import read_entries
from workers import keys
from workers.contract import DEFAULT_TENANT, redact

_MESSAGES = TypeAdapter(list[Message])


class PendingApproval(BaseModel):
    """A tool call waiting for a person to approve or deny it (`waiting_for` "approval"), or for the result
    of a client-side tool its caller runs ("client_result"), as a page shows it."""

    call_id: str
    tool: str
    # Redacted with `workers.contract.redact`: whoever renders the buttons never sees a secret.
    arguments: dict[str, Any] = Field(default_factory=dict)
    waiting_for: str = "approval"
    # Since when it waits, and the wait's own deadline (epoch seconds), past which `on_timeout` answers it
    # ("deny" or "approve"); None for a call of a state written before waits had limits.
    since: float | None = None
    wait_deadline: float | None = None
    on_timeout: str | None = None


class WaitingForWorker(BaseModel):
    """A tool call sent while no live worker serves its tool (its only worker restarting, a deploy): it
    waits in its queue for the next worker, until one starts it or the turn's deadline passes."""

    call_id: str
    tool: str
    attempt: int = 1
    # When it was sent to wait (epoch seconds).
    since: float


class ForkLink(BaseModel):
    """A fork made of a turn (`Client.fork`): the fork's turn id, the index of the message it forked at, and
    when it was made (epoch seconds)."""

    turn_id: str
    at: int
    forked_at: float


class TurnView(BaseModel):
    """What `Client.get` returns: status, request, the transcript so far, and the outcome once ended.

    `pending_approvals` lists the calls a waiting turn needs an answer for, so a page can render its
    approve/deny buttons from one GET, without following the events stream, with each wait's own deadline.
    `waiting_for_worker` lists the calls of a running turn that wait in their queue for a worker of their
    tool to come up. `approvals` says how each call that waited was answered, by whom and why.

    `deadline_at` is the turn's running deadline (epoch seconds). Waiting for a person does not count against
    it: while the turn does nothing but wait, its clock is paused (`paused_at`, since when), and when it runs
    again the deadline moves out by the pause — until then it stands `deadline_at - paused_at` seconds after
    the wait's end. Both are None once the turn has ended.
    """

    id: str
    status: TurnStatus
    # Whose turn it is (the request's `tenant`; "default" for a turn stored before tenants existed).
    tenant: str = DEFAULT_TENANT
    request: TurnRequest
    messages: list[Message] = Field(default_factory=list)
    outcome: TurnOutcome | None = None
    pending_approvals: list[PendingApproval] = Field(default_factory=list)
    waiting_for_worker: list[WaitingForWorker] = Field(default_factory=list)
    approvals: list[ApprovalDecision] = Field(default_factory=list)
    deadline_at: float | None = None
    paused_at: float | None = None
    # The child turns its sub-agent calls started (`status` None while one runs); a call one of them waits
    # on for a person is approved through this turn too (`flows.send_approval`).
    children: list[ChildTurn] = Field(default_factory=list)
    # The forks made of this turn, oldest first (`Client.fork`); a fork's own link back is its
    # `request.forked_from`. Read by the clients' `get` beside the view (`orchestrator.store.forks`).
    forks: list[ForkLink] = Field(default_factory=list)


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


def parse_pending_approvals(
    state_json: bytes | str | None, history: Sequence[Any] = (), log: Sequence[Any] = ()
) -> list[PendingApproval]:
    """The calls of the persisted machine state still waiting for approval, in call order, redacted.

    A call waits while the machine marks it so and has neither its outcome nor a decided one (a denial
    or a stop already on its way). A state this code cannot read gives [], as in `parse_state_messages`:
    a view never fails because of the state.
    """
    return build_pending_approvals(_read_state(state_json, history, log))


def _read_state(
    state_json: bytes | str | None, history: Sequence[Any] = (), log: Sequence[Any] = ()
) -> TurnState | None:
    if state_json is None:
        return None
    try:
        return load_state(state_json, read_entries(history), [text(e) for e in log])
    except ValueError:  # StateVersionError, bad JSON and pydantic's ValidationError are all ValueErrors
        return None


def build_pending_approvals(state: TurnState | None) -> list[PendingApproval]:
    """The calls of a machine state waiting for approval (see `parse_pending_approvals`); [] for None."""
    if state is None or state.current is None:
        return []
    return [
        PendingApproval(
            call_id=call.call_id,
            tool=call.tool,
            arguments=redact(call.arguments),
            waiting_for=call.wait.waiting_for if call.wait is not None else "approval",
            since=call.wait.since if call.wait is not None else None,
            wait_deadline=call.wait.deadline_at if call.wait is not None else None,
            on_timeout=call.wait.on_timeout if call.wait is not None else None,
        )
        for call in state.current.calls
        if call.waiting
    ]


def build_waiting_for_worker(state: TurnState | None) -> list[WaitingForWorker]:
    """The calls of a machine state waiting in their queue for a worker, in call order; [] for None."""
    if state is None or state.current is None:
        return []
    return [
        WaitingForWorker(
            call_id=call.call_id, tool=call.tool, attempt=call.attempt, since=call.waiting_for_worker_since
        )
        for call in state.current.calls
        if call.waiting_for_worker_since is not None and call.requested is None and call.outcome is None
    ]


def build_shown_raw_arguments(raw: str | None) -> str | None:
    """A provider's argument string as shown: a JSON object or array redacted and written again compactly.

    Text that is not JSON is kept: it never became arguments (the call was answered `validation`), and
    there is no key in it to find a sensitive value under.
    """
    if raw is None:
        return None
    try:
        decoded = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(decoded, dict | list):
        return raw
    return json.dumps(redact(decoded), ensure_ascii=False, separators=(",", ":"))


def build_shown_call(call: ToolCall) -> ToolCall:
    """A tool call as shown: sensitive values of its arguments (and of its raw argument string) redacted."""
    return call.model_copy(
        update={
            "arguments": redact(call.arguments),
            "raw_arguments": build_shown_raw_arguments(call.raw_arguments),
        }
    )


def build_shown_messages(messages: Sequence[Message]) -> list[Message]:
    """The messages as shown: every assistant message's tool calls through `build_shown_call`."""
    return [
        message.model_copy(update={"tool_calls": [build_shown_call(c) for c in message.tool_calls]})
        if isinstance(message, AssistantMessage) and message.tool_calls
        else message
        for message in messages
    ]


def build_shown_request(request: TurnRequest) -> TurnRequest:
    """The request as shown: its context and its messages' tool-call arguments redacted."""
    return request.model_copy(
        update={"context": redact(request.context), "messages": build_shown_messages(request.messages)}
    )


def build_shown_outcome(outcome: TurnOutcome) -> TurnOutcome:
    """The outcome as shown: the tool-call arguments of its history redacted."""
    return outcome.model_copy(update={"messages": build_shown_messages(outcome.messages)})


def build_turn_view(
    turn_id: str,
    request_raw: bytes | str | None,
    status_raw: bytes | str | None,
    state_raw: bytes | str | None,
    outcome_raw: bytes | str | None,
    *,
    history_raw: Sequence[Any] = (),
    log_raw: Sequence[Any] = (),
) -> TurnView | None:
    """A `TurnView` from the four stored values and the lists the outcome (else the state) references,
    redacted; None when the turn is unknown (or expired)."""
    stored_request = parse_request(request_raw)
    status = parse_status(status_raw)
    if stored_request is None or status is None:
        return None
    request = build_shown_request(stored_request)
    stored_outcome = parse_stored_outcome(outcome_raw, history_raw)
    if stored_outcome is not None:
        outcome = build_shown_outcome(stored_outcome)
        return TurnView(
            id=turn_id,
            status=status,
            tenant=stored_request.tenant,
            request=request,
            messages=list(outcome.messages),
            outcome=outcome,
            approvals=list(outcome.approvals),
        )
    # The state is parsed once; one this code cannot read still gives its history if it has one.
    state = _read_state(state_raw, history_raw, log_raw)
    history = list(state.history) if state is not None else parse_state_messages(state_raw)
    return TurnView(
        id=turn_id,
        status=status,
        tenant=stored_request.tenant,
        request=request,
        messages=build_shown_messages(history or build_initial_messages(stored_request)),
        pending_approvals=build_pending_approvals(state),
        waiting_for_worker=build_waiting_for_worker(state),
        approvals=list(state.approvals) if state is not None else [],
        deadline_at=state.deadline_at if state is not None else None,
        paused_at=state.paused_at if state is not None else None,
        children=list(state.children) if state is not None else [],
    )


def view_keys(turn_id: str) -> list[str]:
    """The keys `build_turn_view` reads, in its argument order (one call of `read_history.lua`)."""
    return [
        keys.turn_request(turn_id),
        keys.turn_status(turn_id),
        keys.turn_state(turn_id),
        keys.turn_outcome(turn_id),
    ]
