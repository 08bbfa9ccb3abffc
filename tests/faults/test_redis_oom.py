"""Redis out of memory (issue 12, item 1): `maxmemory` with `noeviction`, filled by a burst of turns whose
tool returns ~200 kB, then memory freed (`CONFIG SET maxmemory 0`).

While Redis refuses writes nothing exits: the orchestrator's loops and steps retry (and say so: one line of
what kind of outage it is, one when it is over), the worker keeps each finished result and writes it again.
Once memory is freed every turn goes on to its end without a restart, and no result whose tool body finished
is lost: each such call is answered with its success, never `deadline_exceeded`, `worker_lost` or `timeout`.
The quick variant runs in `make test`, the long one (50 turns, twice) in `make test-faults`.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.model import ToolMessage, TurnOutcome
from tests.faults.env import FaultEnv, call
from tests.faults.oom_tools import read_finished
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e]

OOM_TOOLS = ("tests.faults.oom_tools",)
OUT_OF_MEMORY_LINE = "refuses writes: out of memory"
BACK_LINE = "is back after"


@dataclass(frozen=True)
class Burst:
    turns: int
    repeats: int
    # Memory Redis may still take once the burst is submitted: a few results' worth, so it fills at once.
    headroom_bytes: int
    # How long Redis stays full once it refused a write, while every process retries.
    full_s: float
    # The turns' deadline: far beyond what they need, so that a turn that ends `stopped` shows a call lost.
    deadline_s: float


QUICK = Burst(turns=6, repeats=1, headroom_bytes=512 * 1024, full_s=3.0, deadline_s=90)
LONG = Burst(turns=50, repeats=2, headroom_bytes=2 * 1024 * 1024, full_s=10.0, deadline_s=240)
BURSTS = [
    pytest.param(QUICK, id="quick", marks=pytest.mark.timeout(240)),
    pytest.param(LONG, id="long", marks=[pytest.mark.faults, pytest.mark.timeout(900)]),
]


def _oom_refusals(env: FaultEnv) -> int:
    """How many commands Redis refused for want of memory so far."""
    stats: dict[str, Any] = env.redis.info("errorstats")
    return int(stats.get("errorstat_OOM", {}).get("count", 0))


def _fill_then_free(env: FaultEnv, burst: Burst, record_dir: Path) -> list[str]:
    """Submit a burst into a Redis that is nearly full; hold it full for `full_s`, then free its memory."""
    refused_before = _oom_refusals(env)
    used = int(env.redis.info("memory")["used_memory"])
    env.redis.config_set("maxmemory-policy", "noeviction")
    # Room for the submissions, not for the results.
    env.redis.config_set("maxmemory", used + burst.headroom_bytes + burst.turns * 16 * 1024)
    ids = [
        env.submit(
            [call("oom_bulky", tag=uuid.uuid4().hex[:12], record_dir=str(record_dir), seconds=0.2)],
            deadline_s=burst.deadline_s,
        )
        for _ in range(burst.turns)
    ]
    wait_until(lambda: _oom_refusals(env) > refused_before, "Redis to refuse a write for want of memory")
    time.sleep(burst.full_s)  # the fault itself: how long Redis stays full
    env.redis.config_set("maxmemory", 0)
    return ids


def _check_no_result_lost(outcomes: list[TurnOutcome], record_dir: Path) -> None:
    answers = [m for o in outcomes for m in o.messages if isinstance(m, ToolMessage)]
    ok_tags = {m.content.split(" ", 1)[0] for m in answers if not m.is_error}
    failures = Counter(str(m.failure_kind) for m in answers if m.is_error)
    lost = read_finished(record_dir) - ok_tags
    assert not lost, (
        f"{len(lost)} results whose tool body finished were not answered ok; failures: {failures}"
    )


def _check_alive(env: FaultEnv) -> None:
    for proc in env.orchestrators:
        code = proc.process.poll()
        assert code is None, f"the orchestrator exited ({code}):\n{_tail(proc.log_text())}"
    for worker in env.workers:
        code = worker.process.poll()
        assert code is None, f"the worker exited ({code}):\n{_tail(worker.log_text())}"


def _tail(log: str) -> str:
    """The end of a process's log, and its first traceback (what made it exit is often told early)."""
    first = log.find("Traceback")
    head = log[max(first - 300, 0) : first + 3000] if first >= 0 else ""
    return f"{head}\n…\n{log[-3000:]}"


@pytest.mark.parametrize("burst", BURSTS)
def test_redis_out_of_memory_then_freed(burst: Burst, tmp_path: Path) -> None:
    with FaultEnv() as env:
        env.start_worker(concurrency=4, modules=OOM_TOOLS)
        orchestrator = env.start_orchestrator(env={"TOOLLOOP_LOG_LEVEL": "INFO"})
        for repeat in range(burst.repeats):
            record_dir = tmp_path / f"burst-{repeat}"
            record_dir.mkdir()
            ids = _fill_then_free(env, burst, record_dir)
            try:
                outcomes = env.wait_all(ids, burst.deadline_s + 30)
            except TimeoutError:
                _check_alive(env)  # a process that exited is the reason to name
                raise
            _check_alive(env)
            _check_no_result_lost(outcomes, record_dir)
            statuses = Counter(o.status for o in outcomes)
            assert statuses == {"completed": burst.turns}, statuses
        # The outage was told for what it was, and its end too (once writes pass for a while).
        wait_until(lambda: BACK_LINE in orchestrator.log_text(), "the orchestrator to say Redis is back")
        told = orchestrator.log_text()
        assert OUT_OF_MEMORY_LINE in told
        assert "Traceback" not in told, told[-4000:]
        # Still serving, without a restart.
        env.wait_all([env.submit([call("oom_bulky", tag="after", record_dir=str(tmp_path))])], 60)
        _check_alive(env)
