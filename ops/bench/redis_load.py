"""What Redis does per tool call and per turn (issue 35 item 3, issue 36 item 1): commands, CPU and memory,
read from Redis itself around a stretch of work, for toolloop and plain Celery in the same run.

- commands: the `INFO commandstats` deltas, by command (commands run inside scripts count as commands of
  their own, as Redis counts them; the bench's own `INFO` reads are left out);
- CPU: `INFO cpu` (`used_cpu_sys` + `used_cpu_user`: the whole redis-server process, to the µs), the
  cross-check of the /proc figure the CPU rows use (`cpu`, to the 10 ms tick);
- memory: the `INFO memory` `used_memory` delta (allocator overhead included) over a burst of its own, read
  once the burst has settled: the orchestrators' inboxes are trimmed a moment after their notices are read,
  so a figure read at once counts what is about to go.

`build_redis_rows` turns two such uses (toolloop's turns, plain Celery's tasks) into the report's rows: per
call and per turn (a turn's calls run as as many plain tasks), and how many tool calls a second one Redis
core carries (1 / Redis CPU per call).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from ops.bench.report import Metric, compared

# Issue 36's goals: commands and Redis CPU per tool call at most plain Celery's.
COMMANDS_RATIO_GOAL = 1.0
CPU_RATIO_GOAL = 1.0
# The bench's own reads of the figures: never counted as work.
_OWN_COMMANDS = frozenset({"info"})
# Commands shown by name in a row's breakdown; the rest are summed as "other".
_SHOWN_COMMANDS = 12


@dataclass(frozen=True)
class RedisReading:
    """Redis's counters at one moment: calls by command, CPU seconds, `used_memory` bytes."""

    commands: dict[str, int]
    cpu_s: float
    used_memory: int


@dataclass(frozen=True)
class RedisUse:
    """What Redis did while `units` calls (or tasks) ran: calls by command, CPU seconds, memory grown."""

    units: int
    commands: dict[str, int]
    cpu_s: float
    memory_bytes: int

    @property
    def total_commands(self) -> int:
        """Every command counted."""
        return sum(self.commands.values())


def parse_command_stats(stats: Mapping[str, Any]) -> dict[str, int]:
    """`INFO commandstats` as calls by command (`cmdstat_` dropped, lower case), the bench's own left out."""
    calls: dict[str, int] = {}
    for name, entry in stats.items():
        command = name.removeprefix("cmdstat_").lower()
        if command not in _OWN_COMMANDS:
            calls[command] = int(entry["calls"])
    return calls


def read_redis(r: redis.Redis) -> RedisReading:
    """Redis's counters now (three `INFO` reads: their own cost is in no figure but the CPU's µs)."""
    stats: dict[str, Any] = r.info("commandstats")
    cpu: dict[str, Any] = r.info("cpu")
    memory: dict[str, Any] = r.info("memory")
    return RedisReading(
        commands=parse_command_stats(stats),
        cpu_s=float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        used_memory=int(memory["used_memory"]),
    )


def build_use(before: RedisReading, after: RedisReading, units: int) -> RedisUse:
    """What Redis did between two readings, for `units` calls or tasks."""
    commands = {
        name: calls - before.commands.get(name, 0)
        for name, calls in after.commands.items()
        if calls != before.commands.get(name, 0)
    }
    return RedisUse(units, commands, after.cpu_s - before.cpu_s, after.used_memory - before.used_memory)


def add_uses(uses: Sequence[RedisUse]) -> RedisUse:
    """Uses of the same kind taken in turns, as one."""
    commands: dict[str, int] = {}
    for use in uses:
        for name, calls in use.commands.items():
            commands[name] = commands.get(name, 0) + calls
    return RedisUse(
        sum(u.units for u in uses),
        commands,
        sum(u.cpu_s for u in uses),
        sum(u.memory_bytes for u in uses),
    )


def build_command_breakdown(use: RedisUse) -> dict[str, float]:
    """Calls per unit by command, most first; beyond the first few, the rest as `other`."""
    ranked = sorted(use.commands.items(), key=lambda item: (-item[1], item[0]))
    shown = {name: round(calls / use.units, 2) for name, calls in ranked[:_SHOWN_COMMANDS]}
    rest = sum(calls for _, calls in ranked[_SHOWN_COMMANDS:])
    if rest:
        shown["other"] = round(rest / use.units, 2)
    return shown


@dataclass(frozen=True)
class RedisCpu:
    """Redis CPU ms per call (toolloop) and per task (plain Celery), as the CPU rows read it (/proc)."""

    toolloop_ms: float
    celery_ms: float


