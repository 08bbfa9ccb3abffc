"""Every long-running `toolloop` process stops on SIGTERM and on SIGINT within seconds, whatever Redis does.

The orchestrator, the API, the worker and Flower are started as an operator starts them, against a Redis
URL nobody listens on ("never"), against a Redis that is stopped once they run ("gone"), or one stopped and
started again ("restarted"); then the signal goes to the main process, as `kill` or `docker stop` sends it,
and the process (its whole process group: prefork children, the embedded redis-server) must be gone within
`STOP_WITHIN_S`. The orchestrator also tells plainly, once, which Redis it cannot reach, and when it is back.
`toolloop redis` stops with its redis-server, and ends by itself when its redis-server dies.

The measured times are printed (`pytest -s`); the bound is generous on purpose (a loaded CI machine), the
figures seen are well under it.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from ops.redis_server import RedisServer, find_free_port
from tests.support.served import Served, start_toolloop
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

STOP_WITHIN_S = 15.0
SIGNALS = [signal.SIGTERM, signal.SIGINT]
# How long a process runs into an outage before it is signalled: long enough to be in its retry loops.
OUTAGE_S = 2.5
# How often Flower broadcasts `enable_events` to the workers (its enable_events_interval).
FLOWER_BROADCAST_S = 5.0


_launched: list[Served] = []


@pytest.fixture(autouse=True)
def kill_what_was_launched() -> Iterator[None]:
    """Whatever a test started is killed (its whole group), even when the test fails before stopping it."""
    yield
    while _launched:
        _launched.pop().kill()


def launch(args: list[str], env: dict[str, str] | None = None) -> Served:
    served = start_toolloop(args, env)
    _launched.append(served)
    return served


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own, to stop and restart (the session's must stay up for the other tests)."""
    server = RedisServer(appendonly=True).start()
    yield server
    server.stop()


def dead_url() -> str:
    return f"redis://127.0.0.1:{find_free_port()}/0"


def start_orchestrator(url: str) -> Served:
    return launch(["orchestrator", "--id", f"stop-{os.urandom(4).hex()}"], env={"TOOLLOOP_REDIS_URL": url})


def orchestrator_registered(url: str) -> bool:
    client = redis.Redis.from_url(url)
    try:
        return client.zcard(keys.ORCHESTRATORS) > 0
    finally:
        client.close()


def start_api(url: str) -> tuple[Served, str]:
    port = find_free_port()
    served = launch(["api", "--port", str(port)], env={"TOOLLOOP_REDIS_URL": url})
    return served, f"http://127.0.0.1:{port}"


def api_answers(base: str) -> bool:
    try:
        # 200 with Redis up, 503 without: either way uvicorn serves.
        return httpx.get(f"{base}/healthz", timeout=1).status_code in (200, 503)
    except httpx.TransportError:
        return False


def start_flower(url: str) -> tuple[Served, str]:
    port = find_free_port()
    served = launch(
        ["flower", "--port", str(port)], env={"TOOLLOOP_REDIS_URL": url, "FLOWER_BASIC_AUTH": "ops:pass"}
    )
    return served, f"http://127.0.0.1:{port}"


def flower_answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthcheck", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def start_worker(url: str) -> Served:
    return launch(
        ["worker", "--concurrency", "2", "--hostname", f"stop-{os.urandom(4).hex()}@localhost"],
        env={"TOOLLOOP_REDIS_URL": url, "TOOLLOOP_TOOL_MODULES": "tests.support.tools"},
    )


def worker_ready(url: str) -> bool:
    client = redis.Redis.from_url(url)
    try:
        return bool(client.hlen(keys.CATALOGUE))
    except redis.RedisError:
        return False
    finally:
        client.close()


def assert_stops(served: Served, signum: int, label: str) -> float:
    """Signal the main process; it and its whole group must be gone within STOP_WITHIN_S."""
    try:
        code, elapsed_s = served.stop_with(signum, STOP_WITHIN_S)
        print(f"\n{label} {signal.Signals(signum).name}: exit {code} after {elapsed_s:.2f} s")
        assert code is not None, (
            f"{label}: still running {STOP_WITHIN_S} s after {signal.Signals(signum).name}:\n"
            f"{served.log_text()[-3000:]}"
        )
        deadline = time.monotonic() + 3
        while served.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not served.group_alive(), f"{label}: the process left children behind"
        return elapsed_s
    finally:
        served.kill()


def unreachable_lines(log: str, url: str) -> list[str]:
    return [line for line in log.splitlines() if f"Redis at {url}" in line and "unreachable" in line]


# --- the orchestrator --------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_an_orchestrator_that_never_reached_redis_stops_and_said_so_once(signum: int) -> None:
    url = dead_url()
    served = start_orchestrator(url)
    served.wait_for(lambda: "Redis" in served.log_text(), "its first word on Redis")
    time.sleep(OUTAGE_S)  # several retries later
    assert_stops(served, signum, "orchestrator, Redis never reachable")
    lines = unreachable_lines(served.log_text(), url)
    assert len(lines) == 1, served.log_text()
    assert "retrying" in lines[0]


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_an_orchestrator_whose_redis_is_gone_stops(own_redis: RedisServer, signum: int) -> None:
    served = start_orchestrator(own_redis.url)
    served.wait_for(lambda: orchestrator_registered(own_redis.url), "registration")
    own_redis.stop(keep_data=True)
    time.sleep(OUTAGE_S)
    assert_stops(served, signum, "orchestrator, Redis gone")
    # Four loops noticed the outage; the operator reads about it once.
    assert len(unreachable_lines(served.log_text(), own_redis.url)) == 1, served.log_text()


