"""The loop of one turn as a pure, resumable state machine (SPEC §5): `(state, event) -> (state, commands)`.

`start` creates a turn's state and its first commands; `step` applies one event. Neither does I/O, reads a
clock or draws a random number: time comes in on events, ids derive from the turn id and counters. The
runtime performs the commands (`orchestrator.events`), persists `dump_state` after every step, and feeds
back what happened. Any event may arrive twice or late; it then changes nothing but the audit record.

The rules live in three modules: `machine_model` (model calls, errors, empty answers, tool choice),
`machine_tools` (a round of tool calls: validation, limits, dispatch, approvals, lost work, outcomes) and
`machine_stop` (the one stop path and the terminal shapes). After each event `_settle` moves the turn on:
a round whose calls are all answered enters the history, then the turn finishes or calls the model again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import assert_never

from orchestrator.events import (
    ApprovalGiven,
    ArmTimer,
    CancelRequested,
    Command,
    Event,
    ModelFailed,
    ModelResponded,
    TimerFired,
    ToolFinished,
    ToolStarted,
)
from orchestrator.machine_common import Policy, Step, parse_lost_timer_id
from orchestrator.machine_model import call_model_or_stop, on_model_failed, on_model_responded
from orchestrator.machine_stop import begin_stop, finish_turn
from orchestrator.machine_tools import (
    complete_round,
    on_approval,
    on_lost_timer,
    on_tool_finished,
    on_tool_started,
    record_late,
)
from orchestrator.model import Message, TurnRequest, TurnStatus, UserMessage
from orchestrator.state import DEADLINE_TIMER, MODEL_RETRY_TIMER_PREFIX, TurnState
from orchestrator.validation import offered_tools
from workers.contract import ToolSpec

__all__ = ["Policy", "start", "step"]


def start(
    turn_id: str,
    request: TurnRequest,
    *,
    model: str,
    catalogue: Mapping[str, ToolSpec],
    at: float,
    lost_grace_s: float = 5.0,
    prior_history: Sequence[Message] = (),
) -> tuple[TurnState, list[Command]]:
    """A new turn: its state and first commands (arm the deadline, call the model).

    `model` is the resolved `provider:model` (see `view.resolve_model`); `catalogue` the live tool catalogue,
    snapshotted into the state; `prior_history` the stored history of the conversation the turn continues.
    """
    history: list[Message] = [*prior_history, *request.messages]
    if request.prompt is not None:
        history.append(UserMessage(content=request.prompt))
    offered = offered_tools(catalogue, request.tools)
    state = TurnState(
        turn_id=turn_id,
        model=model,
        limits=request.limits,
        context=dict(request.context),
        tools_allowed=None if request.tools is None else list(request.tools),
        tool_choice=request.tool_choice,
        offered=offered,
        catalogue_names=sorted(catalogue),
        history=history,
        status=TurnStatus.RUNNING,
        started_at=at,
        deadline_at=at + request.limits.deadline_s,
        lost_grace_s=lost_grace_s,
        timers={DEADLINE_TIMER: at + request.limits.deadline_s},
    )
    draft = Step(state)
    draft.emit("turn_started", model=model, tools=sorted(offered), deadline_at=state.deadline_at)
    draft.commands.append(ArmTimer(timer_id=DEADLINE_TIMER, at=state.deadline_at))
    _settle(draft, at)
    draft.flush()
    return draft.state, draft.commands


def step(state: TurnState, event: Event, *, policy: Policy | None = None) -> tuple[TurnState, list[Command]]:
    """Apply one event; the new state and the commands for the runtime, in order.

    `policy` is the stop-policy hook (SPEC §5.4), consulted before each dispatch; pass the same one on every
    step of a turn (a callable cannot be persisted with the state).
    """
    draft = Step(state)
    if state.terminal:
        if isinstance(event, ToolFinished):
            record_late(draft, event.outcome, event.at)
        return draft.state, draft.commands
    match event:
        case ModelResponded():
            on_model_responded(draft, event, policy)
        case ModelFailed():
            on_model_failed(draft, event)
        case ToolStarted():
            on_tool_started(draft, event)
        case ToolFinished():
            on_tool_finished(draft, event)
        case TimerFired():
            _on_timer(draft, event)
        case ApprovalGiven():
            on_approval(draft, event)
        case CancelRequested():
            begin_stop(draft, "cancelled", event.at, detail=event.reason)
        case _:
            assert_never(event)
    _settle(draft, event.at)
    draft.flush()
    return draft.state, draft.commands


def _on_timer(draft: Step, event: TimerFired) -> None:
    timer_id = event.timer_id
    if timer_id not in draft.state.timers:
        return  # cancelled, replaced or already handled
    draft.forget_timer(timer_id)
    if timer_id == DEADLINE_TIMER:
        begin_stop(draft, "deadline", event.at)
        return
    lost = parse_lost_timer_id(timer_id)
    if lost is not None:
        on_lost_timer(draft, lost[0], lost[1], event.at)
    # A model retry timer needs nothing here: with it gone, _settle calls the model again.


def _settle(draft: Step, at: float) -> None:
    """Move the turn on as far as it can go without a new event."""
    state = draft.state
    if state.terminal:
        return
    if state.current is not None:
        if not state.current.complete:
            waiting = any(call.waiting_approval for call in state.current.calls)
            draft.update(status=TurnStatus.WAITING if waiting else TurnStatus.RUNNING)
            return
        complete_round(draft)
    if draft.state.awaiting_model is not None or _retry_pending(draft.state):
        return
    if draft.state.stop is None:
        call_model_or_stop(draft, at)
    if draft.state.stop is not None and draft.state.current is None:
        finish_turn(draft, at)


def _retry_pending(state: TurnState) -> bool:
    return any(timer_id.startswith(MODEL_RETRY_TIMER_PREFIX) for timer_id in state.timers)
