"""The draft one step builds: the next state, changed field by typed field, and the commands it emits.

`Draft.update` takes `TurnChanges` keywords, so mypy refuses a misspelt field or a value of the wrong type.
The copy is `model_copy` without validation: every value set is built from typed values already, and the
machine steps thousands of times a second. Revocations, dispatches and outcome writes are batched into one
command each per step (`flush`).
"""

from __future__ import annotations

from typing import Any, Unpack

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
from orchestrator.machine.state import CallState, RoundState, TurnChanges, TurnState, wait_timer_id
from workers.contract import FailureKind, ToolOutcome, build_failure


class Draft:
    """The state being built by one step, and the commands it emits, in order."""

    __slots__ = ("commands", "dispatches", "revokes", "state", "writes")

    def __init__(self, state: TurnState) -> None:
        self.state = state
        self.commands: list[Command] = []
        self.revokes: list[str] = []
        self.writes: list[ToolOutcome] = []
        self.dispatches: list[Dispatch] = []

    def update(self, **changes: Unpack[TurnChanges]) -> None:
        """Set these fields of the state (typed by `TurnChanges`, not validated)."""
        self.state = self.state.model_copy(update=changes)

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

    def emit(self, event_name: str, **data: Any) -> None:
        """Publish a turn event; `data` must be JSON-ready and redacted."""
        self.commands.append(Emit(event_name=event_name, data={"turn_id": self.state.turn_id, **data}))

    def arm(self, timer_id: str, at: float) -> None:
        """Arm (or re-arm) a timer, saved with the state so that a new owner arms it again."""
        self.update(timers={**self.state.timers, timer_id: at})
        self.commands.append(ArmTimer(timer_id=timer_id, at=at))

    def disarm(self, timer_id: str) -> None:
        """Cancel a timer, if armed."""
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
        """Put `call` in its place in the current round."""
        current = self.state.current
        assert current is not None, "a call changes only within its round"
        calls = list(current.calls)
        calls[call.index] = call
        self.update(current=current.replace(calls=calls))

    def request_failure(
        self, call: CallState, kind: FailureKind, message: str, at: float, *, synthetic: bool
    ) -> None:
        """Ask the runtime to write a failure outcome for `call` (validation, denial, a stop's synthetic one).

        The call stays unanswered until the winner of that first-writer-wins write comes back.
        """
        outcome = build_failure(
            (call.call_id, call.tool, self.state.turn_id),
            kind,
            message,
            attempts=call.attempt,
            synthetic=synthetic,
            worker=call.worker,
            finished_at=at,
        )
        self.request_outcome(call, outcome)

    def request_outcome(self, call: CallState, outcome: ToolOutcome) -> None:
        """Ask the runtime to write `outcome` for `call` (a failure, or a client-side tool's result), first
        writer wins: the call stays unanswered until the winner comes back."""
        self.writes.append(outcome)
        self.end_wait(call)
        self.replace_call(call.replace(requested=outcome, waiting_approval=False, wait=None))

    def end_wait(self, call: CallState) -> None:
        """Disarm the timer of a call's wait for a person, if it has one (answered, run, or stopped)."""
        self.disarm(wait_timer_id(call.call_id))


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
        tenant=state.tenant,
        priority=state.priority,
    )


def round_of(state: TurnState) -> RoundState:
    """The current round; a programming error when there is none."""
    assert state.current is not None
    return state.current
