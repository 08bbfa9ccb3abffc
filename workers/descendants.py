"""No process a tool call starts outlives the pool process that ran it, nor the worker (issue 12, item 5).

A tool may start processes: in its pool process's group (`subprocess.Popen`), in a session of their own
(`start_new_session=True`, `setsid`), or detached by a double fork. When the hard time limit SIGKILLs the pool
process they would be re-parented to init and run on for ever. Instead (Linux; elsewhere one log line and
nothing more):

- the worker's main process is a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`): a process whose parent
  dies anywhere below it is re-parented to it, not to init: neither a new session nor a double fork escapes;
- each pool process is a child subreaper too, so whatever a call starts stays in that pool process's subtree
  while it lives. The main process's own children are then its pool processes, the processes it had before
  it began serving (spared), and orphans of a pool process that is gone;
- every `SWEEP_INTERVAL_S`, on the worker's event loop (the thread that also starts and reaps pool
  processes), the main process SIGKILLs each such orphan with its whole subtree and reaps it. An orphan is
  acted on when two sweeps in a row saw it outside the pool: a pool process being started by another thread
  (`--autoscale`) is never taken for one. A hard kill, a crash, a revoke with terminate and a pool process
  replaced after its max tasks all end this way;
- at the worker's stop (warm: `worker_shutdown`; cold or any exit: `atexit`) every descendant ends.

A process a tool leaves running when it returns normally lives on beside its pool process (a tool may start
a helper it reuses), and ends with it: when that process is replaced, or when the worker stops. Between calls
a pool process reaps the zombies of the orphans it adopted, never a child that a live `Popen` still owns.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import logging
import multiprocessing.popen_fork
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, bootsteps, signals

logger = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
# How often the main process looks for orphans: an orphan ends within two sweeps of its pool process's death.
SWEEP_INTERVAL_S = 0.25
# How long a stopping worker waits for its descendants to die and be reaped.
END_TIMEOUT_S = 3.0
_END_POLL_S = 0.02
_ZOMBIE = "Z"

Identity = tuple[int, int]  # (pid, start time in clock ticks): a pid that cannot be mistaken for a reused one


@dataclass(frozen=True)
class ProcStat:
    """What the reaper reads from `/proc/<pid>/stat`."""

    state: str
    ppid: int
    start_ticks: int


@dataclass(frozen=True)
class SweepPlan:
    """One sweep's work: SIGKILL the subtrees of `kill`, reap `reap`; `suspects` wait for the next sweep."""

    kill: tuple[int, ...] = ()
    reap: tuple[int, ...] = ()
    suspects: frozenset[Identity] = frozenset()


def parse_stat(text: str) -> ProcStat | None:
    """The state, parent and start time of a `/proc/<pid>/stat` line; None when it is not one.

    The command name (2nd field) may hold spaces and parentheses, so fields are counted from its last `)`.
    """
    _, closing, rest = text.rpartition(")")
    fields = rest.split()
    if not closing or len(fields) < 20:
        return None
    try:
        return ProcStat(state=fields[0], ppid=int(fields[1]), start_ticks=int(fields[19]))
    except ValueError:
        return None


def build_sweep_plan(
    children: Mapping[int, ProcStat],
    pool: AbstractSet[int],
    spared: AbstractSet[Identity],
    suspects: AbstractSet[Identity],
) -> SweepPlan:
    """Which children of the main process to end (pure).

    A child is an orphan when it is neither a pool process nor spared. An orphan seen by the previous sweep
    too (`suspects`) is killed, or reaped when it is already a zombie; one seen first now becomes a suspect.
    """
    kill: list[int] = []
    reap: list[int] = []
    seen: set[Identity] = set()
    for pid, stat in sorted(children.items()):
        identity = (pid, stat.start_ticks)
        if pid in pool or identity in spared:
            continue
        if identity not in suspects:
            seen.add(identity)
        elif stat.state == _ZOMBIE:
            reap.append(pid)
        else:
            kill.append(pid)
            seen.add(identity)  # still a suspect until reaped
    return SweepPlan(kill=tuple(kill), reap=tuple(reap), suspects=frozenset(seen))


# --- /proc ----------------------------------------------------------------------------------------------


