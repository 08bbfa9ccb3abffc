"""A driver for machine tests: applies events, checks invariants and the persistence round trip each step."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from orchestrator.context.budget import ContextBudget
from orchestrator.machine import Policy, start, step
from orchestrator.machine.events import (
    CallModel,
    Command,
    Dispatch,
    DispatchTools,
    Emit,
    Event,
    Finish,
    ModelResponded,
    ToolFinished,
    WriteOutcomes,
)
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import AgentRun, dump_entries, dump_state, load_state
from orchestrator.model import Limits, Message, ToolCall, Turn, TurnOutcome, TurnRequest, Usage
from tests.unit.machine.invariants import check_state
from workers.contract import ToolOutcome, ToolSpec

C = TypeVar("C")

CATALOGUE: dict[str, ToolSpec] = {
    "add": ToolSpec(
        name="add",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        time_limit_s=10.0,
        soft_time_limit_s=5.0,
    ),
    "fetch": ToolSpec(name="fetch", time_limit_s=20.0, soft_time_limit_s=10.0, retries=1),
    "slow": ToolSpec(name="slow", time_limit_s=30.0, soft_time_limit_s=20.0),
    "delete": ToolSpec(name="delete", requires_confirmation=True),
    "tiny": ToolSpec(name="tiny", max_args_bytes=10),
    "secret": ToolSpec(name="secret", sensitive=True),
}


def calls(*specs: tuple[str, dict[str, Any]] | ToolCall, prefix: str = "call") -> Turn:
    """A tool-calls response; a (name, arguments) pair gets the id `<prefix>_<n>`."""
    tool_calls = [
        spec if isinstance(spec, ToolCall) else ToolCall(id=f"{prefix}_{i}", name=spec[0], arguments=spec[1])
        for i, spec in enumerate(specs)
    ]
    return Turn(
        type="tool_calls",
        tool_calls=tool_calls,
        usage=Usage(input_tokens=10, output_tokens=5, total_tokens=15),
        provider="openai_chat",
        model="m",
        finish_reason="tool_calls",
    )


def answer(text: str | None, finish_reason: str = "stop") -> Turn:
    return Turn.model_validate(
        {
            "type": "final_answer",
            "text": text,
            "usage": {"input_tokens": 20, "output_tokens": 7, "total_tokens": 27},
            "provider": "openai_chat",
            "model": "m",
            "finish_reason": finish_reason,
        }
    )


def ok(call_id: str, tool: str, content: str = "ok", **extra: Any) -> ToolOutcome:
    return ToolOutcome(call_id=call_id, tool=tool, ok=True, result=content, content=content, **extra)


def of_type(commands: Iterable[Command], kind: type[C]) -> list[C]:
    return [c for c in commands if isinstance(c, kind)]


class Driver:
    """One turn under test. Every step is also replayed from a serialised copy and must agree."""

    def __init__(
        self,
        *,
        prompt: str = "do it",
        limits: Limits | None = None,
        tools: list[str] | None = None,
        tool_choice: str | None = None,
        model: str | list[str] = "openai:m",
        policy: Policy | None = None,
        catalogue: dict[str, ToolSpec] | None = None,
        prior_history: Sequence[Message] = (),
        context: dict[str, Any] | None = None,
        at: float = 1000.0,
        unpriced: Sequence[str] = (),
        refused: Sequence[str] = (),
        context_budget: ContextBudget | None = None,
        agents: Mapping[str, AgentRun] | None = None,
        max_agent_depth: int = 3,
        **request_fields: Any,
    ) -> None:
        request = TurnRequest(
            prompt=prompt,
            limits=limits or Limits(),
            tools=tools,
            tool_choice=tool_choice,
            context=context or {},
            **request_fields,
        )
        self.policy = policy
        self.state, commands = start(
            "turn1",
            request,
            model=model,
            catalogue=CATALOGUE if catalogue is None else catalogue,
            at=at,
            prior_history=prior_history,
            unpriced=unpriced,
            refused=refused,
            context_budget=context_budget,
            agents=agents,
            max_agent_depth=max_agent_depth,
        )
        check_state(self.state, commands)
        self.log: list[Command] = list(commands)
        self.last: list[Command] = list(commands)

    def feed(self, event: Event) -> list[Command]:
        state, commands = step(self.state, event, policy=self.policy)
        resumed_state, resumed_commands = step(
            load_state(dump_state(self.state), dump_entries(self.state.history), dump_log(self.state)),
            event,
            policy=self.policy,
        )
        assert resumed_state == state, "resuming from the serialised state changed the result"
        assert resumed_commands == commands
        check_state(state, commands)
        self.state = state
        self.log.extend(commands)
        self.last = commands
        return commands

    # --- conveniences ---------------------------------------------------------------------------------

    def call_model(self) -> CallModel:
        """The CallModel of the last step (asserting there is one)."""
        found = of_type(self.last, CallModel)
        assert found, f"no CallModel in {[c.kind for c in self.last]}"
        return found[-1]

    def respond(self, turn: Turn, at: float | None = None) -> list[Command]:
        index = self.state.awaiting_model
        return self.feed(ModelResponded(turn=turn, at=self.now(at), duration_ms=12.5, llm_call_index=index))

    def now(self, at: float | None = None) -> float:
        return self.state.started_at + 1.0 if at is None else at

    def dispatched(self, commands: Sequence[Command] | None = None) -> list[Dispatch]:
        return [
            d for c in of_type(self.last if commands is None else commands, DispatchTools) for d in c.calls
        ]

    def writes(self, commands: Sequence[Command] | None = None) -> list[ToolOutcome]:
        return [
            o for c in of_type(self.last if commands is None else commands, WriteOutcomes) for o in c.outcomes
        ]

    def echo_writes(self, at: float | None = None) -> None:
        """Act as the runtime: the requested outcomes won their writes and come back."""
        for outcome in self.writes():
            self.feed(ToolFinished(outcome=outcome, at=self.now(at)))

    def finish(self, outcome: ToolOutcome, at: float | None = None) -> list[Command]:
        return self.feed(ToolFinished(outcome=outcome, at=self.now(at)))

    def emitted(self, name: str) -> list[dict[str, Any]]:
        return [c.data for c in of_type(self.log, Emit) if c.event_name == name]

    @property
    def outcome(self) -> TurnOutcome:
        assert self.state.outcome is not None, "the turn has not finished"
        finishes = of_type(self.log, Finish)
        assert len(finishes) == 1
        return self.state.outcome
