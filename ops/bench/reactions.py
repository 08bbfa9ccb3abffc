"""How fast toolloop reacts: the speed claims the test suite used to make with wall-clock bounds.

The suite waits on conditions and never times anything (issue 19); what its bounds claimed is measured here,
on the benchmark's own Redis, workers and orchestrator, and reported with the goal the test used to hold:

- `wait_wake_ms`: from the orchestrator's `turn_finished` to `Client.wait` returning in this process
  (a test once held it under 2 s);
- `cancel_latency_ms`: from `Client.cancel` on a turn waiting on a slow tool to its `turn_finished`
  (under 3 s);
- `parallel_tools_ratio`: turns of one 1 s tool each on 2 worker processes, wall time against the ideal
  (turns / 2 × 1 s); eight such turns once had to end within 7 s, a ratio of 1.75;
- `orchestrator_stop_s`: SIGTERM to exit of an orchestrator with turns waiting on slow tools (under 10 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ops.bench.procs import Proc, start_orchestrator
from ops.bench.report import Metric, with_goal
from ops.bench.scenarios import Sizes, read_events, submit_turn, summarise, wait_completed
from ops.bench.tools import PARK_TOOL, SLEEP_TOOL
from orchestrator import Client
from orchestrator.errors import BenchError

Emit = Callable[[Metric], None]

WAIT_WAKE_GOAL_MS = 2000.0
CANCEL_GOAL_MS = 3000.0
PARALLEL_GOAL_RATIO = 1.75
STOP_GOAL_S = 10.0
PARALLEL_WORKERS = 2
SLEEP_S = 1.0


def _finished_at(client: Client, turn_id: str) -> float:
    for event in reversed(read_events(client, turn_id)):
        if event.name == "turn_finished":
            return event.at
    raise BenchError(f"turn {turn_id} has no turn_finished event")


def measure_wait_wake(client: Client, noop_tool: str, turns: int) -> list[float]:
    """ms from each turn's `turn_finished` to `Client.wait` returning (one turn at a time)."""
    lags: list[float] = []
    for _ in range(turns):
        turn_id = submit_turn(client, noop_tool, 1)
        wait_completed(client, turn_id)
        returned = time.time()
        lags.append((returned - _finished_at(client, turn_id)) * 1000)
    return lags


def _wait_dispatched(client: Client, turn_id: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(e.name == "tool_dispatched" for e in read_events(client, turn_id)):
        if time.monotonic() > deadline:
            raise BenchError(f"turn {turn_id}'s call was not dispatched in {timeout_s:g} s")
        time.sleep(0.02)


def measure_cancel_latency(client: Client, turns: int) -> list[float]:
    """ms from `Client.cancel` to `turn_finished`, for turns whose call is dispatched and waiting."""
    latencies: list[float] = []
    for _ in range(turns):
        turn_id = submit_turn(client, PARK_TOOL, 1, arguments={"seconds": 60})
        _wait_dispatched(client, turn_id)
        asked = time.time()
        client.cancel(turn_id)
        outcome = client.wait(turn_id, 60)
        if outcome.status != "cancelled":
            raise BenchError(f"turn {turn_id} ended {outcome.status}, not cancelled")
        latencies.append((_finished_at(client, turn_id) - asked) * 1000)
    return latencies


def measure_parallel_ratio(client: Client, turns: int) -> float:
    """Wall time of `turns` turns of one `SLEEP_S` tool each on `PARALLEL_WORKERS` processes, against the
    ideal: first `tool_started` to last `turn_finished`, over turns / workers × `SLEEP_S`."""
    ids = [submit_turn(client, SLEEP_TOOL, 1, arguments={"seconds": SLEEP_S}) for _ in range(turns)]
    for turn_id in ids:
        wait_completed(client, turn_id)
    first_start = min(
        e.at for turn_id in ids for e in read_events(client, turn_id) if e.name == "tool_started"
    )
    last_end = max(_finished_at(client, turn_id) for turn_id in ids)
    return (last_end - first_start) / (turns / PARALLEL_WORKERS * SLEEP_S)


def measure_orchestrator_stop(client: Client, url: str, turns: int) -> float:
    """Seconds from SIGTERM to the exit of an orchestrator that has `turns` turns on slow tools."""
    proc: Proc = start_orchestrator(url)
    ids: list[str] = []
    try:
        ids += [submit_turn(client, PARK_TOOL, 1, arguments={"seconds": 60}) for _ in range(turns)]
        for turn_id in ids:
            _wait_dispatched(client, turn_id)
        stopping = time.monotonic()
        proc.stop(timeout_s=60)
        return time.monotonic() - stopping
    finally:
        proc.stop()
        # Their calls would hold the slow worker a minute: the next orchestrator to adopt them cancels them.
        for turn_id in ids:
            client.cancel(turn_id)


def run_reactions(client: Client, sizes: Sizes, noop_tool: str, emit: Emit) -> None:
    """The wait, cancel and parallelism figures (a 2-process worker serves the bench queue, the slow
    worker the slow one)."""
    wake = summarise(measure_wait_wake(client, noop_tool, sizes.reaction_turns))
    emit(
        with_goal(
            "wait_wake_p99_ms",
            wake["p99"],
            "ms",
            limit=WAIT_WAKE_GOAL_MS,
            extra={"p50": round(wake["p50"], 3)},
        )
    )
    cancel = summarise(measure_cancel_latency(client, sizes.reaction_turns))
    emit(
        with_goal(
            "cancel_latency_p99_ms",
            cancel["p99"],
            "ms",
            limit=CANCEL_GOAL_MS,
            extra={"p50": round(cancel["p50"], 3)},
        )
    )
    ratio = measure_parallel_ratio(client, sizes.parallel_turns)
    emit(
        with_goal(
            "parallel_tools_ratio",
            ratio,
            "x ideal",
            limit=PARALLEL_GOAL_RATIO,
            extra={"turns": sizes.parallel_turns, "workers": PARALLEL_WORKERS, "tool_s": SLEEP_S},
        )
    )


def run_stop(client: Client, url: str, sizes: Sizes, emit: Emit) -> None:
    """The stop figure, on an orchestrator of its own (the turns it leaves are another's to adopt)."""
    stop_s = measure_orchestrator_stop(client, url, sizes.reaction_turns)
    emit(
        with_goal(
            "orchestrator_stop_s", stop_s, "s", limit=STOP_GOAL_S, extra={"turns": sizes.reaction_turns}
        )
    )
