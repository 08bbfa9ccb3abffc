"""Scheduled turns on real processes: `toolloop beat` (one or two), a prefork worker, an orchestrator and the
scripted model, on the module's own Redis.

Each run of these schedules holds the worker's `e2e_sleep` tool for 2.5 s while ticks come every second.
When a run was submitted and when it ended are read from its events stream (Redis stream ids: one clock).
Every test starts and ends with no schedule stored and no beat running, whatever the test before it did.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial

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
# A beat renews its lease once a third of this has passed, on a loop that turns about once a second. With a
# lease of 2 s, a beat stalled two seconds by a loaded machine lost it to the standby, for good (the standby
# renews it); with 10 s, a stall of five seconds is ridden out, and a standby takes over 10 s after a kill.
LEASE_TTL_S = 10


@contextmanager
def beats(redis_url: str, *ids: str) -> Iterator[list[Served]]:
    """`toolloop beat` processes with these ids, each started once the one before is settled: the first once
    it holds the lease (a lease a killed beat left expires first), each other once it stands by. Stopped
    after, whatever happened (`stop_beat`)."""
    env = {"TOOLLOOP_REDIS_URL": redis_url}
    with ExitStack() as stack:
        started: list[Served] = []
        for beat_id in ids:
            served = start_toolloop(["beat", "--id", beat_id, "--lease-ttl-s", str(LEASE_TTL_S)], env)
            stack.callback(stop_beat, served)
            started.append(served)
            settled = f"beat {beat_id}: active" if len(started) == 1 else f"beat {beat_id}: standing by"
            served.wait_for(partial(has_logged, served, settled), f"'{settled}' in its log")
        yield started


def has_logged(served: Served, text: str) -> bool:
    return text in served.log_text()


def stop_beat(served: Served) -> None:
    """SIGTERM, on which a beat releases its lease (the next test's beat takes it at once), then SIGKILL of
    whatever is left of its process group."""
    if served.process.poll() is None:
        served.stop_with(signal.SIGTERM, within_s=15)
    served.kill()


@pytest.fixture(autouse=True)
def no_schedule_left(client: Client) -> Iterator[None]:
    """No schedule before and after each test: one a failed test left would be listed in the next test's
    listings (overdue, its next run reads as the moment of each read) and its runs would load the worker."""
    remove_every_schedule(client)
    yield
    remove_every_schedule(client)


def remove_every_schedule(client: Client) -> None:
    """Remove every schedule and cancel its runs still going (a run that ended ignores the cancel)."""
    for view in client.schedules():
        client.unschedule(view.schedule.name)
        for turn_id in view.state.runs:
            client.cancel(turn_id)


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
    with beats(module_redis.url, "beat-a", "beat-b") as (first, second):
        client.schedule("pair", every_s=1, overlap="queue", prompt=quick, model="scripted:plan")
        assert module_redis_client.get(keys.BEAT_LEASE) == b"beat-a"
        wait_until(lambda: len(runs_oldest_first(client, "pair")) >= 2, "runs by beat-a")
        assert "submitted turn" not in second.log_text()
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
        # Runs by beat-a, some perhaps submitted after the read above; the schedule keeps its last 20 only.
        by_first = set(runs_oldest_first(client, "pair"))
        wait_until(
            lambda: module_redis_client.get(keys.BEAT_LEASE) == b"beat-b",
            "beat-b took the lease over",
            detail=second.log_text,
        )
        wait_until(
            lambda: len(set(runs_oldest_first(client, "pair")) - by_first) >= 2,
            "runs by beat-b",
            detail=second.log_text,
        )
        assert "active" in second.log_text() and "submitted turn" in second.log_text()
        runs = runs_oldest_first(client, "pair")
        assert client.unschedule("pair")
    assert len(set(runs)) == len(runs)  # no run submitted twice
    for turn_id in runs:
        assert client.wait(turn_id, timeout=60).text == "tick"


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
    # Stored beside the refusals, and due in an hour: with no beat running, both listings below read the
    # same state and the same next run.
    client.schedule("kept", every_s=3600, prompt="hi", model="scripted:plan")
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
    listed = json.loads(
        subprocess.run(
            [str(TOOLLOOP_BIN), "schedules", "--json"],
            env={**os.environ, "TOOLLOOP_REDIS_URL": module_redis.url, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    )
    assert listed == [v.model_dump(mode="json") for v in client.schedules()]
    assert [view["schedule"]["name"] for view in listed] == ["kept"]
