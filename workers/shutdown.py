"""A worker's stop when its Redis hangs: a warm shutdown that cannot finish becomes a prompt exit.

A frozen Redis (SIGSTOPped, a stalled failover, a black-holed network) accepts connections and answers
nothing. Celery's main thread then sits in a broker read or in kombu's reconnect loop (worker heartbeats are
published with retries and no limit), so a warm shutdown asked for by SIGTERM or SIGINT never gets to run:
the worker would stop only on SIGKILL. Once a shutdown starts, a watchdog thread gives it `grace_s`; if the
process is still there and the worker's Redis does not answer a PING within `ping_timeout_s`, it kills the
pool children and exits. That is what a crash does, and what toolloop survives by design: the tasks those
children ran are unacknowledged, so the broker redelivers them, and a redelivered call meets its recorded
outcome or its running guard. While Redis answers, the warm shutdown is left alone: finishing
the running tools (bounded by their hard limits) is its job.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import redis
from celery import signals

from workers.connect import connect_redis
from workers.descendants import end_descendants
from workers.redis_errors import classify
from workers.settings import WorkerSettings

logger = logging.getLogger(__name__)

# A warm shutdown against a Redis that is merely down ends in about 2.5 s (Celery gives up its reconnect
# loop): the watchdog waits longer than that before it looks, so it only ever ends the hung case.
STOP_GRACE_S = 4.0
PING_TIMEOUT_S = 1.0
# The exit status of a worker that had to leave its warm shutdown unfinished.
EXIT_FORCED = 1


def connect_stop_watchdog(
    settings: WorkerSettings, *, grace_s: float = STOP_GRACE_S, ping_timeout_s: float = PING_TIMEOUT_S
) -> None:
    """Start the watchdog when a shutdown of this worker process begins (Celery's `worker_shutting_down`)."""

    def on_shutting_down(**_: Any) -> None:
        watchdog = threading.Thread(
            target=watch_stop,
            args=(settings, grace_s, ping_timeout_s),
            name="toolloop-stop-watchdog",
            daemon=True,
        )
        watchdog.start()

    signals.worker_shutting_down.connect(on_shutting_down, weak=False)


def watch_stop(settings: WorkerSettings, grace_s: float, ping_timeout_s: float) -> None:
    """After `grace_s`, exit now unless Redis answers (the warm shutdown is then merely slow, and legit)."""
    time.sleep(grace_s)
    if redis_answers(settings, ping_timeout_s):
        return
    logger.warning(
        "Redis at %s does not answer: stopping now instead of waiting on it (running calls are redelivered)",
        settings.redis_url.rsplit("@", 1)[-1],
    )
    # The pool and everything its calls started: nothing a tool spawned outlives its worker.
    end_descendants(os.getpid(), timeout_s=1.0)
    logging.shutdown()
    os._exit(EXIT_FORCED)


def redis_answers(settings: WorkerSettings, timeout_s: float) -> bool:
    """True when the worker's Redis answers a PING within `timeout_s`."""
    client: redis.Redis | None = None
    try:
        client = connect_redis(
            settings.redis_url,
            settings.redis_ssl_cert_reqs,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
        )
        return bool(client.ping())
    except Exception as exc:
        # A Redis Cluster's client reads the slot map as it is made, and tells no node answered with an
        # exception of its own, not a RedisError (the connection error behind it is what `classify` sees).
        if classify(exc) is None:
            raise
        return False
    finally:
        if client is not None:
            client.close()
