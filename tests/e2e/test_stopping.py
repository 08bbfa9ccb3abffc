"""Every long-running `toolloop` process stops on SIGTERM and on SIGINT, whatever Redis does.

The orchestrator, the API, the worker and Flower are started as an operator starts them, against a Redis
URL nobody listens on ("never"), against a Redis that is stopped once they run ("gone"), or one stopped and
started again ("restarted"); then the signal goes to the main process, as `kill` or `docker stop` sends it,
and the process (its whole process group: prefork children, the embedded redis-server) must be gone. The
orchestrator also tells plainly, once, which Redis it cannot reach, and when it is back. `toolloop redis`
stops with its redis-server, and ends by itself when its redis-server dies.

The signal comes once the process is seen in its outage (its retries counted, its outage line written, its
request unanswered), not after a guessed pause. A process that ignores the signal would run on forever:
`STOP_WITHIN_S` only bounds that wait, generously (a loaded CI machine); how fast they stop is not measured.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.redis_server import RedisServer, find_free_port
from tests.support.served import Served, answers, start_toolloop
from tests.support.waiting import wait_until
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

STOP_WITHIN_S = 30.0
SIGNALS = [signal.SIGTERM, signal.SIGINT]
# Failed Redis calls a process has retried before it is signalled: it is deep in its retry loops.
SEVERAL_RETRIES = 5


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


def dead_url() -> str:
    return f"redis://127.0.0.1:{find_free_port()}/0"


def start_orchestrator(url: str) -> tuple[Served, str]:
    """An orchestrator, and the URL of its /metrics (which count its failed Redis calls)."""
    port = find_free_port()
    served = launch(
        ["orchestrator", "--id", f"stop-{os.urandom(4).hex()}"],
        env={"TOOLLOOP_REDIS_URL": url, "TOOLLOOP_METRICS_PORT": str(port)},
    )
    return served, f"http://127.0.0.1:{port}/metrics"


def redis_retries(metrics_url: str) -> float:
    """How many failed Redis calls an orchestrator or an API has retried, all its loops together."""
    try:
        body = httpx.get(metrics_url, timeout=2).text
    except httpx.TransportError:
        return 0
    return sum(
        sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == "toolloop_redis_errors_total"
    )


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


def capture_failures(log: str) -> int:
    """How many times Flower said its event capture failed (it retries, with a growing pause)."""
    return log.count("Failed to capture events")


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


def unanswered_request(redis_port: int) -> bool:
    """True when a client's request sits unread in a (frozen) Redis's socket: someone waits on it."""
    local = f":{redis_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        established = fields[3] == "01"
        if fields[1].endswith(local) and established and int(fields[4].split(":")[1], 16) > 0:
            return True
    return False


def assert_stops(served: Served, signum: int, label: str) -> None:
    """Signal the main process; it and its whole group must end (waited on up to STOP_WITHIN_S)."""
    try:
        code, _took_s = served.stop_with(signum, STOP_WITHIN_S)
        assert code is not None, (
            f"{label}: still running {STOP_WITHIN_S} s after {signal.Signals(signum).name}:\n"
            f"{served.log_text()[-3000:]}"
        )
        wait_until(lambda: not served.group_alive(), f"{label}: the process's children to end", 30)
    finally:
        served.kill()


def unreachable_lines(log: str, url: str) -> list[str]:
    return [line for line in log.splitlines() if f"Redis at {url}" in line and "unreachable" in line]


# --- the orchestrator --------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_an_orchestrator_that_never_reached_redis_stops_and_said_so_once(signum: int) -> None:
    url = dead_url()
    served, metrics = start_orchestrator(url)
    served.wait_for(lambda: redis_retries(metrics) >= SEVERAL_RETRIES, "several retries")
    assert_stops(served, signum, "orchestrator, Redis never reachable")
    lines = unreachable_lines(served.log_text(), url)
    assert len(lines) == 1, served.log_text()
    assert "retrying" in lines[0]


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_an_orchestrator_whose_redis_is_gone_stops(own_persistent_redis: RedisServer, signum: int) -> None:
    served, metrics = start_orchestrator(own_persistent_redis.url)
    served.wait_for(lambda: orchestrator_registered(own_persistent_redis.url), "registration")
    own_persistent_redis.stop(keep_data=True)
    served.wait_for(lambda: redis_retries(metrics) >= SEVERAL_RETRIES, "several retries")
    assert_stops(served, signum, "orchestrator, Redis gone")
    # Four loops noticed the outage; the operator reads about it once.
    assert len(unreachable_lines(served.log_text(), own_persistent_redis.url)) == 1, served.log_text()


def test_an_orchestrator_says_when_redis_is_back_and_stops(own_persistent_redis: RedisServer) -> None:
    served, _metrics = start_orchestrator(own_persistent_redis.url)
    served.wait_for(lambda: orchestrator_registered(own_persistent_redis.url), "registration")
    own_persistent_redis.stop(keep_data=True)
    served.wait_for(
        lambda: bool(unreachable_lines(served.log_text(), own_persistent_redis.url)), "the outage line"
    )
    own_persistent_redis.start()
    served.wait_for(
        lambda: (
            re.search(
                rf"Redis at {re.escape(own_persistent_redis.url)} is back after [\d.]+ s", served.log_text()
            )
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
def test_an_api_whose_redis_is_gone_stops_with_a_stream_open(
    own_persistent_redis: RedisServer, signum: int
) -> None:
    served, base = start_api(own_persistent_redis.url)
    served.wait_for(lambda: api_answers(base), "the API to answer")
    reply = httpx.post(f"{base}/v1/turns", json={"prompt": "nobody runs this turn"}, timeout=5)
    assert reply.status_code == 202, reply.text
    turn_id = reply.json()["id"]
    # A client following the turn keeps a stream open through the outage and the stop.
    with httpx.stream("GET", f"{base}/v1/turns/{turn_id}/events", timeout=None):
        own_persistent_redis.stop(keep_data=True)
        served.wait_for(lambda: redis_retries(f"{base}/metrics") >= SEVERAL_RETRIES, "the stream's retries")
        assert_stops(served, signum, "api, Redis gone, SSE stream open")


# --- Flower ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_flower_that_never_reached_redis_stops(signum: int) -> None:
    served, base = start_flower(dead_url())
    served.wait_for(lambda: answers(f"{base}/healthcheck"), "Flower to answer")
    served.wait_for(lambda: capture_failures(served.log_text()) >= 1, "Flower to meet the missing broker")
    assert_stops(served, signum, "flower, Redis never reachable")


def test_flower_stops_on_sigint_even_when_started_with_it_ignored() -> None:
    # A background job of a shell script (`cmd &`, CI steps, nohup) inherits SIGINT ignored.
    port = find_free_port()
    env = {"TOOLLOOP_REDIS_URL": dead_url(), "FLOWER_BASIC_AUTH": "ops:pass"}
    served = start_toolloop(["flower", "--port", str(port)], env, sigint_ignored=True)
    _launched.append(served)
    served.wait_for(lambda: answers(f"http://127.0.0.1:{port}/healthcheck"), "Flower to answer")
    status = Path(f"/proc/{served.pid}/status").read_text()
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    assert not ignored & (1 << (signal.SIGINT - 1)), "toolloop flower must take SIGINT back"
    assert_stops(served, signal.SIGINT, "flower, started with SIGINT ignored")


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_flower_whose_redis_is_gone_stops(own_persistent_redis: RedisServer, signum: int) -> None:
    served, base = start_flower(own_persistent_redis.url)
    served.wait_for(lambda: answers(f"{base}/healthcheck"), "Flower to answer")
    own_persistent_redis.stop(keep_data=True)
    # Flower's threads have met the missing broker: its `enable_events` broadcast (every 5 s) failed once,
    # and its event thread either retries its capture with a growing pause or, had Redis gone just as it
    # connected, retries its wake-up broadcast without end (kombu's publish with retry=True) — whichever
    # it does, stopping must not wait for it.
    served.wait_for(lambda: "Failed to enable events" in served.log_text(), "Flower's broadcast to fail")
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
def test_a_worker_whose_redis_is_gone_stops(own_persistent_redis: RedisServer, signum: int) -> None:
    served = start_worker(own_persistent_redis.url)
    served.wait_for(lambda: worker_ready(own_persistent_redis.url), "the worker's catalogue")
    own_persistent_redis.stop(keep_data=True)
    # Celery's consumer is in its reconnect loop ("Trying again in 2.00 seconds...") when the signal comes.
    served.wait_for(lambda: "Cannot connect to" in served.log_text(), "the consumer's reconnect loop")
    assert_stops(served, signum, "worker, Redis gone")


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_worker_whose_redis_hangs_stops(own_persistent_redis: RedisServer, signum: int) -> None:
    # A frozen Redis accepts connections and answers nothing: Celery's warm shutdown would wait on it forever.
    served = start_worker(own_persistent_redis.url)
    served.wait_for(lambda: worker_ready(own_persistent_redis.url), "the worker's catalogue")
    assert own_persistent_redis.pid is not None
    os.kill(own_persistent_redis.pid, signal.SIGSTOP)
    try:
        wait_until(
            lambda: unanswered_request(own_persistent_redis.port), "the worker to wait on the frozen Redis"
        )
        assert_stops(served, signum, "worker, Redis hung")
    finally:
        os.kill(own_persistent_redis.pid, signal.SIGCONT)
    assert "does not answer: stopping now" in served.log_text()


def test_a_worker_stops_after_redis_restarted(own_persistent_redis: RedisServer) -> None:
    served = start_worker(own_persistent_redis.url)
    served.wait_for(lambda: worker_ready(own_persistent_redis.url), "the worker's catalogue")
    own_persistent_redis.stop(keep_data=True)
    served.wait_for(lambda: "Cannot connect to" in served.log_text(), "the consumer's reconnect loop")
    own_persistent_redis.start()
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
