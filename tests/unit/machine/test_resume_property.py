"""Resuming after any step reaches the same end as not stopping at all.

One turn is run twice from the same list of random choices. The plain run never stops. The other, at a
chosen step, loses its orchestrator: the state is serialised, everything the old owner held in memory is
dropped (pending outcome writes, timers, the model call in flight), a new owner loads the copy, performs what
`machine.resume` returns and reads the outcomes written while nobody owned the turn — then both runs go on
with the same choices. Both must end in the very same state.

For both runs to face the same choices, what can happen next is derived from what survives a crash: the
machine's state, Celery's tasks and the outcome store (first writer wins). The simulated runtime fires a
timer as soon as it is due; races between a due timer and other events are the other property test's job.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.machine import resume
from orchestrator.machine.events import (
    ApprovalGiven,
    ArmTimer,
    AwaitApproval,
    CallModel,
    CancelRequested,
    CancelTimer,
    Command,
    DispatchTools,
    Event,
    Finish,
    ModelFailed,
    ModelResponded,
    TimerFired,
    ToolFinished,
    ToolStarted,
    WriteOutcomes,
)
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import CallState, TurnState, dump_entries, dump_state, load_state
from orchestrator.model import Limits, ProviderError, ToolCall, Turn
from tests.unit.machine.harness import Driver, answer, calls, ok
from tests.unit.machine.invariants import check_state
from workers.contract import FailureKind, ToolOutcome, build_failure

pytestmark = pytest.mark.timeout(120)

TOOL_POOL = [
    ("add", {"a": 1, "b": 2}),
    ("add", {"a": 1}),
    ("slow", {}),
    ("fetch", {"url": "u"}),
    ("delete", {"id": 1}),
    ("nope", {}),
]


class Choices:
    """Random choices replayed identically by both runs; past the end, always the first option."""

    def __init__(self, values: list[int]) -> None:
        self.values = values
        self.position = 0

    def pick(self, count: int) -> int:
        assert count > 0
        if self.position >= len(self.values):
            return 0
        value = self.values[self.position]
        self.position += 1
        return value % count


@dataclass
class Sim:
    """One run: the machine (through the checking driver), Celery and Redis, and the owner's memory."""

    driver: Driver
    choices: Choices
    now: float
    # Survives a crash: tasks sent to Celery (call id -> attempt) and the first-writer-wins outcome store.
    tasks: dict[str, int] = field(default_factory=dict)
    store: dict[str, ToolOutcome] = field(default_factory=dict)
    # Dies with the owner: outcome writes not yet performed, its timer heap, the model requests it made.
    writes: dict[str, ToolOutcome] = field(default_factory=dict)
    timers: dict[str, float] = field(default_factory=dict)
    model_calls: dict[int, CallModel] = field(default_factory=dict)
    # Events fed by actions, for duplicates; the model rounds answered, for fresh call ids.
    fed: list[Event] = field(default_factory=list)
    rounds: int = 0

    @property
    def state(self) -> TurnState:
        return self.driver.state

    # --- the runtime ---------------------------------------------------------------------------------

    def absorb(self, commands: list[Command]) -> None:
        for command in commands:
            match command:
                case CallModel():
                    self.model_calls[command.llm_call_index] = command
                case DispatchTools():
                    # A task sent again for a call whose outcome is stored is skipped by its worker.
                    self.tasks.update(
                        {d.call_id: d.attempt for d in command.calls if d.call_id not in self.store}
                    )
                case WriteOutcomes():
                    self.writes.update({o.call_id: o for o in command.outcomes})
                case ArmTimer():
                    self.timers[command.timer_id] = command.at
                case CancelTimer():
                    self.timers.pop(command.timer_id, None)
                case Finish():
                    self.timers.clear()
                case _:
                    pass

    def feed(self, event: Event) -> None:
        self.absorb(self.driver.feed(event))
        # The runtime's timer heap and the state always agree on what is armed.
        assert self.timers == self.state.timers
        self.fire_due_timers()

    def fire_due_timers(self) -> None:
        while self.timers and min(self.timers.values()) <= self.now and self.state.outcome is None:
            timer_id = min(self.timers, key=lambda t: (self.timers[t], t))
            del self.timers[timer_id]
            self.feed(TimerFired(timer_id=timer_id, at=self.now))

    def tick(self, seconds: float = 0.5) -> float:
        self.now += seconds
        return self.now

    def store_outcome(self, outcome: ToolOutcome) -> ToolOutcome:
        """The first-writer-wins write; the winner."""
        self.tasks.pop(outcome.call_id, None)
        return self.store.setdefault(outcome.call_id, outcome)

    # --- what can happen next, derived only from what survives a crash ----------------------------------

    def unanswered(self) -> list[CallState]:
        current = self.state.current
        return [c for c in current.calls if not c.finished] if current is not None else []

    def pending_writes(self) -> list[ToolOutcome]:
        """Requested outcomes not yet written, in call order; each is exactly what the state asked for."""
        pending = []
        for call in self.unanswered():
            if call.call_id in self.writes:
                assert self.writes[call.call_id] == call.requested
                pending.append(self.writes[call.call_id])
        return pending

    def waiting(self) -> list[str]:
        return [c.call_id for c in self.unanswered() if c.waiting_approval and c.requested is None]

    def act(self) -> None:
        options: list[str] = []
        if self.state.awaiting_model is not None:
            options += ["respond", "respond", "fail"]
        if self.tasks:
            options += ["start", "finish", "finish"]
        if self.pending_writes():
            options += ["write", "write"]
        if self.waiting():
            options += ["approve"]
        options += ["timer", "dup", "cancel"] if self.timers else ["dup", "cancel"]
        action = options[self.choices.pick(len(options))]
        event = self.build_event(action)
        if event is not None:
            self.fed.append(event)
            self.feed(event)

    def build_event(self, action: str) -> Event | None:
        pick = self.choices.pick
        if action == "respond":
            return ModelResponded(
                turn=self.model_turn(), at=self.tick(), llm_call_index=self.state.awaiting_model
            )
        if action == "fail":
            retryable = pick(2) == 1
            error = ProviderError(
                provider="openai_chat", status=503 if retryable else 400, message="x", retryable=retryable
            )
            return ModelFailed(error=error, at=self.tick(), llm_call_index=self.state.awaiting_model)
        if action == "start":
            call_id = sorted(self.tasks)[pick(len(self.tasks))]
            return ToolStarted(call_id=call_id, attempt=self.tasks[call_id], worker="w", at=self.tick())
        if action == "finish":
            call_id = sorted(self.tasks)[pick(len(self.tasks))]
            result = (
                ok(call_id, "tool", "fine")
                if pick(2) == 0
                else build_failure((call_id, "tool", "turn1"), FailureKind.EXECUTION_ERROR, "boom")
            )
            return ToolFinished(outcome=self.store_outcome(result), at=self.tick())
        if action == "write":
            pending = self.pending_writes()
            outcome = pending[pick(len(pending))]
            del self.writes[outcome.call_id]
            return ToolFinished(outcome=self.store_outcome(outcome), at=self.tick(0.01))
        if action == "approve":
            waiting = self.waiting()
            return ApprovalGiven(call_id=waiting[pick(len(waiting))], approved=pick(3) > 0, at=self.tick())
        if action == "timer":
            self.now = max(self.now, min(self.timers.values()))
            self.fire_due_timers()
            return None
        if action == "cancel":
            return CancelRequested(at=self.tick()) if pick(6) == 0 else None
        return self.fed[pick(len(self.fed))] if self.fed else None

    def model_turn(self) -> Turn:
        kind = ["calls", "calls", "calls", "answer", "blank", "length"][self.choices.pick(6)]
        if kind == "calls":
            self.rounds += 1
            picks = [TOOL_POOL[self.choices.pick(len(TOOL_POOL))] for _ in range(1 + self.choices.pick(3))]
            return calls(
                *[ToolCall(id=f"c{self.rounds}_{i}", name=n, arguments=a) for i, (n, a) in enumerate(picks)]
            )
        if kind == "answer":
            return answer("done")
        return answer("", finish_reason="length" if kind == "length" else "stop")

    # --- the ownerless window and the crash -------------------------------------------------------------

    def window(self) -> list[str]:
        """While nobody owns the turn: some tasks finish, some writes the old owner issued land.

        Returns the call ids of the current round whose outcome is now in the store unseen, in call order.
        """
        for call_id in sorted(self.tasks):
            if self.choices.pick(2) == 1:
                self.store_outcome(ok(call_id, "tool", "done meanwhile"))
        for outcome in self.pending_writes():
            if self.choices.pick(2) == 1:
                del self.writes[outcome.call_id]
                self.store_outcome(outcome)
        return [c.call_id for c in self.unanswered() if c.call_id in self.store]

    def catch_up(self, landed: list[str]) -> None:
        for call_id in landed:
            self.feed(ToolFinished(outcome=self.store[call_id], at=self.now))

    def crash_and_resume(self) -> None:
        """The owner dies after its last persisted step; a new one resumes the serialised copy."""
        before = self.state
        in_flight = self.model_calls.get(before.awaiting_model) if before.awaiting_model is not None else None
        self.writes, self.timers, self.model_calls = {}, {}, {}
        state, commands = resume(
            load_state(dump_state(before), dump_entries(before.history), dump_log(before)), self.now
        )
        assert state == before
        check_state(state, commands)
        self.absorb(commands)
        if before.outcome is not None:
            assert commands == [Finish(outcome=before.outcome)]
            return
        assert self.timers == before.timers
        # The model call in flight is the very same request again; nothing counted anew.
        assert list(self.model_calls.values()) == ([in_flight] if in_flight is not None else [])
        # Sent again: only calls dispatched before, with no recorded start, as the same attempt.
        again = [d for c in commands if isinstance(c, DispatchTools) for d in c.calls]
        unconfirmed = {
            c.call_id: c for c in self.unanswered() if c.started_at is None and c.requested is None
        }
        for dispatch in again:
            call = unconfirmed[dispatch.call_id]
            assert (dispatch.task_id, dispatch.attempt) == (call.task_id, call.attempt) and call.attempt > 0
        assert {d.call_id for d in again} == {i for i, c in unconfirmed.items() if c.attempt > 0} or (
            self.now >= before.deadline_at and not again
        )
        awaited = [i for c in commands if isinstance(c, AwaitApproval) for i in c.call_ids]
        assert awaited == self.waiting()

    def drain(self) -> None:
        """No more surprises: writes land, tasks succeed, people approve, the model answers."""
        for _ in range(300):
            if self.state.outcome is not None:
                return
            pending, live = self.pending_writes(), [c for c in self.unanswered() if c.call_id in self.tasks]
            if pending:
                del self.writes[pending[0].call_id]
                self.feed(ToolFinished(outcome=self.store_outcome(pending[0]), at=self.tick(0.01)))
            elif live:
                self.feed(ToolFinished(outcome=self.store_outcome(ok(live[0].call_id, "t")), at=self.tick()))
            elif self.waiting():
                self.feed(ApprovalGiven(call_id=self.waiting()[0], approved=True, at=self.tick()))
            elif self.state.awaiting_model is not None:
                index = self.state.awaiting_model
                self.feed(ModelResponded(turn=answer("done"), at=self.tick(), llm_call_index=index))
            elif self.timers:
                self.now = max(self.now, min(self.timers.values()))
                self.fire_due_timers()
            else:
                raise AssertionError("the turn is stuck: nothing in flight and no outcome")
        raise AssertionError("the turn did not end")


