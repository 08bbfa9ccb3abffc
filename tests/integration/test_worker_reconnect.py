"""A worker rides out Redis restarts with a call running (issue 12, item 1; `workers.broker`).

A real `redis-server` with AOF is stopped and started again on the same port (~2 s down) several times while
a tool call runs on a real prefork worker. kombu's consumer channel used to fail its restore of the unacked
messages on reconnect (`AttributeError` on `connection.client`), and the worker exited once its running
call was over. Now: the worker is alive after the restarts and serves a new call; the running call ran once
and has exactly one outcome; every message kept unacked through the outages was restored and acked (Redis's
unacked hash empties), none run twice — the restored copy of the running call meets its running guard.

The tools are defined here and record their runs in a file (served by a worker whose
`TOOLLOOP_TOOL_MODULES` names this module).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from orchestrator.redis_server import RedisServer
from orchestrator.store.catalogue import read_catalogue
from tests.support.broker import UNACKED_KEY
from tests.support.calls import publish_call, read_runs, record_run, wait_tool_outcome
from tests.support.processes import WorkerHandle, start_worker
from tests.support.waiting import wait_at_most, wait_until
from workers import keys, tool
from workers.settings import WorkerSettings

pytestmark = [pytest.mark.integration]

THIS_MODULE = __name__
CONCURRENCY = 2
DOWN_S = 2.0


@tool(soft_time_limit=200, time_limit=210)
def reconnect_hold(runs_file: str, flag: str, tag: str, max_s: float = 180.0) -> str:
    """Records its start, runs until the file `flag` exists (the restarts are over), records its end."""
    record_run(runs_file, f"start:{tag}")
    wait_at_most(Path(flag).exists, max_s)
    record_run(runs_file, f"done:{tag}")
    return "held"


@tool(soft_time_limit=5, time_limit=10)
def reconnect_quick(runs_file: str) -> str:
    """Records its run and returns at once."""
    record_run(runs_file, "quick")
    return "quick"


def _consuming(client: redis.Redis) -> bool:
    """Whether a worker's consumer is up on this Redis: its last steps (remote control, gossip) listen on
    their fanout channels. Every client is new after a restart, so a listener is a reconnected consumer."""
    return any(entry["cmd"] == "psubscribe" for entry in client.client_list())


def _restart(server: RedisServer, worker: WorkerHandle, client: redis.Redis) -> None:
    """Redis down for `DOWN_S`, its data kept (AOF), back on the same port; returns once the worker's
    consumer is up again, or has given up (it exits once its running calls are over)."""
    server.stop(keep_data=True)
    time.sleep(DOWN_S)  # the outage itself: a scenario of real time, not a wait for something to happen
    server.start()

    def settled() -> bool:
        gave_up = "Unrecoverable error" in worker.log_text() or worker.process.poll() is not None
        return gave_up or _consuming(client)

    wait_until(settled, "the worker to reconnect")


@dataclass(frozen=True)
class Size:
    restarts: int
    # Calls held running through the restarts; past CONCURRENCY the others wait in the queue meanwhile.
    calls: int


QUICK = Size(restarts=3, calls=1)
LONG = Size(restarts=8, calls=3)


@pytest.fixture
def worker(own_persistent_redis: RedisServer) -> Iterator[WorkerHandle]:
    handle = start_worker(own_persistent_redis.url, [THIS_MODULE], concurrency=CONCURRENCY)
    yield handle
    handle.stop()


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(QUICK, id="quick", marks=pytest.mark.timeout(150)),
        pytest.param(LONG, id="long", marks=[pytest.mark.faults, pytest.mark.timeout(400)]),
    ],
)
def test_a_worker_rides_out_redis_restarts_with_calls_running(
    own_persistent_redis: RedisServer, worker: WorkerHandle, size: Size, tmp_path: Path
) -> None:
    runs_file, flag = tmp_path / "runs", tmp_path / "restarts-over"
    settings = WorkerSettings(redis_url=own_persistent_redis.url)
    client = redis.Redis.from_url(own_persistent_redis.url)
    try:
        tags = [f"c{n}" for n in range(size.calls)]
        held = {
            tag: publish_call(
                settings,
                client,
                "reconnect_hold",
                {"runs_file": str(runs_file), "flag": str(flag), "tag": tag},
                prefix="reconnect",
            )
            for tag in tags
        }
        running = min(size.calls, CONCURRENCY)
        wait_until(lambda: len(read_runs(runs_file)) == running, "the calls to start")
        for _ in range(size.restarts):
            _restart(own_persistent_redis, worker, client)
        log = worker.log_text()
        assert worker.process.poll() is None, f"the worker exited during the restarts:\n{log[-3000:]}"
        assert "Unrecoverable error" not in log, log[-3000:]

        flag.touch()
        for call_id in held.values():
            outcome = wait_tool_outcome(client, call_id)
            assert outcome.ok and outcome.content == "held" and outcome.attempts == 1, outcome

        # The worker still consumes: a new call is served.
        quick = publish_call(
            settings, client, "reconnect_quick", {"runs_file": str(runs_file)}, prefix="reconnect"
        )
        assert wait_tool_outcome(client, quick).content == "quick"

        # Every message left unacked by the outages was restored and acked in the end: none stays behind,
        # delivered or queued, so no second run is still to come.
        queues = [spec.queue for spec in read_catalogue(client).values()]

        def all_acked() -> bool:
            return client.hlen(UNACKED_KEY) == 0 and all(client.llen(queue) == 0 for queue in queues)

        wait_until(all_acked, "the unacked messages to be acked")
        expected = Counter(
            {"quick": 1, **{f"{event}:{tag}": 1 for tag in tags for event in ("start", "done")}}
        )
        assert Counter(read_runs(runs_file)) == expected, "a tool body ran twice, or not at all"
        for call_id in held.values():
            assert client.llen(keys.late_outcomes(call_id)) == 0, "a second outcome was written"
            assert client.exists(keys.running(call_id)) == 0
        assert worker.process.poll() is None
        assert "Unrecoverable error" not in worker.log_text()
    finally:
        client.close()


@tool(soft_time_limit=5, time_limit=10)
def reconnect_until(runs_file: str, flag: str) -> str:
    """Records its start, then returns once the file `flag` exists."""
    record_run(runs_file, "until")
    wait_at_most(Path(flag).exists, 30.0)
    return "until"


@pytest.mark.timeout(150)
def test_an_ack_refused_after_a_reconnect_is_tried_again_until_it_lands(
    own_persistent_redis: RedisServer, worker: WorkerHandle, tmp_path: Path
) -> None:
    # kombu forgets its event loop when the consumer reconnects; the ack's retries must not be given to none
    # (they were: the refused ack never landed, and its message held its prefetch slot for good).
    runs_file, flag = tmp_path / "runs", tmp_path / "return-now"
    settings = WorkerSettings(redis_url=own_persistent_redis.url)
    client = redis.Redis.from_url(own_persistent_redis.url)
    try:
        _restart(own_persistent_redis, worker, client)
        assert _consuming(client), f"the worker did not reconnect:\n{worker.log_text()[-3000:]}"
        calls = [
            publish_call(
                settings,
                client,
                "reconnect_until",
                {"runs_file": str(runs_file), "flag": str(flag)},
                prefix="refused-ack",
            )
            for _ in range(CONCURRENCY)
        ]
        wait_until(lambda: len(read_runs(runs_file)) == CONCURRENCY, "both calls to start")
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")  # every write refused: the outcomes are spooled, the acks refused
        flag.touch()
        wait_until(lambda: worker.log_text().count("Couldn't ack") >= CONCURRENCY, "the acks to be refused")
        client.config_set("maxmemory", "0")
        wait_until(lambda: client.hlen(UNACKED_KEY) == 0, "the refused acks to land")
        for call_id in calls:
            assert wait_tool_outcome(client, call_id).content == "until"
        quick = publish_call(
            settings, client, "reconnect_quick", {"runs_file": str(runs_file)}, prefix="refused-ack"
        )
        assert wait_tool_outcome(client, quick).content == "quick", "the worker took no call again"
    finally:
        client.config_set("maxmemory", "0")
        client.close()