def read_stat(pid: int) -> ProcStat | None:
    """`/proc/<pid>/stat` parsed; None for a process that is gone."""
    raw = _read_proc(f"/proc/{pid}/stat")
    return parse_stat(raw.decode("utf-8", "replace")) if raw is not None else None


def read_children(pid: int) -> list[int]:
    """The children of `pid`, from `/proc/<pid>/task/*/children` (every thread may have forked)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children: list[int] = []
    for task in tasks:
        raw = _read_proc(f"/proc/{pid}/task/{task}/children")
        children += [int(child) for child in raw.split()] if raw is not None else []
    return children


def _read_proc(path: str) -> bytes | None:
    # os.read, not open(): a sweep reads a handful of these, and a text file object costs 3x the read.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_subtree(root: int) -> list[int]:
    """`root` and every descendant of it, parents before their children."""
    found = [root]
    index = 0
    while index < len(found):
        found += [child for child in read_children(found[index]) if child not in found]
        index += 1
    return found


def kill_subtree(root: int) -> list[int]:
    """SIGKILL `root` and its descendants, as they are now; returns the pids signalled.

    A descendant forked meanwhile is not lost: its parent dies, so it is re-parented to the subreaper and the
    next sweep finds it.
    """
    signalled: list[int] = []
    for pid in read_subtree(root):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            signalled.append(pid)
    return signalled


def reap(pid: int) -> bool:
    """Collect the exit status of our child `pid` if it is dead; True when it is gone (reaped or not ours)."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return reaped == pid


def become_subreaper() -> bool:
    """Mark this process a child subreaper (Linux); False where the platform cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


# --- the worker's main process ----------------------------------------------------------------------------


@dataclass
class Reaper:
    """Ends the orphans of the pool processes of the worker whose main process is `main_pid`."""

    main_pid: int
    pool_pids: Callable[[], frozenset[int] | None]
    spared: frozenset[Identity] = frozenset()
    _suspects: frozenset[Identity] = field(default=frozenset(), init=False)

    @classmethod
    def start(cls, main_pid: int, pool_pids: Callable[[], frozenset[int] | None]) -> Reaper:
        """A reaper that spares the children `main_pid` has now besides its pool (started by tool modules
        at import, say): they are the main process's own, not a call's."""
        pool = pool_pids() or frozenset()
        own = _stats(read_children(main_pid))
        spared = frozenset((pid, stat.start_ticks) for pid, stat in own.items() if pid not in pool)
        return cls(main_pid, pool_pids, spared)

    def sweep(self) -> list[int]:
        """One look for orphans: kill those seen twice, reap the dead; returns the pids signalled."""
        pool = self.pool_pids()
        if pool is None:
            return []
        others = [pid for pid in read_children(self.main_pid) if pid not in pool]
        plan = build_sweep_plan(_stats(others), pool, self.spared, self._suspects)
        self._suspects = plan.suspects
        for pid in plan.reap:
            reap(pid)
        signalled = [pid for root in plan.kill for pid in kill_subtree(root)]
        if signalled:
            logger.warning(
                "ended %d process(es) a tool call started, left behind by a pool process that is gone: %s",
                len(signalled),
                ", ".join(map(str, signalled)),
            )
        return signalled

    def end_all(self, timeout_s: float = END_TIMEOUT_S) -> list[int]:
        """At the worker's stop: end every descendant but the spared (`end_descendants`)."""
        return end_descendants(self.main_pid, spared=self.spared, timeout_s=timeout_s)


def end_descendants(
    main_pid: int, *, spared: AbstractSet[Identity] = frozenset(), timeout_s: float = END_TIMEOUT_S
) -> list[int]:
    """SIGKILL every descendant of `main_pid` (this process) but the `spared` children and their subtrees,
    and reap them, for `timeout_s` at most; returns the pids of the live processes ended.

    For a worker that stops, pool processes included: whatever a call started must not outlive it.
    """
    deadline = time.monotonic() + timeout_s
    ended: set[int] = set()
    while True:
        children = _stats(read_children(main_pid))
        left = [pid for pid, stat in children.items() if (pid, stat.start_ticks) not in spared]
        for pid in left:
            if children[pid].state != _ZOMBIE:
                ended |= set(kill_subtree(pid))
        if all([reap(pid) for pid in left]) or time.monotonic() > deadline:
            break
        time.sleep(_END_POLL_S)
    if ended:
        logger.info("ended %d process(es) left by tool calls at the worker's stop", len(ended))
    return sorted(ended)


