"""Scheduled turns on real processes: `toolloop beat` (one or two), a prefork worker, an orchestrator and the
scripted model, on the module's own Redis.

Each run of these schedules holds the worker's `e2e_sleep` tool for 2.5 s while ticks come every second.
When a run was submitted and when it ended are read from its events stream (Redis stream ids: one clock).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from orchestrator.client.redis_client import Client
from orchestrator.errors import UnknownToolError
from orchestrator.redis_server import RedisServer
from orchestrator.schedules.schedule import ScheduleView
from tests.support.plans import plan_prompt
from tests.support.processes import ROOT, TOOLLOOP_BIN
from tests.support.served import Served, start_toolloop
from tests.support.waiting import wait_until
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150), pytest.mark.usefixtures("orchestrator_process")]

SLEEP_S = 2.5
SLOW_RUN = plan_prompt(
    [{"calls": [{"name": "e2e_sleep", "arguments": {"seconds": SLEEP_S}}]}, {"text": "ok"}]
)
LEASE_TTL_S = 2


@contextmanager
def beats(redis_url: str, *ids: str) -> Iterator[list[Served]]:
    """`toolloop beat` processes with these ids (each waiting for the one before to hold or see the lease);
    killed after."""
    started: list[Served] = []
    env = {"TOOLLOOP_REDIS_URL": redis_url}
    try:
        for beat_id in ids:
            served = start_toolloop(["beat", "--id", beat_id, "--lease-ttl-s", str(LEASE_TTL_S)], env)
            started.append(served)
            served.wait_for(lambda s=served: "beat " in s.log_text(), f"beat {beat_id} started")
        yield started
    finally:
        for served in started:
            served.kill()


def view_of(client: Client, name: str) -> ScheduleView | None:
    return next((v for v in client.schedules() if v.schedule.name == name), None)


def runs_oldest_first(client: Client, name: str) -> list[str]:
    view = view_of(client, name)
    return list(reversed(view.state.runs)) if view is not None else []


def stream_ms(entry_id: str) -> int:
    return int(entry_id.split("-", maxsplit=1)[0])


def submitted_and_finished_ms(client: Client, turn_id: str) -> tuple[int, int]:
    """When the turn was queued and when it finished (ms, Redis's clock), once it has."""
    client.wait(turn_id, timeout=60)
    events = list(client.events(turn_id))
    return stream_ms(events[0].id), stream_ms(events[-1].id)


def end_schedule(client: Client, name: str, *, cancel: bool = False) -> list[str]:
    """Remove the schedule and wait for its runs' ends (with `cancel`, cancelling the unfinished); its runs,
    oldest first."""
    runs = runs_oldest_first(client, name)
    assert client.unschedule(name)
    for turn_id in runs:
        if cancel:
            client.cancel(turn_id)
        client.wait(turn_id, timeout=60)
    return runs


def test_an_interval_schedule_with_skip_never_overlaps_and_records_each_run(
    module_redis: RedisServer, client: Client
) -> None:
    client.schedule("skipper", every_s=1, prompt=SLOW_RUN, tools=["e2e_sleep"], model="scripted:plan")
    with beats(module_redis.url, "beat-skip"):
        wait_until(
            lambda: len(runs_oldest_first(client, "skipper")) >= 3,
            "three runs of the schedule",
            timeout_s=60,
        )
        view = view_of(client, "skipper")
        assert view is not None
        listed = subprocess.run(
            [str(TOOLLOOP_BIN), "schedules"],
            env={**os.environ, "TOOLLOOP_REDIS_URL": module_redis.url, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        runs = end_schedule(client, "skipper")
    assert view.state.skipped >= 1  # ticks came while a run held the tool
    spans = [submitted_and_finished_ms(client, turn_id) for turn_id in runs]
    for (_, finished), (next_submitted, _) in itertools.pairwise(spans):
        assert next_submitted >= finished  # the next run was submitted only after the previous one ended
    for turn_id in runs:
        turn = client.get(turn_id)
        assert (turn.request.schedule, turn.status) == ("skipper", "completed")
        assert client.outcome(turn_id) is not None
    line = next(line for line in listed.splitlines() if line.startswith("skipper "))
    name, *timing, overlap, last_day, last_time, last_turn, next_day, next_time, skipped, error = line.split()
    assert (name, timing, overlap, error) == ("skipper", ["every", "1", "s"], "skip", "-")
    assert last_turn in runs and int(skipped) >= 1
    assert f"{next_day} {next_time}" >= f"{last_day} {last_time}" and next_time.endswith("Z")


def test_queue_submits_each_run_while_the_previous_one_runs(
    module_redis: RedisServer, client: Client
) -> None:
    client.schedule(
        "queuer", every_s=1, overlap="queue", prompt=SLOW_RUN, tools=["e2e_sleep"], model="scripted:plan"
    )
    with beats(module_redis.url, "beat-queue"):
        wait_until(lambda: len(runs_oldest_first(client, "queuer")) >= 3, "three runs", timeout_s=60)
        view = view_of(client, "queuer")
        runs = end_schedule(client, "queuer", cancel=True)
    assert view is not None and view.state.skipped == 0
    spans = [submitted_and_finished_ms(client, turn_id) for turn_id in runs[:3]]
    # Each was submitted at its tick, while the one before still ran.
    assert spans[1][0] < spans[0][1] and spans[2][0] < spans[1][1]
    assert all(client.get(turn_id).request.schedule == "queuer" for turn_id in runs)


def test_cancel_previous_cancels_the_running_run_before_submitting_the_next(
    module_redis: RedisServer, client: Client
) -> None:
    client.schedule(
        "canceller",
        every_s=1,
        overlap="cancel_previous",
        prompt=SLOW_RUN,
        tools=["e2e_sleep"],
        model="scripted:plan",
    )
    with beats(module_redis.url, "beat-cancel"):
        wait_until(lambda: len(runs_oldest_first(client, "canceller")) >= 3, "three runs", timeout_s=60)
        runs = end_schedule(client, "canceller", cancel=True)
    # Every run but the last was cancelled by the next one's tick: none of them lived to its 2.5 s tool's end.
    for turn_id in runs[:-1]:
        assert client.get(turn_id).status == "cancelled", turn_id


def test_two_beats_one_active_and_the_other_takes_over_when_it_is_killed(
    module_redis: RedisServer, client: Client, module_redis_client: redis.Redis
) -> None:
    quick = plan_prompt([{"text": "tick"}])
    client.schedule("pair", every_s=1, overlap="queue", prompt=quick, model="scripted:plan")
    with beats(module_redis.url, "beat-a", "beat-b") as (first, second):
        wait_until(lambda: module_redis_client.get(keys.BEAT_LEASE) == b"beat-a", "beat-a holds the lease")
        second.wait_for(lambda: "standing by" in second.log_text(), "beat-b stands by")
        wait_until(lambda: len(runs_oldest_first(client, "pair")) >= 2, "runs by beat-a")
        assert "submitted turn" not in second.log_text()
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
        before = len(runs_oldest_first(client, "pair"))
        wait_until(
            lambda: module_redis_client.get(keys.BEAT_LEASE) == b"beat-b",
            "beat-b took the lease over",
            timeout_s=30,
        )
        wait_until(
            lambda: len(runs_oldest_first(client, "pair")) >= before + 2, "runs by beat-b", timeout_s=30
        )
        assert "active" in second.log_text() and "submitted turn" in second.log_text()
        runs = runs_oldest_first(client, "pair")
        assert client.unschedule("pair")
    assert len(set(runs)) == len(runs)  # no run submitted twice
    for turn_id in runs:
        assert client.wait(turn_id, timeout=30).text == "tick"


def add(redis_url: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TOOLLOOP_BIN), "schedule", "add", *arguments],
        env={**os.environ, "TOOLLOOP_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_bad_schedule_is_refused_with_a_clear_error(module_redis: RedisServer, client: Client) -> None:
    bad_cron = add(module_redis.url, "bad", "--cron", "* * *", "--prompt", "hi")
    assert bad_cron.returncode == 2
    assert bad_cron.stderr.startswith("error: invalid cron expression '* * *': ")
    unknown = add(module_redis.url, "bad", "--every-s", "60", "--prompt", "hi", "--tools", "e2e_sleeep")
    assert unknown.returncode == 2
    assert "e2e_sleeep" in unknown.stderr and "did you mean 'e2e_sleep'" in unknown.stderr
    bad_model = add(module_redis.url, "bad", "--every-s", "60", "--prompt", "hi", "--model", "nonsense")
    assert bad_model.returncode == 2 and bad_model.stderr.startswith("error: ")
    with pytest.raises(UnknownToolError):
        client.schedule("bad", every_s=60, prompt="hi", tools=["e2e_sleeep"])
    assert view_of(client, "bad") is None  # nothing was stored
    removed = subprocess.run(
        [str(TOOLLOOP_BIN), "schedule", "rm", "bad"],
        env={**os.environ, "TOOLLOOP_REDIS_URL": module_redis.url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (removed.returncode, removed.stderr) == (
        1,
        "error: no schedule named 'bad' (toolloop schedules lists them)\n",
    )
    assert json.loads(
        subprocess.run(
            [str(TOOLLOOP_BIN), "schedules", "--json"],
            env={**os.environ, "TOOLLOOP_REDIS_URL": module_redis.url, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    ) == [v.model_dump(mode="json") for v in client.schedules()]
