"""Stand-ins for what a `Performer` talks to, for the unit tests of performing commands: a store, a
publisher and a live catalogue in memory, and the model call a test performs."""

from __future__ import annotations

from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from orchestrator.machine.events import CallModel, Event
from orchestrator.model import UserMessage
from orchestrator.publishing.publisher import Send
from orchestrator.store.catalogue import ToolCatalogue
from workers.contract import ToolCallRequest, ToolOutcome, ToolSpec


class FakeStore:
    """The store methods a performer uses: first-writer-wins outcomes, and appended events."""

    def __init__(self) -> None:
        self.outcomes: dict[str, ToolOutcome] = {}
        self.events: list[tuple[str, str, Mapping[str, Any]]] = []

    async def write_outcome(self, outcome: ToolOutcome) -> ToolOutcome:
        return self.outcomes.setdefault(outcome.call_id, outcome)

    async def append_event(self, turn_id: str, name: str, data: Mapping[str, Any]) -> None:
        self.events.append((turn_id, name, data))

    async def append_events(self, turn_id: str, events: Sequence[tuple[str, Mapping[str, Any]]]) -> None:
        self.events += [(turn_id, name, data) for name, data in events]


class FakePublisher:
    """Publishes nothing; `failing` task ids fail every attempt."""

    def __init__(self, failing: Mapping[str, Exception] = {}) -> None:
        self.failing = dict(failing)
        self.published: list[tuple[ToolSpec, ToolCallRequest, str]] = []
        self.priorities: list[str] = []
        self.revoked: list[str] = []
        self.closed = False

    async def publish(self, sends: Sequence[Send]) -> dict[str, Exception]:
        self.published += [(send.spec, send.request, send.task_id) for send in sends]
        self.priorities += [send.priority for send in sends]
        return {send.task_id: self.failing[send.task_id] for send in sends if send.task_id in self.failing}

    async def revoke(self, task_ids: list[str]) -> None:
        self.revoked += task_ids

    async def aclose(self) -> None:
        self.closed = True


class Serving:
    """A live catalogue in which live workers serve `specs`, and a worker last served each tool of `served`
    at the time given with it (`failure`: every read raises it instead)."""

    def __init__(
        self,
        *specs: ToolSpec,
        served: Mapping[str, tuple[float, ToolSpec]] | None = None,
        failure: Exception | None = None,
    ) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self.served = dict(served or {})
        self.failure = failure
        self.reads: list[float | None] = []

    async def read(self, *, newer_than: float | None = None) -> ToolCatalogue:
        self.reads.append(newer_than)
        if self.failure is not None:
            raise self.failure
        return ToolCatalogue(self.specs, self.served)


def call_model(model: str) -> CallModel:
    """A model call of `model` asking one question, as the machine commands it."""
    return CallModel(
        model=model, messages=[UserMessage(content="ping")], tools=[], id_prefix="t1_1", llm_call_index=3
    )


async def later(done: list[Event] | Coroutine[Any, Any, Sequence[Event]]) -> Sequence[Event]:
    """The events of slow work a performer handed back as a coroutine (failing if it answered at once)."""
    assert not isinstance(done, list), "slow work comes back as a coroutine"
    return await done