def _stats(pids: Iterable[int]) -> dict[int, ProcStat]:
    stats = {pid: read_stat(pid) for pid in pids}
    return {pid: stat for pid, stat in stats.items() if stat is not None}


def read_pool_pids(worker: Any) -> frozenset[int] | None:
    """The pids of a prefork worker's pool processes (billiard's list); None for a pool without processes."""
    processes = getattr(getattr(getattr(worker, "pool", None), "_pool", None), "_pool", None)
    if not isinstance(processes, list):
        return None
    return frozenset(pid for process in processes if isinstance(pid := getattr(process, "pid", None), int))


class DescendantReaper(bootsteps.StartStopStep):
    """The worker bootstep: the main process becomes a subreaper and sweeps its orphans on the event loop."""

    label = "toolloop descendants"
    requires = ("celery.worker.components:Pool",)

    def start(self, parent: Any) -> None:
        """Become a subreaper, sweep every `SWEEP_INTERVAL_S`, end every descendant at the stop."""
        if read_pool_pids(parent) is None:
            logger.info("processes started by tools are ended only with a prefork pool; this pool is not")
            return
        if not become_subreaper():
            logger.warning(
                "processes started by tools may outlive their call: no child subreaper on %s", sys.platform
            )
            return
        reaper = Reaper.start(os.getpid(), lambda: read_pool_pids(parent))
        hub = getattr(parent, "hub", None)
        if hub is not None:
            hub.call_repeatedly(SWEEP_INTERVAL_S, reaper.sweep)
        else:
            logger.warning("no event loop: processes left by killed tool calls end at the worker's stop")

        def on_worker_shutdown(**_: Any) -> None:
            reaper.end_all()

        def at_exit() -> None:
            if os.getpid() == reaper.main_pid:  # never in a forked child that inherited the registration
                reaper.end_all()

        signals.worker_shutdown.connect(on_worker_shutdown, weak=False, dispatch_uid="toolloop-descendants")
        atexit.register(at_exit)


# --- a pool process ---------------------------------------------------------------------------------------


def owned_child_pids() -> set[int]:
    """The pids that a live `subprocess.Popen` or multiprocessing process object of this process has not
    collected yet: their owner will, and must get the real exit status."""
    owners = (subprocess.Popen, multiprocessing.popen_fork.Popen)
    return {
        obj.pid
        for obj in gc.get_objects()
        if isinstance(obj, owners) and obj.returncode is None and isinstance(obj.pid, int)
    }


def reap_adopted_zombies() -> list[int]:
    """Reap the dead orphans this subreaper adopted (a daemon a call double-forked that has exited)."""
    try:  # one system call says whether any child is dead, without collecting it: the usual answer is no
        dead = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return []
    if dead is None:
        return []
    me = os.getpid()
    zombies = [pid for pid in read_children(me) if (stat := read_stat(pid)) and stat.state == _ZOMBIE]
    if not zombies:
        return []
    owned = owned_child_pids()  # walks the heap: only when there is a zombie to tell apart
    return [pid for pid in zombies if pid not in owned and reap(pid)]


@dataclass
class _PoolProcess:
    subreaper: bool = False


def connect_descendant_reaper(app: Celery) -> None:
    """Register the main process's sweep (a bootstep) and the pool processes' part (signals) for `app`."""
    app.steps["worker"].add(DescendantReaper)
    pool_process = _PoolProcess()

    def on_pool_process_init(**_: Any) -> None:
        pool_process.subreaper = become_subreaper()

    def on_task_postrun(**_: Any) -> None:
        if pool_process.subreaper:
            reap_adopted_zombies()

    signals.worker_process_init.connect(
        on_pool_process_init, weak=False, dispatch_uid="toolloop-descendants-init"
    )
    signals.task_postrun.connect(on_task_postrun, weak=False, dispatch_uid="toolloop-descendants-postrun")
