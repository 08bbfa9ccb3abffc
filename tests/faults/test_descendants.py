"""No process a tool starts outlives its call's hard kill or its worker (issue 12, item 5).

Real prefork workers serve `tests.faults.descendant_tools`, whose tools start `sleep 600` four ways (in the
pool process's group, in a session of their own, double-forked into a new session, left by a shell) and record
the pids. After a hard kill every recorded process is gone (killed and reaped) while the worker lives on; the
children of a call that returned stay until the worker stops, and are gone once it has (warm or cold).

A recorded pid counts as alive while `/proc/<pid>` exists: a zombie the worker failed to reap counts too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.faults.descendant_tools import KINDS
from tests.faults.env import FaultEnv
from tests.support.process_groups import signal_group
from tests.support.processes import WorkerHandle
from tests.support.waiting import wait_for, wait_until
from workers.contract import FailureKind
from workers.descendants import (
    SWEEP_INTERVAL_S,
    kill_subtree,
    read_stat,
    read_subtree,
    reap_adopted_zombies,
)
from workers.shutdown import EXIT_FORCED

pytestmark = [pytest.mark.e2e]

MODULE = "tests.faults.descendant_tools"


@dataclass(frozen=True)
class Size:
    concurrency: int
    rounds: int
    stop_signal: signal.Signals


QUICK = Size(concurrency=2, rounds=1, stop_signal=signal.SIGTERM)
LONG_WARM = Size(concurrency=2, rounds=4, stop_signal=signal.SIGTERM)
LONG_COLD = Size(concurrency=3, rounds=3, stop_signal=signal.SIGQUIT)
SIZES = [
    pytest.param(QUICK, id="quick", marks=pytest.mark.timeout(90)),
    pytest.param(LONG_WARM, id="long-warm", marks=[pytest.mark.faults, pytest.mark.timeout(300)]),
    pytest.param(LONG_COLD, id="long-cold", marks=[pytest.mark.faults, pytest.mark.timeout(300)]),
]


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def _running(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is not None and stat.state != "Z"


def _recorded(record_dir: Path) -> dict[str, int]:
    return {kind: int((record_dir / f"{kind}.pid").read_text()) for kind in KINDS}


def _left_alive(pids: dict[str, int]) -> dict[str, int]:
    return {k: p for k, p in pids.items() if _alive(p)}


def _wait_gone(pids: dict[str, int], after: str) -> None:
    """Until every process of `pids` is gone (killed and reaped); fail naming those that outlived `after`."""
    wait_until(
        lambda: not _left_alive(pids),
        f"every process to end after {after}",
        detail=lambda: f"outlived it: {_describe(_left_alive(pids))}",
    )


def _describe(left: dict[str, int]) -> str:
    lines = []
    for key, pid in left.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            lines.append(f"{key}={pid} (state {stat[0]}, parent {stat[1]})")
        except OSError:
            lines.append(f"{key}={pid} (gone meanwhile)")
    return ", ".join(lines)


def _call(env: FaultEnv, tool: str, record_dir: Path) -> tuple[Path, FailureKind | None, str]:
    outcome = env.client.call_tool(tool, {"record_dir": str(record_dir)}, timeout_s=60)
    return record_dir, outcome.failure_kind, outcome.error or ""


def _stop(worker: WorkerHandle, signum: signal.Signals) -> int:
    os.kill(worker.pid, signum)
    return worker.process.wait(timeout=60)


@pytest.mark.parametrize("size", SIZES)
def test_no_descendant_outlives_a_hard_kill_or_the_worker(size: Size, tmp_path: Path) -> None:
    with FaultEnv() as env:
        worker = env.start_worker(concurrency=size.concurrency, modules=(MODULE,))
        for round_ in range(size.rounds):
            dirs = [tmp_path / f"hang-{round_}-{i}" for i in range(size.concurrency)]
            with ThreadPoolExecutor(size.concurrency) as calls:
                answers = list(calls.map(lambda d: _call(env, "spawn_and_hang", d), dirs))
            killed: dict[str, int] = {}
            for record_dir, kind, error in answers:
                assert kind == FailureKind.TIMEOUT and "hard limit" in error, (kind, error)
                killed |= {f"{record_dir.name}/{k}": pid for k, pid in _recorded(record_dir).items()}
            _wait_gone(killed, "the hard kill of their call")

        # A call that returns leaves its children to its pool process: the sweeps end neither them nor the
        # worker's own processes, and the worker still serves.
        pool = worker.child_pids()
        kept_dir = tmp_path / "returned"
        _, kind, error = _call(env, "spawn_and_return", kept_dir)
        assert kind is None, error
        kept = {f"returned/{k}": pid for k, pid in _recorded(kept_dir).items()}
        # Not a synchronisation: sweeps leave no trace, so they are given a window in which they would end
        # these processes, were they to (an orphan is ended at its second sweep).
        time.sleep(8 * SWEEP_INTERVAL_S)
        assert all(_alive(pid) for pid in kept.values()), _describe(kept)
        assert worker.child_pids() == pool

        _stop(worker, size.stop_signal)
        _wait_gone(kept, f"the worker's {size.stop_signal.name} stop")


# --- the /proc helpers on real process trees ------------------------------------------------------------


def test_kill_subtree_ends_a_whole_tree() -> None:
    shell = subprocess.Popen(
        ["sh", "-c", "sleep 600 & sh -c 'sleep 600 & wait' & wait"], start_new_session=True
    )
    try:
        tree = wait_for(
            lambda: found if len(found := read_subtree(shell.pid)) >= 4 else None, "the whole tree started"
        )
        assert tree[0] == shell.pid and len(tree) == 4, tree  # sh, sleep, sh, sleep: parents first
        assert set(kill_subtree(shell.pid)) == set(tree)
        shell.wait(timeout=10)
        # The others were re-parented to init (or a subreaper above the test): dead, reaped there or not.
        wait_until(lambda: not any(_running(p) for p in tree[1:]), "the whole tree to end")
    finally:
        signal_group(shell, signal.SIGKILL)
        shell.wait(timeout=10)


SUBREAPER_SCRIPT = """
import os, subprocess, sys
from tests.support.waiting import wait_until
from workers.descendants import become_subreaper, read_children, read_stat, reap_adopted_zombies
assert become_subreaper()
held = subprocess.Popen(["true"])
subprocess.run(["sh", "-c", "sleep 0.2 &"], check=True)   # an orphan this process adopts, then a zombie
def zombies():
    stats = [read_stat(pid) for pid in read_children(os.getpid())]
    return [stat for stat in stats if stat is not None and stat.state == "Z"]
