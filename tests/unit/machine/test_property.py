"""Random interleavings of events: the invariants hold after every step and every turn ends.

A small simulated runtime performs the machine's commands with a first-writer-wins outcome store, and
hypothesis chooses what happens next: model answers and failures, tool starts and outcomes in any order,
synthetic writes racing real outcomes, duplicates, late outcomes, timers, approvals and cancels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from orchestrator.model import Limits, ProviderError, ToolCall
from tests.unit.machine.harness import Driver, answer, calls, ok
from workers.contract import FailureKind, ToolOutcome, build_failure

pytestmark = pytest.mark.timeout(120)

TOOL_POOL = [
    ("add", {"a": 1, "b": 2}),
    ("add", {"a": 1}),
    ("slow", {}),
    ("fetch", {"url": "u"}),
    ("delete", {"id": 1}),
    ("nope", {}),
    ("secret", {}),
]


@dataclass
class Runtime:
    """What the runtime would hold: a model call in flight, tasks, the outcome store, timers, approvals."""

    driver: Driver
    now: float
    model_call: int | None = None
    tasks: dict[str, int] = field(default_factory=dict)  # call id -> attempt
    store: dict[str, ToolOutcome] = field(default_factory=dict)  # first writer wins
    writes: list[ToolOutcome] = field(default_factory=list)
    timers: dict[str, float] = field(default_factory=dict)
    waiting: list[str] = field(default_factory=list)
    history: list[Event] = field(default_factory=list)
    rounds: int = 0

    def absorb(self, commands: list[Command]) -> None:
        for command in commands:
            match command:
                case CallModel():
                    self.model_call = command.llm_call_index
                case DispatchTools():
                    self.tasks.update({d.call_id: d.attempt for d in command.calls})
                case WriteOutcomes():
                    self.writes.extend(command.outcomes)
                case ArmTimer():
                    self.timers[command.timer_id] = command.at
                case CancelTimer():
                    self.timers.pop(command.timer_id, None)
                case AwaitApproval():
                    self.waiting.extend(command.call_ids)
                case Finish():
                    self.timers.clear()
                case _:
                    pass

    def feed(self, event: Event) -> None:
        self.history.append(event)
        self.absorb(self.driver.feed(event))

    def tick(self, seconds: float = 0.5) -> float:
        self.now += seconds
        return self.now

    def write(self, outcome: ToolOutcome) -> None:
        """The first-writer-wins write: the winner is fed back, whoever wrote it."""
        winner = self.store.setdefault(outcome.call_id, outcome)
        self.tasks.pop(outcome.call_id, None)
        self.feed(ToolFinished(outcome=winner, at=self.tick(0.01)))
        if winner is not outcome:
            self.feed(ToolFinished(outcome=outcome, at=self.tick(0.01)))  # a late one, delivered anyway


def model_turn(data: st.DataObject, runtime: Runtime) -> ModelResponded:
    kind = data.draw(st.sampled_from(["calls", "calls", "answer", "blank", "length"]))
    if kind == "calls":
        runtime.rounds += 1
        picks = data.draw(st.lists(st.sampled_from(TOOL_POOL), min_size=1, max_size=3))
        same_ids = data.draw(st.booleans())
        tool_calls = [
            ToolCall(id=f"c{0 if same_ids else runtime.rounds}_{i}", name=name, arguments=arguments)
            for i, (name, arguments) in enumerate(picks)
        ]
        turn = calls(*tool_calls)
    elif kind == "answer":
        turn = answer("done")
    else:
        turn = answer("", finish_reason="length" if kind == "length" else "stop")
    return ModelResponded(turn=turn, at=runtime.tick(), llm_call_index=runtime.model_call)


def random_action(data: st.DataObject, runtime: Runtime) -> None:
    options = ["dup", "cancel"]
    if runtime.model_call is not None:
        options += ["respond", "respond", "fail"]
    if runtime.tasks:
        options += ["start", "finish", "finish"]
    if runtime.writes:
        options += ["write", "write"]
    if runtime.timers:
        options += ["timer"]
    if runtime.waiting:
        options += ["approve"]
    action = data.draw(st.sampled_from(options))
    if action == "respond":
        event = model_turn(data, runtime)
        runtime.model_call = None
        runtime.feed(event)
    elif action == "fail":
        retryable = data.draw(st.booleans())
        error = ProviderError(
            provider="openai_chat", status=503 if retryable else 400, message="x", retryable=retryable
        )
        index, runtime.model_call = runtime.model_call, None
        runtime.feed(ModelFailed(error=error, at=runtime.tick(), llm_call_index=index))
    elif action == "start":
        call_id = data.draw(st.sampled_from(sorted(runtime.tasks)))
        runtime.feed(
            ToolStarted(call_id=call_id, attempt=runtime.tasks[call_id], worker="w", at=runtime.tick())
        )
    elif action == "finish":
        call_id = data.draw(st.sampled_from(sorted(runtime.tasks)))
        if data.draw(st.booleans()):
            outcome = ok(call_id, "tool", "fine")
        else:
            outcome = build_failure((call_id, "tool", "turn1"), FailureKind.EXECUTION_ERROR, "boom")
        runtime.write(outcome)
    elif action == "write":
        runtime.write(runtime.writes.pop(data.draw(st.integers(0, len(runtime.writes) - 1))))
    elif action == "timer":
        timer_id = data.draw(st.sampled_from(sorted(runtime.timers)))
        at = runtime.timers.pop(timer_id)
        runtime.now = max(runtime.now, at)
        runtime.feed(TimerFired(timer_id=timer_id, at=runtime.now))
    elif action == "approve":
        call_id = runtime.waiting.pop(0)
        runtime.feed(ApprovalGiven(call_id=call_id, approved=data.draw(st.booleans()), at=runtime.tick()))
    elif action == "cancel":
        if data.draw(st.integers(0, 5)) == 0:
            runtime.feed(CancelRequested(at=runtime.tick()))
    elif runtime.history:
        runtime.feed(data.draw(st.sampled_from(runtime.history)))


def drain(runtime: Runtime) -> None:
    """Let the runtime do its job without surprises until the turn ends."""
    for _ in range(300):
        if runtime.driver.state.outcome is not None:
            return
        if runtime.writes:
            runtime.write(runtime.writes.pop(0))
        elif runtime.tasks:
            runtime.write(ok(sorted(runtime.tasks)[0], "tool", "fine"))
        elif runtime.waiting:
            runtime.feed(ApprovalGiven(call_id=runtime.waiting.pop(0), approved=True, at=runtime.tick()))
        elif runtime.model_call is not None:
            index, runtime.model_call = runtime.model_call, None
            runtime.feed(ModelResponded(turn=answer("done"), at=runtime.tick(), llm_call_index=index))
        elif runtime.timers:
            timer_id, at = min(runtime.timers.items(), key=lambda item: item[1])
            del runtime.timers[timer_id]
            runtime.now = max(runtime.now, at)
            runtime.feed(TimerFired(timer_id=timer_id, at=runtime.now))
        else:
            raise AssertionError("the turn is stuck: nothing in flight and no outcome")
    raise AssertionError("the turn did not end")


LIMITS = st.builds(
    Limits,
    max_llm_calls=st.integers(1, 5),
    max_tool_executions=st.integers(0, 5),
    max_tool_rounds=st.none() | st.integers(1, 3),
    stop_on_tool_failure=st.booleans(),
    deadline_s=st.sampled_from([3.0, 30.0, 300.0]),
    max_model_retries=st.integers(0, 2),
)


@settings(max_examples=int(os.environ.get("MACHINE_EXAMPLES", "150")), deadline=None)
@given(data=st.data(), limits=LIMITS, steps=st.integers(1, 30))
def test_random_interleavings_keep_the_invariants_and_end(
    data: st.DataObject, limits: Limits, steps: int
) -> None:
    driver = Driver(limits=limits)
    runtime = Runtime(driver=driver, now=driver.state.started_at)
    runtime.absorb(driver.last)
    for _ in range(steps):
        if driver.state.outcome is not None:
            break
        random_action(data, runtime)
    drain(runtime)
    outcome = driver.state.outcome
    assert outcome is not None
    STOP_REASONS[outcome.stop_reason or "completed"] = (
        STOP_REASONS.get(outcome.stop_reason or "completed", 0) + 1
    )
    # Every outcome the history shows is the one the store holds (the winner), never a late one.
    for message in outcome.messages:
        if message.role == "tool" and message.tool_call_id in runtime.store:
            assert message.content == runtime.store[message.tool_call_id].content


STOP_REASONS: dict[str, int] = {}
