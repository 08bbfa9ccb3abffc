"""The worker's Prometheus metrics, in its main process, served on `TOOLLOOP_WORKER_METRICS_PORT` when set.

A tool's outcomes are counted where the orchestrator reads them (`orchestrator.metrics`); what only the worker
sees is counted here: the messages it refused (`workers.poison`). The counter lives in prometheus-client's
default registry of the main process, where Celery's consumer runs; the pool's children count nothing here.
Label values stay bounded: the worker's own queues (or `other`) and `workers.poison.RefusalReason`.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery, signals
from prometheus_client import Counter, start_http_server

logger = logging.getLogger(__name__)

REFUSED_MESSAGES = Counter(
    "toolloop_worker_refused_messages",
    "Messages on a tool queue a worker acked without running them (malformed, foreign, too large), by queue "
    "and reason; the call a message named, if still waited for, was answered invalid_request.",
    ["queue", "reason"],
)


def record_refused_message(queue: str, reason: str) -> None:
    """Count one refused message on `queue` (one of the worker's queues, or `other`) for `reason`."""
    REFUSED_MESSAGES.labels(queue=queue, reason=reason).inc()


def connect_metrics_server(app: Celery, port: int | None, addr: str = "0.0.0.0") -> None:
    """Serve `/metrics` on `port` from the main process of `app`'s worker once it is ready (None: not at all).

    Started when the worker is ready, after its pool is forked: the listening socket is the main process's.
    A port in use is logged, not fatal: the worker serves its tools all the same."""
    if port is None:
        return

    def on_ready(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is not app:
            return
        try:
            start_http_server(port, addr=addr)
        except OSError as exc:
            logger.error("could not serve worker metrics on port %d: %r", port, exc)
            return
        logger.info("worker metrics served on port %d (/metrics)", port)

    signals.worker_ready.connect(on_ready, weak=False)
