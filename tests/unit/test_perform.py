"""Performing commands: a command in, the events it produces out (at once, or when its slow work ends)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
import redis

from orchestrator import machine
from orchestrator.machine.events import (
    AwaitApproval,
    Dispatch,
    DispatchTools,
    Emit,
    Event,
    ModelFailed,
    ModelResponded,
    Revoke,
    ToolFinished,
    ToolWaitingForWorker,
    WriteOutcomes,
)
from orchestrator.machine.state import TurnState
from orchestrator.model import ModelSettings, ProviderError, Turn, TurnRequest, Usage
from orchestrator.pricing import build_price_table
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.deltas import DeltaSink
from orchestrator.providers.registry import ModelClients
from orchestrator.providers.scripted.brain import build_reply
from orchestrator.runtime.perform import Performer
from orchestrator.settings import Settings
from tests.support.performer_fakes import FakePublisher, FakeStore, Serving, call_model, later
from workers.contract import FailureKind, ToolOutcome, ToolSpec

pytestmark = pytest.mark.timeout(10)

TURN = "turn_1"
ADD = ToolSpec(name="add", description="Add two numbers.", soft_time_limit_s=5, time_limit_s=10)
NOW = 1_700_000_000.0


def scripted_http() -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        reply = build_reply(json.loads(request.content))
        return httpx.Response(reply.status, json=reply.body, headers=reply.headers)

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


def build_performer(
    http: httpx.AsyncClient,
    store: FakeStore,
    publisher: FakePublisher,
    catalogue: Serving | None = None,
) -> tuple[Performer, ModelClients]:
    models = ModelClients(Settings(scripted_base_url="http://model.invalid/v1"), http, max_retries=0)
    performer = Performer(
        store=store,  # type: ignore[arg-type]
        publisher=publisher,  # type: ignore[arg-type]
        models=models,
        clock=lambda: NOW,
        catalogue=catalogue or Serving(ADD),
    )
    return performer, models


def new_state() -> TurnState:
    state, _ = machine.start(
        TURN,
        TurnRequest(prompt="add 1 and 2", tools=["add"]),
        model="scripted:echo",
        catalogue={"add": ADD},
        at=NOW,
    )
    return state


async def test_writing_outcomes_yields_each_winner_under_the_models_call_id() -> None:
    store, publisher = FakeStore(), FakePublisher()
    earlier = ToolOutcome(call_id=f"{TURN}/c1", tool="add", turn_id=TURN, ok=True, result=3, content="3")
    store.outcomes[earlier.call_id] = earlier
    lost = ToolOutcome(
        call_id="c1",
        tool="add",
        turn_id=TURN,
        ok=False,
        content="Error: lost",
        failure_kind=FailureKind.WORKER_LOST,
    )
    fresh = lost.model_copy(update={"call_id": "c2"})
    async with scripted_http() as http:
        performer, _ = build_performer(http, store, publisher)
        events = await performer.perform(TURN, new_state(), WriteOutcomes(outcomes=[lost, fresh]))
    assert isinstance(events, list)
    assert [(e.outcome.call_id, e.outcome.ok, e.at) for e in events if isinstance(e, ToolFinished)] == [
        ("c1", True, NOW),  # the worker's outcome won: it is the answer
        ("c2", False, NOW),
    ]
    assert set(store.outcomes) == {f"{TURN}/c1", f"{TURN}/c2"}


async def test_emit_and_await_approval_produce_nothing() -> None:
    store, publisher = FakeStore(), FakePublisher()
    async with scripted_http() as http:
        performer, _ = build_performer(http, store, publisher)
        state = new_state()
        assert await performer.perform(TURN, state, Emit(event_name="x", data={"a": 1})) == []
        assert await performer.perform(TURN, state, AwaitApproval(call_ids=["c1"])) == []
    assert store.events == [(TURN, "x", {"a": 1})]


async def test_a_model_call_is_slow_work_that_yields_the_response() -> None:
    async with scripted_http() as http:
        performer, _ = build_performer(http, FakeStore(), FakePublisher())
        events = await later(await performer.perform(TURN, new_state(), call_model("scripted:echo")))
    [event] = events
    assert isinstance(event, ModelResponded)
    assert (event.llm_call_index, event.at, event.turn.text) == (3, NOW, "ping")


@pytest.mark.parametrize(
    ("model", "provider"),
    [("nowhere:model-x", "nowhere"), ("huge", "huge")],
    ids=["unknown provider", "not provider:model"],
)
async def test_a_model_no_client_serves_yields_a_model_failure(model: str, provider: str) -> None:
    async with scripted_http() as http:
        performer, _ = build_performer(http, FakeStore(), FakePublisher())
        events = await later(await performer.perform(TURN, new_state(), call_model(model)))
    [event] = events
    assert isinstance(event, ModelFailed)
    assert (event.error.type, event.error.provider, event.llm_call_index) == ("invalid_model", provider, 3)


DISPATCHES = [
    Dispatch(call_id="c1", tool="add", arguments={"a": 1, "b": 2}, task_id="t-1"),
    Dispatch(call_id="c2", tool="add", arguments={"a": 3, "b": 4}, task_id="t-2", attempt=2),
    Dispatch(call_id="c3", tool="unknown", task_id="t-3"),
]


async def dispatch_with_t2_failing() -> tuple[Sequence[Event], FakeStore, FakePublisher]:
    store = FakeStore()
    publisher = FakePublisher(failing={"t-2": ConnectionError("broker down")})
    async with scripted_http() as http:
        performer, _ = build_performer(http, store, publisher)
        command = DispatchTools(calls=DISPATCHES)
        events = await later(await performer.perform(TURN, new_state(), command))
    return events, store, publisher


async def test_a_dispatch_yields_only_the_calls_it_could_not_publish() -> None:
    events, store, publisher = await dispatch_with_t2_failing()
    assert [(s.name, r.call_id, r.attempt, t) for s, r, t in publisher.published] == [
        ("add", f"{TURN}/c1", 1, "t-1"),
        ("add", f"{TURN}/c2", 2, "t-2"),
    ]
    finished = [e.outcome for e in events if isinstance(e, ToolFinished)]
    assert len(finished) == len(events) == 2
    assert [(o.tool, o.failure_kind, o.synthetic, o.attempts) for o in finished] == [
        ("add", FailureKind.WORKER_LOST, True, 2),
        ("unknown", FailureKind.WORKER_LOST, True, 1),
    ]
    assert "broker down" in (finished[0].error or "")
    assert "not in the turn catalogue" in (finished[1].error or "")
    # Written first-writer-wins, as any synthetic outcome.
    assert len(store.outcomes) == 2


async def test_an_unpublished_call_is_answered_under_the_models_call_id() -> None:
    events, store, _ = await dispatch_with_t2_failing()
    assert [e.outcome.call_id for e in events if isinstance(e, ToolFinished)] == ["c2", "c3"]
    assert set(store.outcomes) == {f"{TURN}/c2", f"{TURN}/c3"}


async def test_a_revoke_is_slow_work_that_yields_nothing_and_close_stops_the_publisher() -> None:
    publisher = FakePublisher()
    async with scripted_http() as http:
        performer, _ = build_performer(http, FakeStore(), publisher)
        events = await later(await performer.perform(TURN, new_state(), Revoke(task_ids=["t-1", "t-2"])))
        await performer.aclose()
    assert list(events) == []
    assert publisher.revoked == ["t-1", "t-2"]
    assert publisher.closed


async def dispatch(catalogue: Serving) -> tuple[Sequence[Event], FakeStore, FakePublisher]:
    store, publisher = FakeStore(), FakePublisher()
    async with scripted_http() as http:
        performer, _ = build_performer(http, store, publisher, catalogue)
        events = await later(await performer.perform(TURN, new_state(), DispatchTools(calls=DISPATCHES[:1])))
    return events, store, publisher


async def test_a_tool_no_live_worker_serves_fails_at_dispatch_as_not_found() -> None:
    catalogue = Serving()
    events, store, publisher = await dispatch(catalogue)
    # Judged by a read no older than the turn's own catalogue snapshot, not by a cached view alone.
    assert catalogue.reads == [None, new_state().started_at]
    assert publisher.published == []
    [finished] = [e.outcome for e in events if isinstance(e, ToolFinished)]
    assert (finished.call_id, finished.failure_kind, finished.synthetic) == (
        "c1",
        FailureKind.NOT_FOUND,
        True,
    )
    assert "not served by any live worker" in (finished.error or "")
    assert set(store.outcomes) == {f"{TURN}/c1"}


@pytest.mark.parametrize(
    ("served_ago_s", "waits"),
    [(3.0, True), (60.0, True), (61.0, False)],  # within TOOLLOOP_TOOL_GONE_AFTER_S (60 s), or gone
)
async def test_a_tool_between_workers_is_sent_to_wait_in_its_queue_and_a_gone_one_is_not_found(
    served_ago_s: float, waits: bool
) -> None:
    last = ADD.model_copy(update={"queue": "tool.add.v1"})
    events, store, publisher = await dispatch(Serving(served={"add": (NOW - served_ago_s, last)}))
    if waits:
        [(spec, _, _)] = publisher.published
        assert (spec.queue, spec.time_limit_s) == ("tool.add.v1", ADD.time_limit_s)  # the queue last served
        assert list(events) == [
            ToolWaitingForWorker(call_id="c1", attempt=1, last_served_at=NOW - served_ago_s, at=NOW)
        ]
        assert store.outcomes == {}
    else:
        assert publisher.published == []
        [finished] = [e.outcome for e in events if isinstance(e, ToolFinished)]
        assert finished.failure_kind is FailureKind.NOT_FOUND and "in the last 60 s" in (finished.error or "")


async def test_a_call_goes_to_the_queue_its_live_workers_consume_with_the_limits_it_was_offered() -> None:
    moved = ADD.model_copy(update={"queue": "tool.add", "time_limit_s": 99.0})
    events, _, publisher = await dispatch(Serving(moved))
    assert list(events) == []
    [(spec, _, _)] = publisher.published
    assert (spec.queue, spec.soft_time_limit_s, spec.time_limit_s) == ("tool.add", 5, 10)


async def test_an_unreadable_catalogue_still_dispatches_as_offered() -> None:
    events, _, publisher = await dispatch(Serving(failure=redis.ConnectionError("redis down")))
    assert list(events) == []
    assert [spec for spec, _, _ in publisher.published] == [ADD]


# --- model controls and cost --------------------------------------------------------------------------------


class RecordingClient:
    """A model client that keeps each request and answers `turn` (or a turn that names no price)."""

    provider = "openai"

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.requests: list[ModelRequest] = []

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> Turn | ProviderError:
        self.requests.append(request)
        return self.turn


class RecordingModels:
    def __init__(self, client: RecordingClient) -> None:
        self.client = client
        self.asked: list[str] = []

    async def get(self, model: str) -> RecordingClient:
        self.asked.append(model)
        return self.client

    async def aclose(self) -> None:
        return None


def recording_performer(turn: Turn, **options: Any) -> tuple[Performer, RecordingClient]:
    client = RecordingClient(turn)
    performer = Performer(
        store=FakeStore(),  # type: ignore[arg-type]
        publisher=FakePublisher(),  # type: ignore[arg-type]
        models=RecordingModels(client),  # type: ignore[arg-type]
        clock=lambda: NOW,
        catalogue=Serving(ADD),
        **options,
    )
    return performer, client


USED = Usage(input_tokens=1_000_000, output_tokens=100_000, total_tokens=1_100_000)
SETTINGS = ModelSettings(temperature=0.3, max_output_tokens=512, seed=1, extra={"top_k": 5})
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}


async def test_the_model_request_carries_the_calls_controls() -> None:
    performer, client = recording_performer(Turn(type="final_answer", text="ok", usage=USED))
    command = call_model("openai:gpt-4o").model_copy(
        update={"instructions": "Be brief.", "settings": SETTINGS, "output_schema": SCHEMA}
    )
    await later(await performer.perform(TURN, new_state(), command))
    [request] = client.requests
    assert (request.model, request.instructions, request.settings, request.output_schema) == (
        "gpt-4o",
        "Be brief.",
        SETTINGS,
        SCHEMA,
    )
    assert request.max_output_tokens == 512 and request.prompt_cache is True


async def test_prompt_caching_off_reaches_the_request() -> None:
    performer, client = recording_performer(Turn(type="final_answer", text="ok"), prompt_caching=False)
    await later(await performer.perform(TURN, new_state(), call_model("openai:gpt-4o")))
    assert client.requests[0].prompt_cache is False
    assert client.requests[0].instructions is None and client.requests[0].settings == ModelSettings()


@pytest.mark.parametrize(
    ("model", "prices", "reported", "expected"),
    [
        # gpt-4o: $2.50 in, $10 out per million tokens
        ("openai:gpt-4o", None, None, 2.5 + 1.0),
        ("openai:my-local", {"my-local": {"input": 1.0, "output": 2.0}}, None, 1.0 + 0.2),
        ("openai:my-local", None, None, None),
        ("openai:my-local", None, 0.42, 0.42),  # a cost the provider reported stands when there is no price
        ("openai:gpt-4o", {"openai:gpt-4o": {"input": 0.0, "output": 0.0}}, 0.42, 0.0),
    ],
    ids=["shipped", "override", "no price", "reported", "table first"],
)
async def test_each_answer_is_priced_before_it_is_stepped(
    model: str, prices: dict[str, dict[str, float]] | None, reported: float | None, expected: float | None
) -> None:
    usage = USED.model_copy(update={"cost_usd": reported})
    performer, _ = recording_performer(
        Turn(type="final_answer", text="ok", usage=usage), prices=build_price_table(prices)
    )
    [event] = await later(await performer.perform(TURN, new_state(), call_model(model)))
    assert isinstance(event, ModelResponded)
    assert event.turn.usage.cost_usd == (None if expected is None else pytest.approx(expected))
    assert event.turn.usage.total_tokens == USED.total_tokens


async def test_unpriced_names_the_models_a_dollar_budget_cannot_be_kept_with() -> None:
    performer, _ = recording_performer(Turn(type="final_answer", text="ok"))
    assert performer.unpriced(["openai:gpt-4o", "openai:my-local", "scripted:echo"]) == ["openai:my-local"]
