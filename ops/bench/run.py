"""One benchmark run: its own Redis, workers and orchestrators, every scenario, every figure.

Order matters: the scenarios that need an orchestrator free of other turns come first; the 10,000 parked
turns come last, in an orchestrator of their own, so that its RSS and idle CPU are theirs alone.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from celery import Celery

from ops.bench import reactions, scenarios, storage, streaming
from ops.bench.instant import MODEL_CPU_FILE_ENV
from ops.bench.plain_celery import PLAIN_QUEUE, PLAIN_TASK
from ops.bench.procs import (
    Proc,
    measure_idle_cpu_pct,
    read_rss_mb,
    spawn_plain_worker,
    start_orchestrator,
    start_worker,
)
from ops.bench.report import Metric, compared, with_goal
from ops.bench.scenarios import Sizes, summarise
from ops.bench.storage import LONG_LIVED_S
from ops.bench.tools import BENCH_QUEUE, NOOP_TOOL, SLOW_QUEUE
from orchestrator import Client
from orchestrator.redis_server import RedisServer
from orchestrator.settings import Settings
from workers.app import create_app

# The round trips are measured with as many worker processes as this machine has cores (at least 2).
ROUNDTRIP_WORKERS = 2
ROUNDTRIP_RATIO_GOAL = 1.1
THROUGHPUT_RATIO_GOAL = 0.9
PARKED_RSS_GOAL_MB = 150.0
PARKED_CPU_GOAL_PCT = 5.0
DEADLINE_LAG_GOAL_MS = 100.0
# Issue 36's targets for turns of 40 rounds with 8 kB results: reported, never asserted.
WRITTEN_RATIO_GOAL = 3.0
HELD_RATIO_GOAL = 1.2
# How long stopping a process may wait for its warm shutdown before it is killed.
STOP_TIMEOUT_S = 30.0
# The slow-tool worker ends the run inside a parked 600 s call that nobody waits for: a warm shutdown would
# wait for it, so it gets only a moment before it is killed (its Redis is thrown away with the run). It
# used to wait the whole STOP_TIMEOUT_S: 30 s of a 47 s quick run, which under load pushed the smoke test
# past its time limit.
SLOW_WORKER_STOP_S = 1.0

Progress = Callable[[str], None]
Emit = Callable[[Metric], None]


def run_bench(sizes: Sizes, emit: Emit, progress: Progress) -> None:
    """Run every scenario, passing each figure to `emit` as soon as it is known."""
    with RedisServer() as server:
        url = server.url
        settings = Settings(redis_url=url)
        app = create_app(settings, main="toolloop-bench")
        client = Client(url, settings=settings)
        procs: list[Proc] = []
        slow_worker: Proc | None = None
        fd, model_cpu_file = tempfile.mkstemp(prefix="toolloop-bench-model-cpu-")
        os.close(fd)
        try:
            progress("starting the slow-tool worker and an orchestrator")
            slow_worker = start_worker(url, queues=[SLOW_QUEUE], concurrency=1)
            procs.append(slow_worker)
            orchestrator = start_orchestrator(url, {MODEL_CPU_FILE_ENV: model_cpu_file})
            procs.append(orchestrator)
            for workers in sizes.worker_counts:
                progress(f"{workers} worker process(es), toolloop's and plain Celery's")
                worker = start_worker(url, queues=[BENCH_QUEUE], concurrency=workers)
                procs.append(worker)
                plain = spawn_plain_worker(url, workers)
                procs.append(plain)
                _warm_up(client, app, sizes)
                if workers == ROUNDTRIP_WORKERS:
                    _roundtrips(client, app, sizes, emit)
                _throughput(client, app, sizes, workers, emit)
                for stopped in (worker, plain):
                    stopped.stop()
                    procs.remove(stopped)
            # Before the deadline lag, whose slow calls outlive their turns and write late outcomes.
            worker = start_worker(url, queues=[BENCH_QUEUE], concurrency=ROUNDTRIP_WORKERS)
            procs.append(worker)
            _storage(client, sizes, emit, progress)
            _cpu_per_call(
                client,
                sizes,
                pid=orchestrator.pid,
                model_cpu_file=model_cpu_file,
                emit=emit,
                progress=progress,
            )
            progress("reactions: wait, cancel, tools side by side")
            reactions.run_reactions(client, sizes, NOOP_TOOL, emit)
            worker.stop()
            procs.remove(worker)
            progress("deadline lag")
            lags = summarise(scenarios.measure_deadline_lags(client, sizes))
            emit(with_goal("deadline_lag_p99_ms", lags["p99"], "ms", limit=DEADLINE_LAG_GOAL_MS))
            emit(Metric("deadline_lag_p50_ms", lags["p50"], "ms"))
            progress("an orchestrator's stop")
            reactions.run_stop(client, url, sizes, emit)
            orchestrator.stop()
            procs.remove(orchestrator)
            _streaming(client, url, sizes, procs, emit=emit, progress=progress)
            progress(f"parking {sizes.parked} turns in a fresh orchestrator")
            _parked(client, url, sizes, procs, emit)
        finally:
            for proc in reversed(procs):
                proc.stop(timeout_s=SLOW_WORKER_STOP_S if proc is slow_worker else STOP_TIMEOUT_S)
            client.close()
            app.close()
            Path(model_cpu_file).unlink(missing_ok=True)


def _warm_up(client: Client, app: Celery, sizes: Sizes) -> None:
    for _ in range(max(1, sizes.warmup // 4)):
        app.send_task(PLAIN_TASK, queue=PLAIN_QUEUE).get(timeout=60)
        scenarios.wait_completed(client, scenarios.submit_turn(client, NOOP_TOOL, 1))


def _roundtrips(client: Client, app: Celery, sizes: Sizes, emit: Emit) -> None:
    samples = scenarios.measure_roundtrips(client, app, sizes, PLAIN_QUEUE)
    tool, celery = summarise(samples.toolloop_ms), summarise(samples.celery_ms)
    workers = {"workers": ROUNDTRIP_WORKERS, "samples": len(samples.toolloop_ms)}
    for pct in ("p50", "p99"):
        metric = compared(
            f"tool_roundtrip_{pct}_ms",
            tool[pct],
            celery[pct],
            "ms",
            goal_ratio=ROUNDTRIP_RATIO_GOAL,
            lower_is_better=True,
        )
        emit(Metric(**{**metric.__dict__, "extra": workers}))
    for pct in ("p50", "p99"):
        emit(Metric(f"celery_roundtrip_{pct}_ms", celery[pct], "ms", extra=workers))
    overhead = summarise(samples.overhead_ms)
    emit(
        Metric("turn_overhead_ms", overhead["p50"], "ms", extra={**workers, "p99": round(overhead["p99"], 3)})
    )


def _throughput(client: Client, app: Celery, sizes: Sizes, workers: int, emit: Emit) -> None:
    calls = sizes.turns * sizes.calls_per_turn
    celery_rate = scenarios.measure_celery_throughput(app, calls, PLAIN_QUEUE)
    tool_rate = scenarios.measure_tool_throughput(client, sizes)
    extra = {"workers": workers, "calls": calls, "turns": sizes.turns}
    metric = compared(
        f"tool_calls_per_s_w{workers}",
        tool_rate,
        celery_rate,
        "calls/s",
        goal_ratio=THROUGHPUT_RATIO_GOAL,
        lower_is_better=False,
    )
    emit(Metric(**{**metric.__dict__, "extra": extra}))
    emit(Metric(f"celery_tasks_per_s_w{workers}", celery_rate, "tasks/s", extra=extra))
    if workers == ROUNDTRIP_WORKERS:
        emit(Metric(**{**metric.__dict__, "metric": "tool_calls_per_s", "extra": extra}))
        emit(Metric("celery_tasks_per_s", celery_rate, "tasks/s", extra=extra))


def _storage(client: Client, sizes: Sizes, emit: Emit, progress: Progress) -> None:
    kb, rounds = sizes.storage_result_kb, sizes.storage_rounds
    progress(f"Redis written and held: {sizes.storage_turns} turn(s) of {rounds} rounds, {kb} kB results")
    # A warm-up turn: the first turn of a tool pays for imports and connections nobody else pays for.
    storage.run_blob_turn(client, 2, kb)
    held = storage.measure_storage(
        client, turns=sizes.storage_turns, rounds=rounds, result_kb=kb, idle_s=min(sizes.idle_s, 3.0)
    )
    conv = held.conversation_bytes
    extra: dict[str, object] = {"turns": held.turns, "rounds": rounds, "result_kb": kb}
    emit(Metric("conversation_json_kb", conv / 1000, "kB", extra=extra))
    written = {**extra, "written_kb": round(held.written_bytes / 1000, 1)}
    written["background_kb"] = round(held.background_bytes / 1000, 1)
    emit(
        with_goal(
            "redis_written_per_turn_ratio",
            held.written_bytes / conv,
            "x conversation",
            limit=WRITTEN_RATIO_GOAL,
            extra=written,
        )
    )
    emit(Metric("redis_written_per_turn_kb", held.written_bytes / 1000, "kB", extra=extra))
    kept = {**extra, "own_keys_kb": round(held.own_bytes / 1000, 1), "own_keys": held.own_keys}
    kept["other_keys_growth_kb"] = round(held.other_growth_bytes / 1000, 1)
    kept["by_kind_kb"] = {kind: round(size / 1000, 1) for kind, size in held.held_by_kind.items()}
    emit(
        with_goal(
            "redis_held_per_turn_ratio",
            held.held_bytes / conv,
            "x conversation",
            limit=HELD_RATIO_GOAL,
            extra=kept,
        )
    )
    long_lived = {**extra, "held_kb": round(held.long_lived_bytes / 1000, 1), "ttl_over_s": LONG_LIVED_S}
    emit(
        Metric(
            "redis_held_past_1h_per_turn_ratio",
            held.long_lived_bytes / conv,
            "x conversation",
            extra=long_lived,
        )
    )
    emit(Metric("redis_held_per_turn_kb", held.held_bytes / 1000, "kB", extra=extra))
    used = {**extra, "used_memory_kb": round(held.used_memory_bytes / 1000, 1)}
    emit(
        Metric(
            "redis_used_memory_per_turn_ratio", held.used_memory_bytes / conv, "x conversation", extra=used
        )
    )
    # The same, in kB: what one turn of this size costs Redis in memory (the scaling page's figure).
    emit(Metric("redis_used_memory_per_turn_kb", max(held.used_memory_bytes, 0) / 1000, "kB", extra=extra))


def _cpu_per_call(
    client: Client, sizes: Sizes, *, pid: int, model_cpu_file: str, emit: Emit, progress: Progress
) -> None:
    for rounds in sizes.cpu_rounds:
        kb = sizes.cpu_result_kb
        turns = max(1, sizes.cpu_calls // rounds)
        progress(f"orchestrator CPU per call: {turns} turn(s) of {rounds} rounds, {kb} kB results")
        cpu = storage.measure_cpu_per_call(
            client, pid, model_cpu_file, rounds=rounds, result_kb=kb, turns=turns
        )
        row: dict[str, float] = {"rounds": rounds, "result_kb": kb, "turns": turns, "calls": cpu.calls}
        row["model_cpu_ms"] = round(cpu.model_cpu_s * 1000, 3)
        row["conversation_kb"] = round(cpu.conversation_bytes / 1000, 1)
        emit(Metric(f"orchestrator_cpu_ms_per_call_r{rounds}", cpu.cpu_s * 1000, "ms CPU", extra=row))


def _streaming(
    client: Client, url: str, sizes: Sizes, procs: list[Proc], *, emit: Emit, progress: Progress
) -> None:
    turns, chars = sizes.stream_turns, sizes.stream_answer_chars
    progress(f"streaming: {turns} turns answering {chars} characters, streamed then not")
    orchestrator = streaming.start_streaming_orchestrator(url)
    procs.append(orchestrator)
    try:
        for metric in streaming.measure_streaming(client, turns=turns, answer_chars=chars):
            emit(metric)
    finally:
        orchestrator.stop()
        procs.remove(orchestrator)


def _parked(client: Client, url: str, sizes: Sizes, procs: list[Proc], emit: Emit) -> None:
    env = {"TOOLLOOP_ORCHESTRATOR_MAX_TURNS": str(sizes.parked + 100)}
    orchestrator = start_orchestrator(url, env)
    procs.append(orchestrator)
    empty_rss = read_rss_mb(orchestrator.pid)
    setup_s = scenarios.park_turns(client, sizes.parked, timeout_s=max(60.0, sizes.parked / 20))
    # Let the last steps and event writes drain before calling the process idle.
    time.sleep(2.0)
    rss = read_rss_mb(orchestrator.pid)
    cpu = measure_idle_cpu_pct(orchestrator.pid, sizes.idle_s)
    extra = {"turns": sizes.parked, "empty_rss_mb": round(empty_rss, 1), "park_s": round(setup_s, 1)}
    emit(with_goal("parked_turns_rss_mb", rss, "MiB", limit=PARKED_RSS_GOAL_MB, extra=extra))
    emit(
        with_goal(
            "parked_idle_cpu_pct",
            cpu,
            "% of a core",
            limit=PARKED_CPU_GOAL_PCT,
            extra={"turns": sizes.parked, "window_s": sizes.idle_s},
        )
    )


def machine_facts() -> dict[str, str]:
    """What the figures came from: cores, CPU model, memory."""
    facts = {"nproc": str(os.cpu_count())}
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):  # noqa: SIM115
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in open("/proc/meminfo", encoding="utf-8"):  # noqa: SIM115
            if line.startswith("MemTotal"):
                facts["memory_mib"] = str(int(line.split()[1]) // 1024)
                break
    except OSError:
        pass
    return facts
