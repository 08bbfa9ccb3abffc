"""The measurements of a run, each against what it is compared with, on the same Redis and workers.

Every toolloop figure is taken from the turn's own events (timestamps written by the orchestrator), so the
benchmark adds nothing to the path it measures:

- round trip: `tool_finished.at - tool_dispatched.at` — from just before the orchestrator publishes the call
  to the moment it has read the outcome, stepped the turn and persisted it;
- turn overhead: submit → `turn_finished`, minus the model calls' and the tool's own durations;
- deadline lag: `tool_synthesized.at - deadline_at` of the turn (from `turn_started`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery

from ops.bench.instant import INSTANT_MODEL
from ops.bench.plain_celery import PLAIN_QUEUE, PLAIN_TASK
from ops.bench.report import percentile
from ops.bench.tools import NOOP_TOOL, PARK_TOOL, SLOW_QUEUE
from orchestrator import Client
from orchestrator.errors import BenchError
from orchestrator.store import codec
from orchestrator.store.codec import TurnEvent
from workers import keys


@dataclass(frozen=True)
class Sizes:
    """How much of each scenario a run does."""

    warmup: int
    roundtrips: int
    turns: int
    calls_per_turn: int
    worker_counts: tuple[int, ...]
    parked: int
    idle_s: float
    deadline_turns: int
    deadline_s: float
    # Storage (`ops.bench.storage`): turns of `storage_rounds` rounds, one call a round, results this large.
    storage_turns: int
    storage_rounds: int
    storage_result_kb: int
    # Orchestrator CPU per call: a row per round count, each of about `cpu_calls` calls (a turn at least).
    cpu_rounds: tuple[int, ...]
    cpu_result_kb: int
    cpu_calls: int
    # Streaming (`ops.bench.streaming`): turns at once, each one model call answering this many characters.
    stream_turns: int
    stream_answer_chars: int
    # The HTTP variant (`ops.bench.http_variant`): rounds of plain tasks then turns of 5 calls, this many
    # turns a round (and as many plain tasks as calls).
    http_turns: int
    http_rounds: int
    # Reactions (`ops.bench.reactions`): turns timed one at a time (wait, cancel, stop), and turns of one 1 s
    # tool at once on 2 worker processes.
    reaction_turns: int
    parallel_turns: int
    # First-token overhead (`ops.bench.first_token`): batches of a dozen streamed turns at once, per path.
    first_token_batches: int
    # A Redis Cluster (`ops.bench.cluster_load`): a burst of this many turns of `calls_per_turn` calls.
    cluster_turns: int


FULL = Sizes(
    warmup=20,
    roundtrips=300,
    turns=100,
    calls_per_turn=5,
    worker_counts=(1, 2, 4),
    parked=10_000,
    idle_s=10.0,
    deadline_turns=300,
    deadline_s=2.0,
    storage_turns=5,
    storage_rounds=40,
    storage_result_kb=8,
    cpu_rounds=(1, 10, 40, 100),
    cpu_result_kb=50,
    cpu_calls=200,
    stream_turns=8,
    stream_answer_chars=4000,
    http_turns=50,
    http_rounds=6,
    reaction_turns=20,
    parallel_turns=8,
    first_token_batches=4,
    cluster_turns=900,
)
QUICK = Sizes(
    warmup=2,
    roundtrips=10,
    turns=6,
    calls_per_turn=3,
    worker_counts=(1, 2, 4),
    parked=100,
    idle_s=2.0,
    deadline_turns=10,
    deadline_s=1.0,
    storage_turns=1,
    storage_rounds=40,
    storage_result_kb=8,
    # The 40- and 100-round rows (4 s and 12 s) run in the full bench only, to make room for the HTTP variant.
    cpu_rounds=(1, 10),
    cpu_result_kb=50,
    cpu_calls=1,
    stream_turns=2,
    stream_answer_chars=1500,
    http_turns=20,
    http_rounds=1,
    reaction_turns=3,
    parallel_turns=4,
    first_token_batches=1,
    cluster_turns=30,
)


def build_plan_prompt(calls: Sequence[dict[str, Any]]) -> str:
    """The prompt of a `scripted:plan` turn: one round of these calls, then a final answer."""
    return json.dumps({"plan": [{"calls": list(calls)}]})


def submit_turn(
    client: Client,
    tool: str,
    calls: int,
    *,
    deadline_s: float = 120.0,
    arguments: dict[str, Any] | None = None,
) -> str:
    """Submit a turn whose model calls `tool` `calls` times in one round."""
    prompt = build_plan_prompt([{"name": tool, "arguments": arguments or {}}] * calls)
    return client.submit(prompt=prompt, tools=[tool], model=INSTANT_MODEL, limits={"deadline_s": deadline_s})


def read_events(client: Client, turn_id: str) -> list[TurnEvent]:
    """Every event of a turn, oldest first."""
    entries: list[tuple[str, dict[str, str]]] = client.redis.xrange(keys.turn_events(turn_id))  # type: ignore[assignment]  # redis-py types the decoded reply loosely
    return codec.parse_entries(turn_id, entries)


def _first(events: Sequence[TurnEvent], name: str) -> TurnEvent:
    for event in events:
        if event.name == name:
            return event
    raise BenchError(f"turn {events[0].turn_id if events else '?'} has no {name} event")


def wait_completed(client: Client, turn_id: str, timeout_s: float = 120.0) -> None:
    """Wait for a turn and insist it completed (a failed turn would make any figure meaningless)."""
    outcome = client.wait(turn_id, timeout_s)
    if outcome.status != "completed":
        raise BenchError(f"turn {turn_id} ended {outcome.status}/{outcome.stop_reason}: {outcome.text}")


@dataclass(frozen=True)
class Roundtrips:
    """Samples, in ms, of both round trips and of the turn overhead."""

    toolloop_ms: list[float]
    celery_ms: list[float]
    overhead_ms: list[float]


def measure_roundtrips(client: Client, app: Celery, sizes: Sizes, queue: str = PLAIN_QUEUE) -> Roundtrips:
    """Alternate one toolloop turn of one no-op call and one plain Celery no-op task (on `queue`), one at a
    time."""
    result = Roundtrips([], [], [])
    for i in range(sizes.warmup + sizes.roundtrips):
        t0 = time.perf_counter()
        app.send_task(PLAIN_TASK, queue=queue).get(timeout=30)
        celery_ms = (time.perf_counter() - t0) * 1000
        submitted_at = time.time()
        turn_id = submit_turn(client, NOOP_TOOL, 1)
        wait_completed(client, turn_id)
        if i < sizes.warmup:
            continue
        events = read_events(client, turn_id)
        dispatched = _first(events, "tool_dispatched")
        finished = _first(events, "tool_finished")
        ended = _first(events, "turn_finished")
        model_ms = sum(e.data.get("duration_ms", 0.0) for e in events if e.name == "model_responded")
        tool_ms = float(finished.data.get("duration_ms") or 0.0)
        result.celery_ms.append(celery_ms)
        result.toolloop_ms.append((finished.at - dispatched.at) * 1000)
        result.overhead_ms.append((ended.at - submitted_at) * 1000 - model_ms - tool_ms)
    return result


def measure_celery_throughput(app: Celery, tasks: int, queue: str = PLAIN_QUEUE) -> float:
    """Plain Celery: publish `tasks` no-op tasks to `queue`, then read every result; tasks per second."""
    t0 = time.perf_counter()
    results = [app.send_task(PLAIN_TASK, queue=queue) for _ in range(tasks)]
    for r in results:
        r.get(timeout=300)
    return tasks / (time.perf_counter() - t0)


def measure_tool_throughput(client: Client, sizes: Sizes) -> float:
    """Toolloop: `turns` concurrent turns of `calls_per_turn` no-op calls each; tool calls per second."""
    t0 = time.perf_counter()
    ids = [submit_turn(client, NOOP_TOOL, sizes.calls_per_turn) for _ in range(sizes.turns)]
    for turn_id in ids:
        wait_completed(client, turn_id, timeout_s=300)
    return sizes.turns * sizes.calls_per_turn / (time.perf_counter() - t0)


def measure_deadline_lags(client: Client, sizes: Sizes) -> list[float]:
    """Turns whose slow call outlasts the deadline: ms from the deadline to the synthetic outcome."""
    ids = [
        submit_turn(client, PARK_TOOL, 1, deadline_s=sizes.deadline_s, arguments={"seconds": 60})
        for _ in range(sizes.deadline_turns)
    ]
    lags: list[float] = []
    for turn_id in ids:
        outcome = client.wait(turn_id, sizes.deadline_s + 60)
        if outcome.stop_reason != "deadline":
            raise BenchError(
                f"turn {turn_id} ended {outcome.status}/{outcome.stop_reason}, not at its deadline"
            )
        events = read_events(client, turn_id)
        deadline_at = float(_first(events, "turn_started").data["deadline_at"])
        for event in events:
            # Only the orchestrator's own deadline outcome: a worker's hard-limit timeout may win the race.
            if event.name == "tool_synthesized" and event.data.get("failure_kind") == "deadline_exceeded":
                lags.append((event.at - deadline_at) * 1000)
    if not lags:
        raise BenchError("no deadline_exceeded outcome was synthesised")
    return lags


def park_turns(client: Client, count: int, timeout_s: float) -> float:
    """Submit `count` turns that each wait on one slow call; seconds until every call is dispatched."""
    client.redis.delete(SLOW_QUEUE)
    t0 = time.perf_counter()
    for _ in range(count):
        submit_turn(client, PARK_TOOL, 1, deadline_s=3600, arguments={"seconds": 600})
    deadline = time.monotonic() + timeout_s
    # The single slow worker holds one message (prefetch 1); every other call waits in the queue.
    while int(client.redis.llen(SLOW_QUEUE)) < count - 1:
        if time.monotonic() > deadline:
            queued = client.redis.llen(SLOW_QUEUE)
            raise BenchError(f"only {queued} of {count} parked calls dispatched after {timeout_s} s")
        time.sleep(0.25)
    return time.perf_counter() - t0


def summarise(samples: Sequence[float]) -> dict[str, float]:
    """p50 and p99 of samples."""
    return {"p50": percentile(samples, 50), "p99": percentile(samples, 99)}
