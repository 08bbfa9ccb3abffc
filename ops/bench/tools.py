"""What the benchmark's workers serve (`TOOLLOOP_TOOL_MODULES=ops.bench.tools`).

- `bench_noop`: a tool that does nothing, on the `bench` queue: one round trip through toolloop (the
  baseline, a plain Celery no-op task, runs on a stock Celery worker of its own: `plain_celery`).
- `bench_blob`: a tool whose result is `kb` kB of text, on the `bench` queue: storage and CPU per call grow
  with the conversation, so these scenarios need results of a chosen size.
- `bench_sleep`: a tool that sleeps a second on the `bench` queue: do the calls of several turns run side
  by side on the worker processes (`ops.bench.reactions`)?
- `bench_park`: a slow tool on its own queue, served by one single-process worker, so that the calls of
  thousands of turns wait for it (parked turns) or outlast their deadline (deadline lag).
"""

from __future__ import annotations

import random
import time

from workers import tool

SLOW_QUEUE = "bench-slow"
BENCH_QUEUE = "bench"
NOOP_TOOL = "bench_noop"
PARK_TOOL = "bench_park"
BLOB_TOOL = "bench_blob"
# A kB of a result is 1000 bytes (hex digits: one byte each in UTF-8 and in JSON, nothing escaped).
BLOB_KB = 1000
SLEEP_TOOL = "bench_sleep"


@tool(soft_time_limit=5, time_limit=10, queue=BENCH_QUEUE)
def bench_noop() -> str:
    """Do nothing and say so."""
    return "ok"


# Room for the largest result a scenario asks for: a truncated result would shrink the conversation.
@tool(soft_time_limit=5, time_limit=10, queue=BENCH_QUEUE, max_result_bytes=1024 * 1024)
def bench_blob(kb: int = 8, seq: int = 0) -> str:
    """Return `kb` kB of text; `seq` varies it (and the call's arguments, so no round repeats the last)."""
    return random.Random(seq).randbytes(kb * BLOB_KB // 2).hex()


@tool(soft_time_limit=590, time_limit=600, queue=SLOW_QUEUE)
def bench_park(seconds: float = 600.0) -> str:
    """Sleep for `seconds`: a tool slow enough that a turn calling it stays parked."""
    time.sleep(seconds)
    return "parked"


@tool(soft_time_limit=5, time_limit=10, queue=BENCH_QUEUE)
def bench_sleep(seconds: float = 1.0) -> str:
    """Sleep for `seconds` on the bench queue: calls of several turns at once show how they spread."""
    time.sleep(seconds)
    return "slept"