@dataclass(frozen=True)
class MemoryBursts:
    """The memory bursts: toolloop's turns, and plain Celery's tasks (as many as the turns' calls)."""

    toolloop: RedisUse
    celery: RedisUse
    settle_s: float


def build_redis_rows(
    toolloop: RedisUse,
    celery: RedisUse,
    proc_cpu: RedisCpu,
    memory: MemoryBursts,
    *,
    calls_per_turn: int,
    extra: Mapping[str, object],
) -> list[Metric]:
    """The Redis rows: commands, CPU and memory per call and per turn, and calls a second per Redis core,
    each against plain Celery (a turn's `calls_per_turn` calls against as many plain tasks)."""
    calls, tasks = toolloop.units, celery.units
    turns = calls / calls_per_turn
    commands_call, celery_commands = toolloop.total_commands / calls, celery.total_commands / tasks
    info_ms, celery_info_ms = 1000 * toolloop.cpu_s / calls, 1000 * celery.cpu_s / tasks
    common = {**extra, "calls": calls, "turns": round(turns), "tasks": tasks}
    per_turn = {**common, "calls_per_turn": calls_per_turn}
    rows = [
        _with_extra(
            compared(
                "redis_commands_per_call",
                commands_call,
                celery_commands,
                "commands",
                goal_ratio=COMMANDS_RATIO_GOAL,
                lower_is_better=True,
            ),
            {
                **common,
                "by_command": build_command_breakdown(toolloop),
                "celery_by_command": build_command_breakdown(celery),
            },
        ),
        _with_extra(
            compared(
                "redis_commands_per_turn",
                toolloop.total_commands / turns,
                celery_commands * calls_per_turn,
                "commands",
                goal_ratio=COMMANDS_RATIO_GOAL,
                lower_is_better=True,
            ),
            per_turn,
        ),
        _with_extra(
            compared(
                "redis_cpu_ms_per_call",
                proc_cpu.toolloop_ms,
                proc_cpu.celery_ms,
                "ms CPU",
                goal_ratio=CPU_RATIO_GOAL,
                lower_is_better=True,
            ),
            {
                **common,
                "commands_per_call": round(commands_call, 2),
                "celery_commands_per_task": round(celery_commands, 2),
                "info_cpu_ms": round(info_ms, 3),
                "celery_info_cpu_ms": round(celery_info_ms, 3),
            },
        ),
        _with_extra(
            compared(
                "redis_cpu_ms_per_turn",
                proc_cpu.toolloop_ms * calls_per_turn,
                proc_cpu.celery_ms * calls_per_turn,
                "ms CPU",
                goal_ratio=CPU_RATIO_GOAL,
                lower_is_better=True,
            ),
            per_turn,
        ),
    ]
    if proc_cpu.toolloop_ms > 0 and proc_cpu.celery_ms > 0:
        rows.append(
            _with_extra(
                compared(
                    "tool_calls_per_s_per_redis_core",
                    1000 / proc_cpu.toolloop_ms,
                    1000 / proc_cpu.celery_ms,
                    "calls/s",
                    goal_ratio=1 / CPU_RATIO_GOAL,
                    lower_is_better=False,
                ),
                {**common, "from": "1 / redis_cpu_ms_per_call"},
            )
        )
    rows.append(build_memory_row(memory, calls_per_turn, extra))
    return rows


def build_memory_row(memory: MemoryBursts, calls_per_turn: int, extra: Mapping[str, object]) -> Metric:
    """`used_memory` grown per finished turn, against as many plain tasks' results as the turn has calls.
    A delta below zero (something else shrank more) shows as 0, with its raw figure."""
    turns = memory.toolloop.units / calls_per_turn
    turn_kb = memory.toolloop.memory_bytes / turns / 1000
    celery_kb = memory.celery.memory_bytes / memory.celery.units / 1000 * calls_per_turn
    compares = turn_kb > 0 and celery_kb > 0
    return Metric(
        "redis_memory_per_turn_kb",
        max(turn_kb, 0.0),
        "kB",
        baseline=celery_kb if compares else None,
        ratio=turn_kb / celery_kb if compares else None,
        extra={
            **extra,
            "turns": round(turns),
            "tasks": memory.celery.units,
            "calls_per_turn": calls_per_turn,
            "settle_s": memory.settle_s,
            "raw_kb": round(turn_kb, 2),
            "celery_raw_kb": round(celery_kb, 2),
            "from": "used_memory delta over a burst of finished turns",
        },
    )


def _with_extra(metric: Metric, extra: Mapping[str, object]) -> Metric:
    return Metric(**{**metric.__dict__, "extra": dict(extra)})
