"""Small pure helpers shared by the state machine's modules: a step's command buffer, timers, calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.machine.events import (
    ArmTimer,
    CancelTimer,
    Command,
    Dispatch,
    DispatchTools,
    Emit,
    Revoke,
    WriteOutcomes,
)
from orchestrator.machine.state import LOST_TIMER_PREFIX, CallState, RoundState, TurnState
from orchestrator.model import ToolCall
from workers.contract import FailureKind, ToolOutcome, build_failure

Policy = Callable[[ToolCall, TurnState], str | None]
"""A pure stop-policy hook (SPEC §5.4): a denial reason for a call before dispatch, or None to allow it."""


class Step:
    """The state being built by one step, and the commands it emits, in order."""

    __slots__ = ("commands", "dispatches", "revokes", "state", "writes")

    def __init__(self, state: TurnState) -> None:
        self.state = state
        self.commands: list[Command] = []
        # Batched into one Revoke and one WriteOutcomes command per step.
        self.revokes: list[str] = []
        self.writes: list[ToolOutcome] = []
        self.dispatches: list[Dispatch] = []

    def flush(self) -> None:
        """Emit the batched revocations, dispatches and outcome writes, in that order."""
        if self.revokes:
            self.commands.append(Revoke(task_ids=self.revokes))
            self.revokes = []
        if self.dispatches:
            self.commands.append(DispatchTools(calls=self.dispatches))
            self.dispatches = []
        if self.writes:
            self.commands.append(WriteOutcomes(outcomes=self.writes))
            self.writes = []

    def request_outcome(self, call: CallState, outcome: ToolOutcome) -> CallState:
        """Ask the runtime to write `outcome` for `call`; it stays unanswered until the winner comes back."""
        assert outcome.failure_kind is not None
        updated = call.model_copy(update={"requested": outcome, "waiting_approval": False})
        self.writes.append(outcome)
        self.replace_call(updated)
        return updated

    def update(self, **changes: Any) -> None:
        # model_copy skips validation: every value set here is built from typed values already.
        self.state = self.state.model_copy(update=changes)

    def emit(self, event_name: str, **data: Any) -> None:
        self.commands.append(Emit(event_name=event_name, data={"turn_id": self.state.turn_id, **data}))

    def arm(self, timer_id: str, at: float) -> None:
        self.update(timers={**self.state.timers, timer_id: at})
        self.commands.append(ArmTimer(timer_id=timer_id, at=at))

    def disarm(self, timer_id: str) -> None:
        if timer_id in self.state.timers:
            timers = dict(self.state.timers)
            del timers[timer_id]
            self.update(timers=timers)
            self.commands.append(CancelTimer(timer_id=timer_id))

    def forget_timer(self, timer_id: str) -> None:
        """Drop a timer that fired (no CancelTimer: the runtime already consumed it)."""
        if timer_id in self.state.timers:
            timers = dict(self.state.timers)
            del timers[timer_id]
            self.update(timers=timers)

    def replace_call(self, call: CallState) -> None:
        current = self.state.current
        assert current is not None, "a call changes only within its round"
        calls = list(current.calls)
        calls[call.index] = call
        self.update(current=current.model_copy(update={"calls": calls}))


def lost_timer_id(call_id: str, attempt: int) -> str:
    """The timer that fires when attempt `attempt` of a call has run past its hard limit plus grace."""
    return f"{LOST_TIMER_PREFIX}{call_id}:{attempt}"


def parse_lost_timer_id(timer_id: str) -> tuple[str, int] | None:
    """(call id, attempt) of a lost-call timer id; None for other timers."""
    if not timer_id.startswith(LOST_TIMER_PREFIX):
        return None
    call_id, _, attempt = timer_id[len(LOST_TIMER_PREFIX) :].rpartition(":")
    return (call_id, int(attempt)) if attempt.isdigit() and call_id else None


def build_task_id(state: TurnState, call: CallState, attempt: int) -> str:
    """A Celery task id derived from the turn, the call's position and the attempt: deterministic."""
    return f"{state.turn_id}:r{state.rounds}:c{call.index}:a{attempt}"


def build_dispatch(state: TurnState, call: CallState) -> Dispatch:
    """The task that sends the call's current attempt (its `task_id` set by dispatching it)."""
    assert call.task_id is not None, "only a dispatched call has a task"
    return Dispatch(
        call_id=call.call_id,
        tool=call.tool,
        arguments=call.arguments,
        attempt=call.attempt,
        task_id=call.task_id,
        deadline_at=state.deadline_at,
        context=state.context,
    )


def build_call_failure(
    state: TurnState,
    call: CallState,
    kind: FailureKind,
    message: str,
    at: float,
    *,
    synthetic: bool,
) -> ToolOutcome:
    """An outcome the orchestrator writes for a call (validation, denial, synthetic stop outcomes)."""
    return build_failure(
        (call.call_id, call.tool, state.turn_id),
        kind,
        message,
        attempts=call.attempt,
        synthetic=synthetic,
        worker=call.worker,
        finished_at=at,
    )


def round_of(state: TurnState) -> RoundState:
    """The current round; a programming error when there is none."""
    assert state.current is not None
    return state.current
