"""CPU seconds of every process of a run, read from /proc, split by the part each process plays.

A part's CPU is utime + stime of its process and of every live descendant, plus the cutime + cstime of each
(children that ended and were waited for), so that a pool child replaced during a window still counts. Two
parts are read differently:

- the client is the benchmark's own process, without its children: those are the workers, the orchestrator
  and the servers, each counted as a part of its own;
- a worker is split into its parent (the consumer: fetching messages, task events, acks, heartbeats) and
  its pool children (running the tasks).

Plain Celery's worker is a stock `celery worker` of its own when the run starts one (the HTTP variant's,
`plain_celery`: `Processes.celery_worker`); else plain tasks run on toolloop's worker, whose parts count for
both.

The model server is a part of its own, never counted in `all`: it stands for a hosted model whose CPU nobody
running toolloop pays. The API (`toolloop api`) is a part when a run starts one (the first-token scenario).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_CLK_TCK = os.sysconf("SC_CLK_TCK")

CLIENT = "client"
WORKER_PARENT = "worker_parent"
WORKER_CHILDREN = "worker_children"
REDIS = "redis"
ORCHESTRATOR = "orchestrator"
MODEL_SERVER = "model_server"
API = "api"
CELERY_WORKER_PARENT = "celery_worker_parent"
CELERY_WORKER_CHILDREN = "celery_worker_children"
# What "all processes" sums, for toolloop and for plain Celery (which has no orchestrator).
TOOLLOOP_PARTS = (CLIENT, WORKER_PARENT, WORKER_CHILDREN, REDIS, ORCHESTRATOR)
CELERY_PARTS = (CLIENT, CELERY_WORKER_PARENT, CELERY_WORKER_CHILDREN, REDIS)
WORKER_PARTS = (WORKER_PARENT, WORKER_CHILDREN)
CELERY_WORKER_PARTS = (CELERY_WORKER_PARENT, CELERY_WORKER_CHILDREN)


@dataclass(frozen=True)
class _Entry:
    ppid: int
    own_s: float  # utime + stime
    reaped_s: float  # cutime + cstime


@dataclass(frozen=True)
class Processes:
    """The process ids of a run's parts."""

    client: int
    worker: int
    redis: int
    orchestrator: int
    model_server: int
    api: int | None = None
    # Plain Celery's own worker (None: plain tasks run on `worker`).
    celery_worker: int | None = None


def _read_entry(stat_path: Path) -> _Entry | None:
    try:
        text = stat_path.read_text()
    except OSError:  # gone between the listing and the read
        return None
    # After the command name (which may hold spaces and parentheses): state, ppid, … utime is the 12th.
    fields = text.rsplit(")", 1)[1].split()
    ticks = [int(f) for f in fields[11:15]]
    return _Entry(int(fields[1]), (ticks[0] + ticks[1]) / _CLK_TCK, (ticks[2] + ticks[3]) / _CLK_TCK)


def _process_table() -> dict[int, _Entry]:
    table: dict[int, _Entry] = {}
    for path in Path("/proc").iterdir():
        if path.name.isdigit():
            entry = _read_entry(path / "stat")
            if entry is not None:
                table[int(path.name)] = entry
    return table


def _tree_s(table: Mapping[int, _Entry], root: int) -> float:
    children: dict[int, list[int]] = {}
    for pid, entry in table.items():
        children.setdefault(entry.ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        found = table.get(pid)
        if found is not None:
            total += found.own_s + found.reaped_s
            todo.extend(children.get(pid, []))
    return total


def _worker_s(table: Mapping[int, _Entry], pid: int) -> tuple[float, float]:
    # A worker's parent, and its pool children (with theirs).
    parent = table.get(pid)
    parent_s = parent.own_s if parent is not None else 0.0
    return parent_s, _tree_s(table, pid) - parent_s


def read_parts_s(procs: Processes) -> dict[str, float]:
    """CPU seconds each part used so far."""
    table = _process_table()
    client = table.get(procs.client)
    parent_s, children_s = _worker_s(table, procs.worker)
    celery_parent_s, celery_children_s = (
        _worker_s(table, procs.celery_worker) if procs.celery_worker is not None else (parent_s, children_s)
    )
    return {
        CLIENT: client.own_s if client is not None else 0.0,
        WORKER_PARENT: parent_s,
        WORKER_CHILDREN: children_s,
        CELERY_WORKER_PARENT: celery_parent_s,
        CELERY_WORKER_CHILDREN: celery_children_s,
        REDIS: _tree_s(table, procs.redis),
        ORCHESTRATOR: _tree_s(table, procs.orchestrator),
        MODEL_SERVER: _tree_s(table, procs.model_server),
        API: _tree_s(table, procs.api) if procs.api is not None else 0.0,
    }


@dataclass(frozen=True)
class Window:
    """What the parts used while `units` calls (or tasks) ran: CPU seconds by part, and the wall time."""

    units: int
    cpu_s: dict[str, float]
    wall_s: float

    def ms_per_unit(self, *parts: str) -> float:
        """CPU ms per call (or task) of the sum of `parts`."""
        return 1000 * sum(self.cpu_s[p] for p in parts) / self.units

    def breakdown_ms(self, parts: tuple[str, ...]) -> dict[str, float]:
        """Per call, by part: what a JSON line shows (rounded to the µs)."""
        return {p: round(self.ms_per_unit(p), 3) for p in parts}

    @property
    def rate_per_s(self) -> float:
        """Calls (or tasks) per second of wall time."""
        return self.units / self.wall_s


class CpuWatch:
    """Reads the parts before and after a stretch of work: `watch.start()`, the work, `watch.stop(units)`."""

    def __init__(self, procs: Processes) -> None:
        self._procs = procs
        self._before: dict[str, float] = {}
        self._t0 = 0.0

    def start(self) -> None:
        """Read every part now."""
        self._before = read_parts_s(self._procs)
        self._t0 = time.perf_counter()

    def stop(self, units: int, *, settle_s: float = 0.0) -> Window:
        """What every part used since `start`, for `units` calls or tasks. The wall time ends now; the CPU
        is read `settle_s` later, so that the work finishing after the client saw its answer (acks, task
        events, a turn's last writes) counts too."""
        wall_s = time.perf_counter() - self._t0
        time.sleep(settle_s)
        after = read_parts_s(self._procs)
        return Window(units, {part: after[part] - self._before[part] for part in after}, wall_s)


def add_windows(windows: list[Window]) -> Window:
    """Windows of the same kind taken in turns, as one."""
    parts = windows[0].cpu_s
    return Window(
        sum(w.units for w in windows),
        {p: sum(w.cpu_s[p] for w in windows) for p in parts},
        sum(w.wall_s for w in windows),
    )


def read_loadavg() -> str:
    """The 1, 5 and 15 minute load averages (how busy the machine was)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"
