"""`Client` (sync, no event loop needed) and `AsyncClient` against a real redis-server.

What an orchestrator writes comes from another thread once the client is blocked reading (Redis lists it as
blocked in XREAD): so a wait that returns the outcome woke on it. No test measures how long a wait took.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
from pydantic import ValidationError

from orchestrator import AsyncClient, Client, UnknownTurnError
from orchestrator.client.redis_client import PendingApproval
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import dump_entries, dump_state
from orchestrator.model import TurnOutcome, TurnStatus, UserMessage
from orchestrator.settings import get_settings
from orchestrator.store.history import Appended
from orchestrator.store.turns import MAX_BLOCK_MS, TurnStore, block_cap_ms, connect_async, connect_sync
from tests.support.approvals import hold_for_approval
from tests.support.processes import WorkerHandle
from tests.support.store_db import finish_in_thread, store_db_url, wait_blocked
from tests.support.waiting import DEFAULT_TIMEOUT_S
from tests.unit.machine.harness import Driver, calls
from workers import keys
from workers.contract import REDACTED, FailureKind, ToolOutcome

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    with Client(store_db_url(redis_url)) as sync_client:
        sync_client.redis.flushdb()
        yield sync_client


@pytest.fixture
async def aclient(redis_url: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(store_db_url(redis_url)) as async_client:
        await async_client.store.redis.flushdb()
        yield async_client


def test_submit_get_and_wait_without_an_event_loop(client: Client, redis_url: str) -> None:
    turn_id = client.submit(prompt="2+2?", tools=["add"], model="scripted:demo", limits={"max_llm_calls": 3})
    view = client.get(turn_id)
    assert view.status == TurnStatus.QUEUED and view.outcome is None
    assert view.request.tools == ["add"] and view.request.limits.max_llm_calls == 3
    assert [m.content for m in view.messages] == ["2+2?"]
    thread = finish_in_thread(redis_url, turn_id)
    # Written only once the wait was blocked, long before its timeout: the wait woke on the outcome.
    outcome = client.wait(turn_id, timeout=DEFAULT_TIMEOUT_S)
    thread.join()
    assert outcome.status == "completed" and outcome.text == "4"
    assert client.get(turn_id).outcome == outcome
    assert client.redis.llen(keys.TURN_QUEUE) == 1  # durable and queued; nothing claimed it in this test


def test_wait_times_out_and_unknown_turns_are_errors(client: Client) -> None:
    turn_id = client.submit(prompt="never answered")
    with pytest.raises(TimeoutError, match=turn_id):
        client.wait(turn_id, timeout=0.4)
    for call in (
        lambda: client.get("turn_nope"),
        lambda: client.wait("turn_nope", 0.1),
        lambda: client.cancel("turn_nope"),
        lambda: list(client.events("turn_nope")),
    ):
        with pytest.raises(UnknownTurnError, match="turn_nope"):
            call()


def test_bad_input_gets_a_clear_error(client: Client) -> None:
    with pytest.raises(ValueError, match="'prompt' or at least one message"):
        client.submit()
    with pytest.raises(ValidationError, match="max_llm_calls"):
        client.submit(prompt="x", limits={"max_llm_calls": 0})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        client.submit(prompt="x", limits={"max_llm_callz": 3})
    with pytest.raises(ValueError, match="list of tool names"):
        client.submit(prompt="x", tools="add")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="role"):
        client.submit(messages=[{"role": "robot", "content": "x"}])
    assert client.redis.llen(keys.TURN_QUEUE) == 0


def test_events_stream_until_turn_finished(client: Client, redis_url: str) -> None:
    turn_id = client.submit(messages=[UserMessage(content="hi")])
    thread = finish_in_thread(redis_url, turn_id, events=("turn_started", "model_called"))
    names = [event.name for event in client.events(turn_id, block_ms=200)]
    thread.join()
    assert names == ["turn_queued", "turn_started", "model_called", "turn_finished"]


def test_cancel_and_approve_are_recorded_for_the_owner(client: Client) -> None:
    turn_id = client.submit(prompt="x")
    (waiting,) = hold_for_approval(client.redis_url, turn_id, 1)
    assert client.cancel(turn_id)
    assert client.approve(turn_id, waiting, approved=True)
    entries = client.redis.xrange(keys.turn_control(turn_id))
    assert [fields["kind"] for _, fields in entries] == ["cancel", "approval"]
    assert entries[1][1]["call"] == waiting and entries[1][1]["approved"] == "1"
    with pytest.raises(ValueError, match="call_id"):
        client.approve(turn_id, "", approved=True)


def test_a_retried_submit_with_the_same_id_is_one_turn(client: Client) -> None:
    assert client.submit(prompt="x", turn_id="turn_web_42") == "turn_web_42"
    assert client.submit(prompt="x", turn_id="turn_web_42") == "turn_web_42"
    assert client.redis.llen(keys.TURN_QUEUE) == 1


async def test_async_client_has_the_same_methods(aclient: AsyncClient, redis_url: str) -> None:
    turn_id = await aclient.submit(prompt="2+2?", conversation_id="conv-a")
    assert (await aclient.get(turn_id)).status == TurnStatus.QUEUED
    with pytest.raises(TimeoutError):
        await aclient.wait(turn_id, 0.2)
    thread = finish_in_thread(redis_url, turn_id, events=("turn_started",))
    names = [event.name async for event in aclient.events(turn_id, block_ms=200)]
    outcome = await aclient.wait(turn_id, DEFAULT_TIMEOUT_S)
    await asyncio.to_thread(thread.join)
    assert names == ["turn_queued", "turn_started", "turn_finished"]
    assert outcome.text == "4"
    assert not await aclient.cancel(turn_id)  # already ended
    assert not await aclient.approve(turn_id, "c", approved=False)
    with pytest.raises(UnknownTurnError):
        await aclient.get("turn_nope")
    with pytest.raises(ValueError, match="prompt"):
        await aclient.submit(prompt="")


async def test_get_lists_the_calls_waiting_for_approval(client: Client, aclient: AsyncClient) -> None:
    turn_id = client.submit(prompt="delete two things", tools=["delete", "add"])
    assert client.get(turn_id).pending_approvals == []  # queued: nothing waits yet
    # The state an orchestrator persists after the model asked for two confirmed calls and a plain one.
    driver = Driver(tools=["delete", "add"])
    driver.respond(
        calls(("delete", {"id": 1, "api_token": "t-123"}), ("add", {"a": 1, "b": 2}), ("delete", {"id": 2}))
    )
    store = aclient.store
    state = driver.state
    history_key, log_key = keys.turn_history(turn_id), keys.turn_log(turn_id)
    text = dump_state(state, history_key=history_key, log_key=log_key)
    lists = Appended(
        history_key, 0, tuple(dump_entries(state.history)), (), log_key, 0, tuple(dump_log(state))
    )
    assert await store.save_step(turn_id, text, state.status, append=lists)
    expected = [
        PendingApproval(call_id="call_0", tool="delete", arguments={"id": 1, "api_token": REDACTED}),
        PendingApproval(call_id="call_2", tool="delete", arguments={"id": 2}),
    ]
    sync_view = client.get(turn_id)
    # Each wait also says since when it waits and when it is answered without a person (24 h, denied).
    waits = sync_view.pending_approvals
    assert all(w.since is not None and w.wait_deadline == w.since + 86400 for w in waits)
    assert {w.on_timeout for w in waits} == {"deny"}
    shown = [w.model_copy(update={"since": None, "wait_deadline": None, "on_timeout": None}) for w in waits]
    assert sync_view.status == TurnStatus.WAITING and shown == expected
    assert (await aclient.get(turn_id)).pending_approvals == waits
    assert "t-123" not in sync_view.model_dump_json()
    ended = TurnOutcome(turn_id=turn_id, status="cancelled", stop_reason="cancelled")
    assert await store.save_outcome(turn_id, ended)
    assert client.get(turn_id).pending_approvals == []  # ended: the outcome is the record


def test_the_shared_clients_keep_the_rediss_certificate_policy() -> None:
    sync_client = connect_sync("rediss://localhost:1/0", "optional")
    async_client = connect_async("rediss://localhost:1/0", "none")
    assert sync_client.connection_pool.connection_kwargs["ssl_cert_reqs"] == "optional"
    assert async_client.connection_pool.connection_kwargs["ssl_cert_reqs"] == "none"
    assert "ssl_cert_reqs" not in connect_sync("redis://localhost:1/0").connection_pool.connection_kwargs
    sync_client.close()


def test_call_tool_runs_one_tool_through_a_real_worker(redis_url: str, worker: WorkerHandle) -> None:
    with Client(redis_url) as direct:  # the workers' database: their catalogue is there
        outcome = direct.call_tool("echo", {"text": "hi", "times": 2}, timeout_s=20)
        assert outcome.ok, outcome
        assert outcome.result == "hihi" and outcome.worker
        refused = direct.call_tool("echo", {"times": "x"}, timeout_s=20)
        assert not refused.ok and refused.failure_kind == "validation"


async def test_async_call_tool(redis_url: str, worker: WorkerHandle) -> None:
    async with AsyncClient(redis_url) as direct:
        outcome = await direct.call_tool("echo", {"text": "yo"}, timeout_s=20)
        assert outcome.ok and outcome.tool == "echo"


# --- waiting longer than the Redis client's socket timeout ------------------------------------------------
# redis-py gives up on a reply after `socket_timeout` (5 s by default) with redis.exceptions.TimeoutError. The
# e2e suite proves waits outlast the default with a real 7 s tool; here a 1 s socket timeout makes the same
# failure quick: every wait below outlasts it by far (QUIET_S of silence once the reader blocks, a scenario
# of real time), which only works when no read blocks that long.
SHORT_SOCKET_TIMEOUT_S = 1
QUIET_S = 2.5


def short_timeout_url(redis_url: str) -> str:
    return f"{store_db_url(redis_url)}?socket_timeout={SHORT_SOCKET_TIMEOUT_S}"


def test_the_block_cap_stays_well_under_the_socket_timeout(redis_url: str) -> None:
    with Client(store_db_url(redis_url)) as default, Client(short_timeout_url(redis_url)) as short:
        assert default.block_cap_ms == MAX_BLOCK_MS < 5000  # redis-py 8's default socket timeout is 5 s
        assert short.block_cap_ms <= SHORT_SOCKET_TIMEOUT_S * 1000 / 2
    for query, longest_ms in (("socket_timeout=0.1", 50), ("socket_timeout=60", MAX_BLOCK_MS)):
        with redis.Redis.from_url(f"{redis_url}?{query}") as other:
            assert 1 <= block_cap_ms(other) <= longest_ms


def test_sync_wait_and_events_outlast_the_socket_timeout(client: Client, redis_url: str) -> None:
    with Client(short_timeout_url(redis_url)) as quiet_client:
        waited_id = quiet_client.submit(prompt="a long tool")
        thread = finish_in_thread(redis_url, waited_id, quiet_s=QUIET_S)
        outcome = quiet_client.wait(waited_id, timeout=DEFAULT_TIMEOUT_S)
        assert outcome.text == "4"
        thread.join()
        streamed_id = quiet_client.submit(prompt="a turn waiting for approval")
        thread = finish_in_thread(redis_url, streamed_id, ("turn_waiting",), quiet_s=QUIET_S)
        names = [event.name for event in quiet_client.events(streamed_id, block_ms=60_000)]
        thread.join()
        assert names == ["turn_queued", "turn_waiting", "turn_finished"]
        silent_id = quiet_client.submit(prompt="never answered")
        with pytest.raises(TimeoutError, match=silent_id):  # the caller's deadline, not the socket's
            quiet_client.wait(silent_id, timeout=QUIET_S)


async def test_async_wait_events_claim_and_inbox_outlast_the_socket_timeout(redis_url: str) -> None:
    async with AsyncClient(short_timeout_url(redis_url)) as quiet:
        store = quiet.store
        await store.redis.flushdb()
        assert store.block_cap_ms <= SHORT_SOCKET_TIMEOUT_S * 1000 / 2
        turn_id = await quiet.submit(prompt="a long tool")
        thread = finish_in_thread(redis_url, turn_id, ("tool_started",), quiet_s=QUIET_S)
        waiting = asyncio.create_task(quiet.wait(turn_id, DEFAULT_TIMEOUT_S))
        names = [event.name async for event in quiet.events(turn_id)]
        outcome = await waiting
        await asyncio.to_thread(thread.join)
        assert names == ["turn_queued", "tool_started", "turn_finished"] and outcome.text == "4"
        # The orchestrator's blocking reads: claiming a turn queued later, and its inbox.
        assert await store.claim("orch-quiet", timeout_s=0.2) is None
        claiming = asyncio.create_task(store.claim("orch-quiet", timeout_s=DEFAULT_TIMEOUT_S))
        await _quiet_once_blocked(store, "blpop", claiming)
        later_id = await quiet.submit(prompt="queued later")
        assert await claiming == later_id
        reading = asyncio.create_task(store.read_inbox("orch-quiet", "$", block_ms=60_000))
        assert await reading == []  # one capped read ends empty instead of failing; the runtime reads again
        reading = asyncio.create_task(_read_inbox_until_found(store))
        await _quiet_once_blocked(store, "xread", reading)
        done = ToolOutcome(call_id="call-q", tool="add", turn_id=later_id, ok=True, result="1", content="1")
        await store.write_outcome(done)
        assert (await asyncio.wait_for(reading, DEFAULT_TIMEOUT_S))[0][1]["call"] == "call-q"


async def test_direct_calls_outlast_the_socket_timeout(redis_url: str, worker: WorkerHandle) -> None:
    # The workers' database (their catalogue is there), with a socket timeout shorter than the tool's run.
    # The broker URL stays plain: kombu refuses redis-py's `socket_timeout` as a URL option.
    quiet_url = f"{redis_url}?socket_timeout={SHORT_SOCKET_TIMEOUT_S}"
    settings = get_settings().model_copy(update={"broker_url": redis_url})
    tags = [uuid.uuid4().hex for _ in range(3)]
    with Client(quiet_url, settings=settings) as quiet:
        assert quiet.block_cap_ms <= SHORT_SOCKET_TIMEOUT_S * 1000 / 2
        # Tools that run QUIET_S, longer than the socket timeout: each caller waits that long for its outcome.
        sync_call = asyncio.to_thread(quiet.call_tool, "counted", {"tag": tags[0], "sleep_s": QUIET_S}, 30)
        async with AsyncClient(quiet_url, settings=settings) as aquiet:
            async_call = aquiet.call_tool("counted", {"tag": tags[1], "sleep_s": QUIET_S}, timeout_s=30)
            outcomes = await asyncio.gather(sync_call, async_call)
        assert [(o.ok, o.result) for o in outcomes] == [(True, 1), (True, 1)], outcomes
        # A call that takes longer than the caller waits: the caller's deadline, not a socket error.
        late = quiet.call_tool("counted", {"tag": tags[2], "sleep_s": 4.0}, timeout_s=QUIET_S - 1)
        assert late.failure_kind is FailureKind.TIMEOUT and late.synthetic
        assert late.content == f"Error: no outcome within {QUIET_S - 1:g} s"


async def _quiet_once_blocked(store: TurnStore, command: str, reader: asyncio.Task[Any]) -> None:
    """Once `reader` is blocked in `command`, QUIET_S of silence (longer than the socket timeout)."""
    await wait_blocked(store.redis, command, reader)
    assert not reader.done(), "the reader ended before anything came"
    await asyncio.sleep(QUIET_S)


async def _read_inbox_until_found(store: TurnStore) -> list[tuple[str, dict[str, str]]]:
    # One read blocks at most `block_cap_ms`; the runtime reads again after an empty one, as here.
    while not (entries := await store.read_inbox("orch-quiet", "0", block_ms=60_000)):
        pass
    return entries
