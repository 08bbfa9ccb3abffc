"""The HTTP variant (issue 16): CPU per tool call of every process, and throughput, with the model over HTTP,
against plain Celery measured in the same run.

A stack of its own, so that every process on its Redis is one that is measured: a fresh Redis, one
`toolloop worker` of `WORKERS` prefork processes (task events on: `worker_send_task_events`, as `-E`), the
shipped `toolloop orchestrator` with its `scripted:` models at the bench's model server over HTTP
(`http_model`), a stock `celery worker -E` of `WORKERS` prefork processes for plain Celery's tasks
(`plain_celery`: acks late, prefetch 1, results in Redis, nothing of toolloop's consumer), and this process
as the client. Each round sends `turns × 5` plain Celery no-op tasks (`send_task` all, then
`AsyncResult.get` each) and `turns` toolloop turns of 5 no-op calls each in one model round (submitted all,
then waited for each; the model asked to stream, as `submit` does by default), the two phases in turn, which
one first alternating from round to round.
CPU is read from /proc around each phase (`cpu`): client, each worker's parent and pool children, Redis, the
orchestrator, and apart, the model server, which no "all processes" figure includes. Redis is also read
from itself around each phase (`redis_load`: `INFO commandstats`, commands run inside scripts included,
`INFO cpu`, `used_memory`): the Redis rows per call and per turn, and the tool calls a second one Redis core
carries. A quiet stretch before the rounds gives what the idle processes cost Redis a second, for reading
the rest.

After the rounds, the same stack measures the first token's overhead (`first_token`), with an API process
of its own.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ops.bench import cpu, first_token
from ops.bench.cpu import (
    CELERY_PARTS,
    CELERY_WORKER_PARTS,
    TOOLLOOP_PARTS,
    WORKER_PARTS,
    CpuWatch,
    Processes,
    Window,
)
from ops.bench.http_model import HostedPace, ModelServer
from ops.bench.plain_celery import PLAIN_QUEUE
from ops.bench.procs import (
    TOOLLOOP_BIN,
    Proc,
    spawn_plain_worker,
    spawn_worker,
    start_orchestrator,
    wait_catalogue,
)
from ops.bench.redis_load import (
    MemoryBursts,
    RedisCpu,
    RedisUse,
    add_uses,
    build_redis_rows,
    build_use,
    read_redis,
)
from ops.bench.report import Metric, compared
from ops.bench.scenarios import Sizes, measure_celery_throughput, submit_turn, wait_completed
from ops.bench.tools import BENCH_QUEUE, NOOP_TOOL
from orchestrator import Client
from orchestrator.redis_server import RedisServer
from orchestrator.settings import Settings
from workers.app import ToolloopCelery, create_app

CALLS_PER_TURN = 5
WORKERS = 2
# Issue 36's goals, on ratios to plain Celery in the same run: no dearer, no slower.
ALL_RATIO_GOAL = 1.0
WORKER_RATIO_GOAL = 1.0
THROUGHPUT_RATIO_GOAL = 1.0
# After the client has its last answer: the worker still acks and sends its task events, the orchestrator
# still writes a turn's end. Both phases wait as long, so both count their tails (and as much idle time).
SETTLE_S = 0.3
# The quiet stretch before the rounds: what the idle processes cost Redis a second.
IDLE_S = 2.0
# After a memory burst, before reading `used_memory`: an orchestrator trims its inbox each INBOX_ACK_S (1 s).
MEMORY_SETTLE_S = 1.5

Progress = Callable[[str], None]
Emit = Callable[[Metric], None]


class HttpStack:
    """Redis, the model server, a worker and the shipped orchestrator, started together; stopped on exit."""

    def __init__(self, pace: HostedPace | None = None) -> None:
        self._server = RedisServer()
        self._procs: list[Proc] = []
        self._pace = pace
        self.url = ""
        self.model: ModelServer | None = None
        self.client: Client | None = None
        self.app: ToolloopCelery | None = None
        self.processes: Processes | None = None

    def __enter__(self) -> HttpStack:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        url = self.url = self._server.start().url
        self.model = ModelServer(self._pace)
        self._procs.append(self.model.proc)
        # The worker's imports and the orchestrator's overlap: the worker is waited for last.
        worker, hostname = spawn_worker(url, queues=[BENCH_QUEUE], concurrency=WORKERS)
        self._procs.append(worker)
        plain = spawn_plain_worker(url, WORKERS)
        self._procs.append(plain)
        env = {"TOOLLOOP_SCRIPTED_BASE_URL": self.model.base_url, "TOOLLOOP_LOG_LEVEL": "WARNING"}
        orchestrator = start_orchestrator(url, env, command=[str(TOOLLOOP_BIN), "orchestrator"])
        self._procs.append(orchestrator)
        wait_catalogue(url, hostname, worker, timeout_s=60)
        self.model.wait_ready()
        settings = Settings(redis_url=url)
        self.app = create_app(settings, main="toolloop-bench-http")
        self.client = Client(url, settings=settings)
        assert self._server.pid is not None, "a started Redis has a process"
        self.processes = Processes(
            client=os.getpid(),
            worker=worker.pid,
            redis=self._server.pid,
            orchestrator=orchestrator.pid,
            model_server=self.model.proc.pid,
            celery_worker=plain.pid,
        )

    def add(self, proc: Proc) -> None:
        """Stop `proc` with the stack (a process started later, on its Redis)."""
        self._procs.append(proc)

    def close(self) -> None:
        """Stop everything this stack started (idempotent)."""
        for proc in reversed(self._procs):
            proc.stop(timeout_s=30.0)
        self._procs.clear()
        if self.client is not None:
            self.client.close()
        if self.app is not None:
            self.app.close()
        self._server.stop()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(frozen=True)
class HttpRun:
    """The phases of a run, each kind added up over its rounds, with what Redis did in them (and idle)."""

    celery: Window
    toolloop: Window
    celery_redis: RedisUse
    toolloop_redis: RedisUse
    idle_redis: RedisUse
    memory: MemoryBursts
    rounds: list[tuple[Window, Window]]


def run_turns(client: Client, turns: int) -> None:
    """`turns` turns of `CALLS_PER_TURN` no-op calls, all submitted, then each waited for."""
    ids = [submit_turn(client, NOOP_TOOL, CALLS_PER_TURN) for _ in range(turns)]
    for turn_id in ids:
        wait_completed(client, turn_id, timeout_s=300)


def measure(stack: HttpStack, sizes: Sizes, progress: Progress) -> HttpRun:
    """Warm both paths up, then `sizes.http_rounds` rounds of plain tasks then turns."""
    assert stack.client is not None and stack.app is not None and stack.processes is not None
    client, app = stack.client, stack.app
    # Imports, connections, script loads and the model server's first requests: paid before measuring (the
    # plain worker's first task waits for it to start).
    measure_celery_throughput(app, max(10, sizes.warmup * CALLS_PER_TURN), PLAIN_QUEUE)
    run_turns(client, max(2, sizes.warmup))
    watch = CpuWatch(stack.processes)
    r = client.redis
    quiet = read_redis(r)
    time.sleep(IDLE_S)
    idle = build_use(quiet, read_redis(r), 1)
    calls = sizes.http_turns * CALLS_PER_TURN
    rounds: list[tuple[Window, Window]] = []
    uses: dict[str, list[RedisUse]] = {"celery": [], "toolloop": []}
    for number in range(sizes.http_rounds):
        progress(f"HTTP model, round {number + 1}: {calls} plain tasks, {sizes.http_turns} turns × 5 calls")
        # Which phase goes first alternates: a machine that drifts (its CPUs slower or faster for a while,
        # which on a shared VM they are) weighs on both sides alike rather than on the one always second.
        phases = ("celery", "toolloop") if number % 2 == 0 else ("toolloop", "celery")
        windows: dict[str, Window] = {}
        for phase in phases:
            before = read_redis(r)
            watch.start()
            if phase == "celery":
                measure_celery_throughput(app, calls, PLAIN_QUEUE)
            else:
                run_turns(client, sizes.http_turns)
            windows[phase] = watch.stop(calls, settle_s=SETTLE_S)
            uses[phase].append(build_use(before, read_redis(r), calls))
        rounds.append((windows["celery"], windows["toolloop"]))
    progress(f"HTTP model, memory: {sizes.http_turns} turns, then {calls} plain tasks, each settled")
    return HttpRun(
        celery=cpu.add_windows([c for c, _ in rounds]),
        toolloop=cpu.add_windows([t for _, t in rounds]),
        celery_redis=add_uses(uses["celery"]),
        toolloop_redis=add_uses(uses["toolloop"]),
        idle_redis=idle,
        memory=measure_memory(client, app, sizes.http_turns),
        rounds=rounds,
    )


def measure_memory(client: Client, app: ToolloopCelery, turns: int) -> MemoryBursts:
    """`used_memory` grown over a burst of `turns` turns, then over as many plain tasks as their calls, each
    read `MEMORY_SETTLE_S` after it ended (the turns' first, so that their inbox trims are done before)."""
    r = client.redis
    time.sleep(MEMORY_SETTLE_S)
    before = read_redis(r)
    run_turns(client, turns)
    time.sleep(MEMORY_SETTLE_S)
    middle = read_redis(r)
    measure_celery_throughput(app, turns * CALLS_PER_TURN, PLAIN_QUEUE)
    time.sleep(MEMORY_SETTLE_S)
    after = read_redis(r)
    calls = turns * CALLS_PER_TURN
    return MemoryBursts(build_use(before, middle, calls), build_use(middle, after, calls), MEMORY_SETTLE_S)


_AS_TOOLLOOP_PART = {
    cpu.CELERY_WORKER_PARENT: cpu.WORKER_PARENT,
    cpu.CELERY_WORKER_CHILDREN: cpu.WORKER_CHILDREN,
}


def _versus(
    name: str, tool: Window, celery: Window, parts: tuple[str, ...], extra: dict[str, object]
) -> Metric:
    value, baseline = tool.ms_per_unit(*parts), celery.ms_per_unit(*parts)
    ratio = value / baseline if baseline else None
    return Metric(name, value, "ms CPU", baseline=baseline, ratio=ratio, extra=extra)


def build_metrics(run: HttpRun, loadavg: tuple[str, str]) -> list[Metric]:
    """The rows of the report: CPU per call by process, and throughput, each against plain Celery."""
    tool, celery = run.toolloop, run.celery
    common: dict[str, object] = {
        "workers": WORKERS,
        "calls": tool.units,
        "turns": tool.units // CALLS_PER_TURN,
    }
    per_round = [
        {
            "toolloop_ms": round(t.ms_per_unit(*TOOLLOOP_PARTS), 3),
            "celery_ms": round(c.ms_per_unit(*CELERY_PARTS), 3),
        }
        for c, t in run.rounds
    ]
    all_extra = {
        **common,
        "toolloop_ms": tool.breakdown_ms(TOOLLOOP_PARTS),
        # Named as toolloop's parts are: plain Celery's worker is its own, its parent and pool the same parts.
        "celery_ms": {
            _AS_TOOLLOOP_PART.get(part, part): ms for part, ms in celery.breakdown_ms(CELERY_PARTS).items()
        },
        "rounds": per_round,
        "model_server_excluded": True,
        "loadavg_before": loadavg[0],
        "loadavg_after": loadavg[1],
    }
    cpu_all = compared(
        "cpu_ms_per_call_all",
        tool.ms_per_unit(*TOOLLOOP_PARTS),
        celery.ms_per_unit(*CELERY_PARTS),
        "ms CPU",
        goal_ratio=ALL_RATIO_GOAL,
        lower_is_better=True,
    )
    worker = compared(
        "worker_cpu_ms_per_call",
        tool.ms_per_unit(*WORKER_PARTS),
        celery.ms_per_unit(*CELERY_WORKER_PARTS),
        "ms CPU",
        goal_ratio=WORKER_RATIO_GOAL,
        lower_is_better=True,
    )
    throughput = compared(
        "tool_calls_per_s_http_w2",
        tool.rate_per_s,
        celery.rate_per_s,
        "calls/s",
        goal_ratio=THROUGHPUT_RATIO_GOAL,
        lower_is_better=False,
    )
    idle = 1000 * celery.cpu_s[cpu.ORCHESTRATOR] / celery.wall_s
    # What the idle processes (orchestrator, worker, this client) cost Redis a second, counted in both phases.
    background = {
        "idle_commands_per_s": round(run.idle_redis.total_commands / IDLE_S, 1),
        "idle_cpu_ms_per_s": round(1000 * run.idle_redis.cpu_s / IDLE_S, 2),
    }
    redis_rows = build_redis_rows(
        run.toolloop_redis,
        run.celery_redis,
        RedisCpu(tool.ms_per_unit(cpu.REDIS), celery.ms_per_unit(cpu.REDIS)),
        run.memory,
        calls_per_turn=CALLS_PER_TURN,
        extra={"workers": WORKERS, **background},
    )
    return [
        Metric(**{**cpu_all.__dict__, "extra": all_extra}),
        Metric(**{**worker.__dict__, "extra": {**common, **_worker_split(tool, celery)}}),
        Metric(
            "orchestrator_cpu_ms_per_call",
            tool.ms_per_unit(cpu.ORCHESTRATOR),
            "ms CPU",
            extra={**common, "idle_ms_per_s_during_celery": round(idle, 2)},
        ),
        *redis_rows,
        _versus("client_cpu_ms_per_call", tool, celery, (cpu.CLIENT,), common),
        Metric(
            "model_server_cpu_ms_per_call",
            tool.ms_per_unit(cpu.MODEL_SERVER),
            "ms CPU",
            extra={**common, "model_calls_per_turn": 2, "in_all": False},
        ),
        Metric(**{**throughput.__dict__, "extra": common}),
    ]


def _worker_split(tool: Window, celery: Window) -> dict[str, object]:
    return {
        "parent_ms": round(tool.ms_per_unit(cpu.WORKER_PARENT), 3),
        "children_ms": round(tool.ms_per_unit(cpu.WORKER_CHILDREN), 3),
        "celery_parent_ms": round(celery.ms_per_unit(cpu.CELERY_WORKER_PARENT), 3),
        "celery_children_ms": round(celery.ms_per_unit(cpu.CELERY_WORKER_CHILDREN), 3),
    }


def run_http_variant(sizes: Sizes, emit: Emit, progress: Progress) -> None:
    """Start the stack, measure, emit every row, then the first token's overhead on that stack; stop it."""
    progress(f"HTTP model: Redis, model server, {WORKERS}-process worker, shipped orchestrator")
    with tempfile.TemporaryDirectory(prefix="toolloop-bench-first-token-") as folder:
        pace = first_token.build_pace(Path(folder) / "first-bytes.jsonl")
        with HttpStack(pace) as stack:
            before = cpu.read_loadavg()
            run = measure(stack, sizes, progress)
            for metric in build_metrics(run, (before, cpu.read_loadavg())):
                emit(metric)
            assert stack.client is not None and stack.model is not None and stack.processes is not None
            stage = first_token.Stage(stack.url, stack.client, stack.model, stack.processes, stack.add)
            for metric in first_token.run_first_token(stage, sizes, progress):
                emit(metric)