def test_an_orchestrator_says_when_redis_is_back_and_stops(own_redis: RedisServer) -> None:
    served = start_orchestrator(own_redis.url)
    served.wait_for(lambda: orchestrator_registered(own_redis.url), "registration")
    own_redis.stop(keep_data=True)
    served.wait_for(lambda: bool(unreachable_lines(served.log_text(), own_redis.url)), "the outage line")
    own_redis.start()
    served.wait_for(
        lambda: (
            re.search(rf"Redis at {re.escape(own_redis.url)} is back after [\d.]+ s", served.log_text())
            is not None
        ),
        "the line saying Redis is back",
    )
    assert_stops(served, signal.SIGTERM, "orchestrator, Redis restarted")


# --- the API -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_an_api_that_never_reached_redis_stops(signum: int) -> None:
    served, base = start_api(dead_url())
    served.wait_for(lambda: api_answers(base), "the API to answer")
    assert httpx.get(f"{base}/healthz", timeout=5).status_code == 503
    assert_stops(served, signum, "api, Redis never reachable")


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_an_api_whose_redis_is_gone_stops_with_a_stream_open(own_redis: RedisServer, signum: int) -> None:
    served, base = start_api(own_redis.url)
    served.wait_for(lambda: api_answers(base), "the API to answer")
    reply = httpx.post(f"{base}/v1/turns", json={"prompt": "nobody runs this turn"}, timeout=5)
    assert reply.status_code == 202, reply.text
    turn_id = reply.json()["id"]
    # A client following the turn keeps a stream open through the outage and the stop.
    with httpx.stream("GET", f"{base}/v1/turns/{turn_id}/events", timeout=None):
        own_redis.stop(keep_data=True)
        time.sleep(OUTAGE_S)
        assert_stops(served, signum, "api, Redis gone, SSE stream open")


# --- Flower ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_flower_that_never_reached_redis_stops(signum: int) -> None:
    served, base = start_flower(dead_url())
    served.wait_for(lambda: flower_answers(base), "Flower to answer")
    time.sleep(OUTAGE_S)
    assert_stops(served, signum, "flower, Redis never reachable")


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_flower_whose_redis_is_gone_stops(own_redis: RedisServer, signum: int) -> None:
    served, base = start_flower(own_redis.url)
    served.wait_for(lambda: flower_answers(base), "Flower to answer")
    own_redis.stop(keep_data=True)
    # Flower enables worker events by a broadcast every 5 s: let one meet the missing broker (and retry).
    time.sleep(FLOWER_BROADCAST_S + 1)
    assert_stops(served, signum, "flower, Redis gone")


# --- the worker --------------------------------------------------------------------------------------------


def test_a_worker_that_cannot_reach_redis_says_so_and_exits() -> None:
    url = dead_url()
    served = start_worker(url)
    try:
        code = served.process.wait(timeout=STOP_WITHIN_S)
    finally:
        served.kill()
    assert code == 3
    assert f"cannot reach Redis at {url}" in served.log_text()


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_worker_whose_redis_is_gone_stops(own_redis: RedisServer, signum: int) -> None:
    served = start_worker(own_redis.url)
    served.wait_for(lambda: worker_ready(own_redis.url), "the worker's catalogue")
    own_redis.stop(keep_data=True)
    # Celery's consumer is in its reconnect loop ("Trying again in 2.00 seconds...") when the signal comes.
    served.wait_for(lambda: "Cannot connect to" in served.log_text(), "the consumer's reconnect loop")
    assert_stops(served, signum, "worker, Redis gone")


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_worker_whose_redis_hangs_stops(own_redis: RedisServer, signum: int) -> None:
    # A frozen Redis accepts connections and answers nothing: Celery's warm shutdown would wait on it forever.
    served = start_worker(own_redis.url)
    served.wait_for(lambda: worker_ready(own_redis.url), "the worker's catalogue")
    assert own_redis.pid is not None
    os.kill(own_redis.pid, signal.SIGSTOP)
    try:
        time.sleep(OUTAGE_S)
        assert_stops(served, signum, "worker, Redis hung")
    finally:
        os.kill(own_redis.pid, signal.SIGCONT)
    assert "does not answer: stopping now" in served.log_text()


def test_a_worker_stops_after_redis_restarted(own_redis: RedisServer) -> None:
    served = start_worker(own_redis.url)
    served.wait_for(lambda: worker_ready(own_redis.url), "the worker's catalogue")
    own_redis.stop(keep_data=True)
    served.wait_for(lambda: "Cannot connect to" in served.log_text(), "the consumer's reconnect loop")
    own_redis.start()
    served.wait_for(lambda: "Connected to" in served.log_text().split("Cannot connect to")[-1], "reconnected")
    assert_stops(served, signal.SIGTERM, "worker, Redis restarted")


# --- the embedded Redis ------------------------------------------------------------------------------------

_LISTENING = re.compile(r"redis-server listening on (\S+) \(pid (\d+)\)")


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_toolloop_redis_stops_with_its_redis_server(signum: int) -> None:
    served = launch(["redis", "--port", str(find_free_port())])
    served.wait_for(lambda: _LISTENING.search(served.log_text()) is not None, "redis-server to listen")
    assert_stops(served, signum, "toolloop redis")


def test_toolloop_redis_ends_when_its_redis_server_dies() -> None:
    served = launch(["redis", "--port", str(find_free_port())])
    served.wait_for(lambda: _LISTENING.search(served.log_text()) is not None, "redis-server to listen")
    match = _LISTENING.search(served.log_text())
    assert match is not None
    try:
        os.kill(int(match.group(2)), signal.SIGKILL)
        served.process.wait(timeout=STOP_WITHIN_S)
    finally:
        served.kill()
