"""`ctx.progress` through a real redis-server and a real prefork worker.

A turn is opened by hand (its request key and its events stream, as `submit.lua` leaves them) and a call of it
dispatched under its wire id, as an orchestrator would: the `tool_progress` events land on the turn's stream
in order, under the model's call id, redacted. `progress.lua` is checked on its own: it never creates the
stream of a turn that is gone, and adds nothing once the turn or the call has ended. With the state Redis
frozen or stopped while the tool reports (the broker is another Redis and stays up), the tool still succeeds.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from orchestrator.client.direct import call_tool
from orchestrator.publishing.publisher import dispatch_call, get_producer_app
from orchestrator.redis_server import RedisServer
from orchestrator.runtime.inbox import build_wire_call_id
from orchestrator.settings import Settings
from orchestrator.store import codec
from orchestrator.store.catalogue import read_catalogue
from tests.support.calls import wait_tool_outcome
from tests.support.processes import WorkerHandle, start_worker
from tests.support.turns import event_data
from tests.support.waiting import wait_until
from workers import keys
from workers.contract import REDACTED, ToolCallRequest, ToolOutcome
from workers.progress import ProgressSink, build_event_fields
from workers.scripts import ProgressResult

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

TOOLS = "tests.support.progress_tools"
SECRET = "sk-live-5f2b9c1d7e"
DROPPED = "progress event dropped"


def _open_turn(client: redis.Redis) -> str:
    """A turn as an orchestrator sees it running: its request, and its stream with `turn_queued`."""
    turn_id = f"turn_progress_{uuid.uuid4().hex[:12]}"
    client.set(keys.turn_request(turn_id), "{}")
    client.xadd(keys.turn_events(turn_id), codec.build_event_fields(codec.TURN_QUEUED, {}, time.time()))  # type: ignore[arg-type]
    return turn_id


def _dispatch(redis_url: str, client: redis.Redis, turn_id: str, tool: str, arguments: dict[str, Any]) -> str:
    wire_id = build_wire_call_id(turn_id, "call_7")
    request = ToolCallRequest(call_id=wire_id, tool=tool, arguments=arguments, turn_id=turn_id)
    settings = Settings(redis_url=redis_url)
    dispatch_call(get_producer_app(settings), read_catalogue(client)[tool], request)
    return wire_id


@pytest.fixture(scope="module")
def progress_worker(redis_url: str) -> Iterator[WorkerHandle]:
    handle = start_worker(redis_url, [TOOLS], concurrency=1)
    yield handle
    handle.stop()


# --- a running turn -----------------------------------------------------------------------------------------


def test_events_in_order_under_the_models_call_id_without_the_secret(
    redis_url: str, redis_client: redis.Redis, progress_worker: WorkerHandle
) -> None:
    turn_id = _open_turn(redis_client)
    arguments = {"api_key": SECRET, "steps": 4, "pause_s": 0.3}
    wire_id = _dispatch(redis_url, redis_client, turn_id, "progress_steps", arguments)
    outcome = wait_tool_outcome(redis_client, wire_id, 30)
    assert outcome.ok and outcome.result == "4 steps done", outcome
    events = event_data(redis_client, turn_id, "tool_progress")
    assert events == [
        {
            "call_id": "call_7",
            "tool": "progress_steps",
            "message": f"step {step} of 4 with key {REDACTED}",
            "fraction": step / 4,
        }
        for step in range(1, 5)
    ]
    raw = redis_client.xrange(keys.turn_events(turn_id))
    assert SECRET.encode() not in repr(raw).encode()
    assert all(set(fields) == {b"name", b"at", b"data"} for _id, fields in raw)


def test_a_burst_shows_its_first_and_its_last(
    redis_url: str, redis_client: redis.Redis, progress_worker: WorkerHandle
) -> None:
    turn_id = _open_turn(redis_client)
    wire_id = _dispatch(redis_url, redis_client, turn_id, "progress_burst", {"reports": 200})
    assert wait_tool_outcome(redis_client, wire_id, 30).ok
    events = event_data(redis_client, turn_id, "tool_progress")
    shown = [int(event["message"].split()[1]) for event in events]
    assert shown[0] == 1 and shown[-1] == 200 and events[-1]["fraction"] == 1.0
    assert shown == sorted(shown) and len(shown) < 200, shown


def test_a_direct_call_reports_nowhere(redis_url: str, progress_worker: WorkerHandle) -> None:
    arguments = {"api_key": SECRET, "steps": 2, "pause_s": 0.0}
    outcome = call_tool(redis_url, "progress_steps", arguments, timeout_s=20)
    assert outcome.ok and outcome.result == "2 steps done", outcome


# --- progress.lua: only while someone can show it -----------------------------------------------------------


def _append(sink: ProgressSink, turn_id: str, wire_id: str, token: str = "1|w:1:a") -> ProgressResult:
    data = {"call_id": "c", "tool": "t", "message": "m", "fraction": None}
    return sink.append(turn_id, wire_id, token, build_event_fields("tool_progress", data, time.time()))


def test_script_never_creates_a_gone_turns_stream(redis_url: str, redis_client: redis.Redis) -> None:
    sink = ProgressSink(redis_url)
    assert _append(sink, "turn_gone_" + uuid.uuid4().hex, "x/c") is ProgressResult.ENDED
    turn_id = "turn_gone_" + uuid.uuid4().hex
    assert _append(sink, turn_id, f"{turn_id}/c") is ProgressResult.ENDED
    assert redis_client.exists(keys.turn_events(turn_id)) == 0


def test_script_adds_nothing_after_the_turn_or_the_call_ended(
    redis_url: str, redis_client: redis.Redis
) -> None:
    sink = ProgressSink(redis_url)
    turn_id = _open_turn(redis_client)
    wire_id = build_wire_call_id(turn_id, "c")
    assert _append(sink, turn_id, wire_id) is ProgressResult.ADDED  # no fence: Redis lost it, ours
    redis_client.set(keys.fence(wire_id), "1|w:1:a")  # as an older worker wrote it: the token alone
    assert _append(sink, turn_id, wire_id) is ProgressResult.ADDED
    redis_client.set(keys.fence(wire_id), "1|w:1:a#2")  # the token and the call's count of executions
    assert _append(sink, turn_id, wire_id) is ProgressResult.ADDED
    assert _append(sink, turn_id, wire_id, token="2|w:2:b") is ProgressResult.CALL_DONE  # superseded
    redis_client.set(keys.outcome(wire_id), "{}")
    assert _append(sink, turn_id, wire_id) is ProgressResult.CALL_DONE
    redis_client.delete(keys.outcome(wire_id))
    redis_client.set(keys.turn_outcome(turn_id), "{}")
    assert _append(sink, turn_id, wire_id) is ProgressResult.ENDED
    assert len(event_data(redis_client, turn_id, "tool_progress")) == 3


# --- the state Redis frozen or stopped while the tool reports -----------------------------------------------


@pytest.fixture(scope="module")
def broker(module_redis: RedisServer) -> RedisServer:
    return module_redis


@pytest.fixture(scope="module")
def state(module_persistent_redis: RedisServer) -> RedisServer:
    return module_persistent_redis


@pytest.fixture(scope="module")
def split_worker(broker: RedisServer, state: RedisServer) -> Iterator[WorkerHandle]:
    handle = start_worker(state.url, [TOOLS], concurrency=1, env={"TOOLLOOP_BROKER_URL": broker.url})
    yield handle
    handle.stop()


def _run_through(
    worker: WorkerHandle,
    broker: RedisServer,
    state: RedisServer,
    flags: Path,
    *,
    freeze: Callable[[], None],
    thaw: Callable[[], None],
) -> tuple[ToolOutcome, list[dict[str, Any]], list[float]]:
    client = redis.Redis.from_url(state.url)
    try:
        turn_id = _open_turn(client)
        wire_id = build_wire_call_id(turn_id, "call_7")
        arguments = {"flag_dir": str(flags), "reports": 3}
        request = ToolCallRequest(
            call_id=wire_id, tool="progress_through_freeze", arguments=arguments, turn_id=turn_id
        )
        settings = Settings(redis_url=state.url, broker_url=broker.url)
        spec = read_catalogue(client)["progress_through_freeze"]
        dispatch_call(get_producer_app(settings), spec, request)
        wait_until((flags / "reported").exists, "the first report", 30)
        warned = worker.log_text().count(DROPPED)
        freeze()
        try:
            (flags / "frozen").touch()
            # Reports that waited on the frozen Redis would hold the tool here until the thaw.
            wait_until((flags / "returned").exists, "the tool to return while Redis is frozen", 20)
            # The latest report goes out as the tool returns: kept frozen until that one gave up too.
            wait_until(lambda: worker.log_text().count(DROPPED) > warned, "a dropped report", 20)
        finally:
            thaw()
        outcome = wait_tool_outcome(client, wire_id, 30)
        # One warning for the call, however many of its reports were dropped.
        assert worker.log_text().count(DROPPED) == warned + 1
        return (
            outcome,
            event_data(client, turn_id, "tool_progress"),
            json.loads((flags / "returned").read_text()),
        )
    finally:
        client.close()


def _assert_shown_in_order(events: list[dict[str, Any]]) -> None:
    # A report sent as Redis froze (or in the instant before it stopped) times out and is dropped, but its
    # command may still be in Redis's socket and run at the thaw: dropped means "not known to be shown".
    messages = [event["message"] for event in events]
    assert messages[0] == "before the freeze" and messages == sorted(messages), messages


def test_a_frozen_redis_neither_fails_nor_holds_the_tool(
    broker: RedisServer, state: RedisServer, split_worker: WorkerHandle, tmp_path: Path
) -> None:
    pid = state.pid
    assert pid is not None
    outcome, events, held_s = _run_through(
        split_worker,
        broker,
        state,
        tmp_path,
        freeze=lambda: os.kill(pid, signal.SIGSTOP),
        thaw=lambda: os.kill(pid, signal.SIGCONT),
    )
    assert outcome.ok and outcome.result == "survived", outcome
    _assert_shown_in_order(events)
    print(f"reports during the freeze held the tool {[round(s, 3) for s in held_s]} s")


def test_a_stopped_redis_neither_fails_nor_holds_the_tool(
    broker: RedisServer, state: RedisServer, split_worker: WorkerHandle, tmp_path: Path
) -> None:
    outcome, events, held_s = _run_through(
        split_worker,
        broker,
        state,
        tmp_path,
        freeze=lambda: state.stop(keep_data=True),
        thaw=state.start,
    )
    assert outcome.ok and outcome.result == "survived", outcome
    _assert_shown_in_order(events)
    print(f"reports with Redis stopped held the tool {[round(s, 3) for s in held_s]} s")
