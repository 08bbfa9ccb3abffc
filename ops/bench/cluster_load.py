"""The turn state on a Redis Cluster (issue 35 item 3): how a burst's Redis commands fall across a local
three-master cluster, and what a tool call costs there.

A stack of its own: a cluster of three masters and three replicas (`ops.redis_cluster`), the broker on a
Redis of its own (a cluster keeps no Celery queue), one `toolloop worker` of two prefork processes and two
orchestrators with the instant model, every process with `TOOLLOOP_REDIS_CLUSTER=true`. After a warm-up, a
burst of turns of the bench's no-op calls is submitted at once and waited for; each master's `INFO
commandstats` (commands run inside scripts included; the cluster's own housekeeping left out) is read around
it, and each master's CPU (`INFO cpu`). The rows: the largest distance of a master's commands from the
masters' mean (the goal: within 25 %), the commands and the Redis CPU per tool call over the whole cluster,
and the burst's turns a second.

A turn's own keys go to the slot of its id: with few turns, chance alone spreads them unevenly, so the full
run's burst is large enough (900 turns) for the spread to say what the layout does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ops.bench.procs import Proc, start_orchestrator, start_worker
from ops.bench.report import Metric, with_goal
from ops.bench.scenarios import Sizes, submit_turn, wait_completed
from ops.bench.tools import BENCH_QUEUE, NOOP_TOOL
from ops.redis_cluster import RedisCluster
from orchestrator import Client
from orchestrator.redis_server import RedisServer
from orchestrator.settings import Settings
from workers import keys

# Issue 35's goal: every master within 25 % of the masters' mean.
SPREAD_GOAL_PCT = 25.0
ORCHESTRATORS = 2
WORKER_PROCESSES = 2
WARMUP_TURNS = 10

Progress = Callable[[str], None]
Emit = Callable[[Metric], None]


@contextmanager
def cluster_layout(cluster_url: str, broker_url: str) -> Iterator[dict[str, str]]:
    """This process names keys for a cluster while it lasts (as its child processes do, from the
    environment it returns); one Redis's layout again after."""
    env = {keys.CLUSTER_VARIABLE: "true", "TOOLLOOP_BROKER_URL": broker_url}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    keys.use_cluster_layout(True)
    try:
        yield env
    finally:
        keys.use_cluster_layout(False)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def build_spread_pct(counts: dict[int, int]) -> float:
    """The largest distance of one master's commands from the masters' mean, in % of the mean (pure)."""
    mean = sum(counts.values()) / len(counts)
    return max(abs(n - mean) for n in counts.values()) / mean * 100 if mean else 0.0


def run_cluster_load(sizes: Sizes, emit: Emit, progress: Progress) -> None:
    """A burst of `sizes.cluster_turns` turns on a local cluster: the cluster rows."""
    progress(f"a Redis Cluster of three masters: {sizes.cluster_turns} turns at once")
    procs: list[Proc] = []
    with RedisCluster() as cluster, RedisServer() as broker, cluster_layout(cluster.url, broker.url) as env:
        settings = Settings(redis_url=cluster.url, redis_cluster=True, broker_url=broker.url)
        client = Client(cluster.url, settings=settings)
        try:
            procs.append(
                start_worker(cluster.url, queues=[BENCH_QUEUE], concurrency=WORKER_PROCESSES, env=env)
            )
            procs += [start_orchestrator(cluster.url, env) for _ in range(ORCHESTRATORS)]
            for turn_id in [submit_turn(client, NOOP_TOOL, 1) for _ in range(WARMUP_TURNS)]:
                wait_completed(client, turn_id)
            calls_per_turn = sizes.calls_per_turn
            cluster.reset_stats()
            cpu_before = cluster.cpu_seconds()
            started = time.monotonic()
            ids = [submit_turn(client, NOOP_TOOL, calls_per_turn) for _ in range(sizes.cluster_turns)]
            for turn_id in ids:
                wait_completed(client, turn_id, timeout_s=300)
            took_s = time.monotonic() - started
            counts = cluster.command_counts()
            cpu_after = cluster.cpu_seconds()
        finally:
            for proc in reversed(procs):
                proc.stop()
            client.close()
    calls = sizes.cluster_turns * calls_per_turn
    by_master = {str(port): n for port, n in sorted(counts.items())}
    extra = {"turns": sizes.cluster_turns, "calls_per_turn": calls_per_turn, "commands_by_master": by_master}
    emit(
        with_goal(
            "cluster_commands_spread_pct",
            round(build_spread_pct(counts), 1),
            "%",
            limit=SPREAD_GOAL_PCT,
            extra=extra,
        )
    )
    emit(
        Metric(
            "cluster_redis_commands_per_call", round(sum(counts.values()) / calls, 1), "commands", extra=extra
        )
    )
    cpu_ms = {port: 1000 * (cpu_after[port] - cpu_before.get(port, 0.0)) for port in cpu_after}
    cpu_extra = {**extra, "cpu_ms_by_master": {str(p): round(ms) for p, ms in sorted(cpu_ms.items())}}
    emit(
        Metric(
            "cluster_redis_cpu_ms_per_call", round(sum(cpu_ms.values()) / calls, 3), "ms CPU", extra=cpu_extra
        )
    )
    emit(Metric("cluster_turns_per_s", round(sizes.cluster_turns / took_s, 1), "turns/s", extra=extra))
