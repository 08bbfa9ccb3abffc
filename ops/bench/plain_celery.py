"""Plain Celery as a team runs it beside Flower: the HTTP variant's baseline worker (`http_variant`).

A stock `celery worker` of its own (`celery -A ops.bench.plain_celery worker -E`), nothing of toolloop in
it: Celery's and kombu's own consumer, task events on, acks late, prefetch 1, results in Redis (the same
Redis as everything measured, `TOOLLOOP_REDIS_URL`), on a queue of its own so that neither worker takes the
other's messages. Its one task, `bench.noop`, is what the bench's client sends (`send_task`) and waits for
(`AsyncResult.get`). Measured beside toolloop's own worker, whatever toolloop changes in its worker's consumer
never flatters the baseline.

The app is not made the current one (`set_as_current=False`): importing this module in another process (a
toolloop worker that imports `ops.bench.tools`) leaves that process's Celery app alone.
"""

from __future__ import annotations

import os

from celery import Celery

# The baseline's queue, served by this worker alone.
PLAIN_QUEUE = "bench-plain"
PLAIN_TASK = "bench.noop"

_URL = os.environ.get("TOOLLOOP_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("toolloop-bench-plain", broker=_URL, backend=_URL, set_as_current=False)
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    worker_send_task_events=True,
    task_default_queue=PLAIN_QUEUE,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name=PLAIN_TASK)
def noop() -> str:
    """Do nothing; the result is what `AsyncResult.get` reads."""
    return "ok"


def build_worker_command(executable: str, hostname: str, concurrency: int) -> list[str]:
    """The command line of the baseline worker: `celery worker -E` on `PLAIN_QUEUE`, prefork."""
    return [
        executable,
        "-m",
        "celery",
        "-A",
        "ops.bench.plain_celery",
        "worker",
        "-E",
        f"--queues={PLAIN_QUEUE}",
        f"--concurrency={concurrency}",
        "--pool=prefork",
        "--prefetch-multiplier=1",
        f"--hostname={hostname}",
        "--loglevel=WARNING",
    ]