def run(
    limits: Limits, values: list[int], steps: int, window_after: int, *, crash: bool
) -> tuple[TurnState, int]:
    """Play `steps` random actions, then drain. After `window_after` actions comes the ownerless window:
    with `crash`, the owner is lost and the turn resumed; without, the owner lives on and sees each outcome
    that came meanwhile, in the same order as a new owner reads them. Returns the end state and how many
    random actions were played before the turn ended."""
    driver = Driver(limits=limits)
    sim = Sim(driver=driver, choices=Choices(values), now=driver.state.started_at)
    sim.absorb(driver.last)
    taken = 0
    for done in range(steps + 1):
        if done == window_after:
            landed = sim.window()
            if crash:
                sim.crash_and_resume()
            sim.catch_up(landed)
        if done < steps and sim.state.outcome is None:
            sim.act()
            taken += 1
    sim.drain()
    return sim.state, taken


LIMITS = st.builds(
    Limits,
    max_llm_calls=st.integers(1, 5),
    max_tool_executions=st.integers(0, 5),
    max_tool_rounds=st.none() | st.integers(1, 3),
    stop_on_tool_failure=st.booleans(),
    deadline_s=st.sampled_from([4.0, 30.0, 300.0]),
    max_model_retries=st.integers(0, 2),
)


@settings(max_examples=int(os.environ.get("MACHINE_EXAMPLES", "300")), deadline=None)
@given(
    limits=LIMITS,
    values=st.lists(st.integers(0, 1 << 16), min_size=10, max_size=120),
    steps=st.integers(0, 25),
)
def test_resuming_after_any_step_reaches_the_same_end(limits: Limits, values: list[int], steps: int) -> None:
    _, taken = run(limits, values, steps, -1, crash=False)
    for window_after in range(taken + 1):
        plain, _ = run(limits, values, steps, window_after, crash=False)
        resumed, _ = run(limits, values, steps, window_after, crash=True)
        assert plain.outcome is not None
        assert resumed == plain, f"resuming after action {window_after} changed the end"