wait_until(lambda: len(zombies()) == 2, "the held child and the adopted orphan to exit", timeout_s=20)
held_zombie = held.pid in read_children(os.getpid())
reaped = reap_adopted_zombies()
print(held_zombie, held.pid in reaped, len(reaped), held.wait(), read_children(os.getpid()))
"""


def test_a_pool_process_reaps_the_orphans_it_adopted_never_a_popen_it_holds() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SUBREAPER_SCRIPT],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    # The held child is a zombie its Popen still owns: left alone, so wait() gets its real exit status (0);
    # the one adopted orphan is reaped; nothing is left.
    assert result.stdout.split() == ["True", "False", "1", "0", "[]"], result


def test_reap_adopted_zombies_is_a_no_op_without_children() -> None:
    assert reap_adopted_zombies() == []


@pytest.mark.faults
@pytest.mark.timeout(120)
def test_a_worker_forced_out_by_its_stop_watchdog_leaves_no_descendant(tmp_path: Path) -> None:
    """Redis frozen, so the warm stop hangs and `workers.shutdown`'s watchdog exits the worker at once."""
    with FaultEnv() as env:
        worker = env.start_worker(concurrency=2, modules=(MODULE,))
        _, kind, error = _call(env, "spawn_and_return", tmp_path / "returned")
        assert kind is None, error
        kept = _recorded(tmp_path / "returned")
        redis_pid = env.server.pid
        assert redis_pid is not None
        os.kill(redis_pid, signal.SIGSTOP)
        try:
            code = _stop(worker, signal.SIGTERM)
        finally:
            os.kill(redis_pid, signal.SIGCONT)
        assert code == EXIT_FORCED, worker.log_text()[-3000:]
        _wait_gone(kept, "the worker's forced exit")
