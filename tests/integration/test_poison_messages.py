"""A worker survives any message on a tool queue: a real prefork worker serving `workers.examples`, each bad
message pushed with a raw LPUSH onto `tool.add` (kombu's Redis transport names the list after the queue).

Each one is acked and counted (`toolloop_worker_refused_messages_total`, scraped from the worker's own
`/metrics`); the call it names, if still waited for, is answered `invalid_request`; the worker's main process
never exits, and a normal `add` still gets its real result.
"""

from __future__ import annotations

import base64
import functools
import json
import signal
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from orchestrator import Client
from orchestrator.redis_server import RedisServer, find_free_port
from tests.support.processes import WorkerHandle, start_worker
from tests.support.waiting import wait_until
from workers import keys
from workers.contract import FailureKind, parse_tool_outcome

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

QUEUE = "tool.add"
SECRET = "hunter2-never-logged"


def build_headers(task: str = "tool.add", **extra: Any) -> dict[str, Any]:
    """Celery protocol 2 headers, as `send_task` writes them."""
    task_id = str(uuid.uuid4())
    return {
        "lang": "py",
        "task": task,
        "id": task_id,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": "()",
        "kwargsrepr": "{}",
        "origin": "test",
        "ignore_result": True,
        **extra,
    }


def build_envelope(
    body: bytes,
    headers: dict[str, Any] | None,
    *,
    content_type: str = "application/json",
    encoding: str = "utf-8",
    raw_body: str | None = None,
    routing_key: str = QUEUE,
) -> str:
    """kombu's Redis envelope of a message on `tool.add` (as its sender says: `routing_key`): base64 body,
    properties, delivery tag."""
    return json.dumps(
        {
            "body": raw_body if raw_body is not None else base64.b64encode(body).decode(),
            "content-encoding": encoding,
            "content-type": content_type,
            "headers": headers,
            "properties": {
                "correlation_id": str(uuid.uuid4()),
                "body_encoding": "base64",
                "delivery_info": {"exchange": "", "routing_key": routing_key},
                "delivery_mode": 2,
                "priority": 0,
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    )


def _call_body(**kwargs: Any) -> bytes:
    return json.dumps(
        [[], kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    ).encode()


# (case, what is pushed, the reason it is counted under)
BAD_MESSAGES: list[tuple[str, str | bytes, str]] = [
    ("the operator's {'a': 1}", build_envelope(b'{"a": 1}', build_headers()), "bad_body"),
    ("body not JSON", build_envelope(b"not json {", build_headers()), "not_json"),
    ("body a JSON list of 2", build_envelope(b"[[], {}]", build_headers()), "bad_body"),
    ("body a JSON string", build_envelope(b'"x"', build_headers()), "bad_body"),
    (
        "protocol 1",
        build_envelope(json.dumps({"task": "tool.add", "id": "x", "args": [], "kwargs": {}}).encode(), {}),
        "protocol",
    ),
    ("no headers", build_envelope(_call_body(call_id="c", tool="add"), None), "protocol"),
    ("headers a list", build_envelope(b"[]", ["task"]), "protocol"),  # type: ignore[arg-type]
    ("no task id", build_envelope(_call_body(), {"task": "tool.add"}), "bad_headers"),
    ("bad timelimit", build_envelope(_call_body(), build_headers(timelimit="abc")), "bad_headers"),
    ("bad eta", build_envelope(_call_body(), build_headers(eta="yesterday")), "bad_headers"),
    ("unknown task", build_envelope(_call_body(), build_headers(task="evil.task")), "unknown_task"),
    ("bad base64", build_envelope(b"", build_headers(), raw_body="!!!not-base64"), "bad_envelope"),
    (
        "body not text",
        json.dumps({**json.loads(build_envelope(b"", build_headers())), "body": {"a": 1}}),
        "bad_envelope",
    ),
    (
        "pickle",
        build_envelope(b"\x80\x04K\x01.", build_headers(), content_type="application/x-python-serialize"),
        "content_type",
    ),
    ("bad encoding", build_envelope(_call_body(), build_headers(), encoding="binary"), "content_type"),
    ("huge body", build_envelope(_call_body(pad="x" * 1_400_000), build_headers()), "too_large"),
    (
        "kwargs not a call",
        build_envelope(_call_body(a=1, b=2, password=SECRET), build_headers()),
        "bad_request",
    ),
    (
        "another tool's call",
        build_envelope(_call_body(call_id="c-other", tool="subtract"), build_headers()),
        "bad_request",
    ),
    ("list item not JSON", b"\x80garbage" + SECRET.encode(), "not_json"),
    ("list item a JSON list", b"[1, 2, 3]", "bad_envelope"),
    ("envelope without delivery tag", json.dumps({"body": "", "properties": {}}), "bad_envelope"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as redis_server:
        yield redis_server


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return find_free_port()


@pytest.fixture(scope="module")
def poisoned_worker(server: RedisServer, metrics_port: int) -> Iterator[WorkerHandle]:
    handle = start_worker(
        server.url,
        ["workers.examples"],
        concurrency=1,
        env={"TOOLLOOP_WORKER_METRICS_PORT": str(metrics_port)},
    )
    yield handle
    handle.stop()


@pytest.fixture
def broker(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    yield client
    client.close()


def _metrics_up(port: int) -> bool:
    # The worker serves /metrics once it is up: on a loaded machine, after the first poll.
    try:
        read_refused(port)
    except OSError:
        return False
    return True


def read_refused(port: int) -> dict[tuple[str, str], float]:
    """The worker's `toolloop_worker_refused_messages_total` samples, by (queue, reason)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    counts: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("toolloop_worker_refused_messages_total{"):
            labels, value = line.rsplit(" ", 1)
            pairs = dict(part.split("=", 1) for part in labels[labels.index("{") + 1 : -1].split(","))
            counts[(pairs["queue"].strip('"'), pairs["reason"].strip('"'))] = float(value)
    return counts


def _refused(port: int, reason: str, queue: str = QUEUE) -> float:
    return read_refused(port).get((queue, reason), 0.0)


def _counted(port: int, reason: str, before: float) -> bool:
    return _refused(port, reason) > before


def _alive(handle: WorkerHandle, pid: int) -> bool:
    return handle.process.poll() is None and handle.pid == pid


def test_every_bad_message_is_acked_counted_and_survived(
    poisoned_worker: WorkerHandle, broker: redis.Redis, metrics_port: int, server: RedisServer
) -> None:
    main_pid = poisoned_worker.pid
    wait_until(lambda: _metrics_up(metrics_port) or None, "the worker's /metrics")
    for case, pushed, reason in BAD_MESSAGES:
        before = _refused(metrics_port, reason)
        broker.lpush(QUEUE, pushed)
        wait_until(
            functools.partial(_counted, metrics_port, reason, before),
            f"{case}: counted as {reason}",
            detail=poisoned_worker.log_text,
        )
        assert _alive(poisoned_worker, main_pid), f"{case}: the worker exited\n{poisoned_worker.log_text()}"
    # Acked: nothing left queued or unacked to come back to the next worker.
    wait_until(lambda: broker.llen(QUEUE) == 0 and broker.hlen("unacked") == 0, "every message acked")
    with Client(redis_url=server.url) as client:
        outcome = client.call_tool("add", {"a": 2, "b": 3}, timeout_s=30)
    assert outcome.ok and outcome.result == 5, outcome
    log = poisoned_worker.log_text()
    assert "Unrecoverable error" not in log
    assert SECRET not in log
    assert "refused a message on queue tool.add (bad_body" in log
    assert _alive(poisoned_worker, main_pid)


def test_the_operators_message_does_not_come_back_to_kill_the_next_worker(
    poisoned_worker: WorkerHandle, broker: redis.Redis, metrics_port: int
) -> None:
    before = _refused(metrics_port, "bad_body")
    for _ in range(3):
        broker.lpush(QUEUE, build_envelope(b'{"a": 1}', build_headers()))
    wait_until(lambda: _refused(metrics_port, "bad_body") >= before + 3 or None, "three refusals")
    wait_until(lambda: broker.llen(QUEUE) == 0 and broker.hlen("unacked") == 0, "acked, not handed back")
    assert poisoned_worker.process.poll() is None


def test_a_refusal_names_the_queue_the_message_was_read_from_not_the_one_it_claims(
    poisoned_worker: WorkerHandle, broker: redis.Redis, metrics_port: int
) -> None:
    # An operator finds what writes to a queue by the queue a refusal names: the list it was on.
    before = _refused(metrics_port, "bad_body")
    claimed_before = _refused(metrics_port, "bad_body", "tool.subtract")
    broker.lpush(QUEUE, build_envelope(b'{"a": 1}', build_headers(), routing_key="tool.subtract"))
    wait_until(lambda: _refused(metrics_port, "bad_body") > before or None, "refused on tool.add")
    assert _refused(metrics_port, "bad_body", "tool.subtract") == claimed_before
    last = [line for line in poisoned_worker.log_text().splitlines() if "refused a message on queue" in line][
        -1
    ]
    assert "refused a message on queue tool.add (bad_body" in last


def test_a_direct_call_named_by_a_bad_message_is_answered_invalid_request(
    poisoned_worker: WorkerHandle, broker: redis.Redis
) -> None:
    call_id = f"direct-{uuid.uuid4().hex}"
    headers = build_headers(toolloop_call_id=call_id, toolloop_turn_id=None)
    broker.lpush(QUEUE, build_envelope(b'{"a": 1}', headers))
    # What a direct caller (`Client.call_tool`) blocks on, then reads.
    popped = broker.blpop([keys.reply(call_id)], timeout=30)
    assert popped is not None and popped[1] == call_id.encode()
    raw = broker.get(keys.outcome(call_id))
    assert raw is not None
    outcome = parse_tool_outcome(raw)
    assert outcome.failure_kind is FailureKind.INVALID_REQUEST and not outcome.ok
    assert outcome.tool == "add" and outcome.attempts == 0
    # What a model is shown.
    assert outcome.content.startswith("Error: the task message of this call could not be read (the body is")
    assert "was not run" in outcome.content
    assert poisoned_worker.process.poll() is None


def test_a_turn_call_named_by_a_bad_message_is_answered_while_its_turn_waits(
    poisoned_worker: WorkerHandle, broker: redis.Redis, server: RedisServer
) -> None:
    with Client(redis_url=server.url) as client:
        turn_id = client.submit(prompt="add 2 and 3")  # no orchestrator here: the turn waits, it exists
    call_id = f"{turn_id}:c0"
    body = _call_body(call_id=call_id, tool="add", turn_id=turn_id, arguments={"a": "two"}, attempt="x")
    broker.lpush(
        QUEUE, build_envelope(body, build_headers(toolloop_call_id=call_id, toolloop_turn_id=turn_id))
    )
    wait_until(
        lambda: broker.get(keys.outcome(call_id)), "the call's outcome", detail=poisoned_worker.log_text
    )
    outcome = parse_tool_outcome(broker.get(keys.outcome(call_id)) or b"")
    assert outcome.failure_kind is FailureKind.INVALID_REQUEST and outcome.turn_id == turn_id
    assert "kwargs are not a tool call (fields attempt)" in outcome.content
    assert "two" not in outcome.content


def test_a_call_nobody_waits_for_gets_no_outcome(poisoned_worker: WorkerHandle, broker: redis.Redis) -> None:
    gone_turn = f"gone-{uuid.uuid4().hex}"
    call_id = f"{gone_turn}:c0"
    headers = build_headers(toolloop_call_id=call_id, toolloop_turn_id=gone_turn)
    broker.lpush(QUEUE, build_envelope(b"[1]", headers))
    wait_until(
        lambda: f"dropped: call {call_id} is not waited for" in poisoned_worker.log_text(),
        "the dropped message's log line",
    )
    assert broker.get(keys.outcome(call_id)) is None


def test_a_worker_that_must_stop_exits_non_zero(server: RedisServer) -> None:
    # Celery stops it with "Unrecoverable error" and EX_FAILURE, the code its `worker_main` used to drop.
    handle = start_worker(server.url, ["tests.support.unrecoverable_tools"], concurrency=1, wait=False)
    try:
        code = handle.process.wait(timeout=60)
    finally:
        handle.stop()
    assert "Unrecoverable error: RuntimeError('a consumer step failed')" in handle.log_text()
    assert code != 0


def test_a_warm_shutdown_still_exits_zero(server: RedisServer) -> None:
    handle = start_worker(server.url, ["workers.examples"], concurrency=1)
    try:
        handle.process.send_signal(signal.SIGTERM)
        code = handle.process.wait(timeout=60)
    finally:
        handle.stop()
    assert code == 0, handle.log_text()
