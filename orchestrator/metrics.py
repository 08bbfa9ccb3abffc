"""Prometheus metrics of turns, model calls and tool calls (served at `/metrics`).

The runtime calls the `record_*` functions; the API renders `render_latest()`; an orchestrator exposes its
own with `serve_metrics(port)` (`TOOLLOOP_METRICS_PORT`). Metrics live in prometheus-client's default
registry, one per process, which is how Prometheus scrapes a fleet of processes.
Label values stay bounded: statuses, stop reasons, provider names, tool names and failure kinds.

The backlog gauges (`BacklogCollector`: tool queues, turns by tenant and priority, model calls waiting) are
a view of what Redis holds for the whole fleet, not of one process: only the API exports them, by passing
its last read (`orchestrator.store.backlog`) to `render_latest`, so no orchestrator or worker replica
counts them again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from orchestrator.model import TurnOutcome
from workers.contract import ToolOutcome

if TYPE_CHECKING:  # the store's reads import the runtime's outage reporting, which counts here
    from orchestrator.store.backlog import Backlog

# Model calls take seconds and tools from milliseconds to minutes: buckets cover both ends.
_DURATION_BUCKETS_S = (0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)

TURNS_SUBMITTED = Counter("toolloop_turns_submitted", "Turns submitted (client or HTTP API).")
# Labelled by tenant only here, where the label is bounded: the tenants of TOOLLOOP_API_KEYS and "default";
# a turn the admin submits for any other tenant counts as "other" (`api.access.Access.build_tenant_label`).
API_TURNS_SUBMITTED = Counter(
    "toolloop_api_turns_submitted", "Turns submitted through the HTTP API, by tenant.", ["tenant"]
)
TURNS_FINISHED = Counter(
    "toolloop_turns_finished", "Turns that reached a terminal status.", ["status", "stop_reason"]
)
TURN_DURATION = Histogram(
    "toolloop_turn_duration_seconds",
    "Wall time of a turn, first claim to outcome.",
    ["status"],
    buckets=_DURATION_BUCKETS_S,
)
TURN_LLM_CALLS = Histogram(
    "toolloop_turn_llm_calls", "Model calls per finished turn.", buckets=(1, 2, 3, 5, 8, 13, 21, 50)
)
MODEL_CALLS = Counter("toolloop_model_calls", "Model calls by provider and outcome.", ["provider", "outcome"])
MODEL_CALL_DURATION = Histogram(
    "toolloop_model_call_duration_seconds",
    "Duration of one model call.",
    ["provider", "outcome"],
    buckets=_DURATION_BUCKETS_S,
)
MODEL_TOKENS = Counter(
    "toolloop_model_tokens", "Tokens used, by provider and direction.", ["provider", "kind"]
)
MODEL_THROTTLED = Counter(
    "toolloop_model_throttled",
    "Model calls held back by the fleet's rate limits, by model and what held them (requests_per_minute, "
    "tokens_per_minute, provider).",
    ["model", "limit"],
)
MODEL_THROTTLED_WAIT = Counter(
    "toolloop_model_throttled_wait_seconds",
    "Seconds model calls were told to wait by the fleet's rate limits, by model and limit.",
    ["model", "limit"],
)
TOOL_CALLS = Counter(
    "toolloop_tool_calls", "Tool call outcomes by tool and kind (ok or failure kind).", ["tool", "kind"]
)
TOOL_CALL_DURATION = Histogram(
    "toolloop_tool_call_duration_seconds",
    "Duration of one tool call, by tool and outcome kind.",
    ["tool", "kind"],
    buckets=_DURATION_BUCKETS_S,
)


def build_tool_kind(outcome: ToolOutcome) -> str:
    """The `kind` label of a tool outcome: `ok`, or its failure kind."""
    if outcome.ok:
        return "ok"
    return outcome.failure_kind.value if outcome.failure_kind else "error"


def record_turn_submitted() -> None:
    """Count one submitted turn."""
    TURNS_SUBMITTED.inc()


def record_turn_finished(outcome: TurnOutcome, duration_s: float | None = None) -> None:
    """Count a terminal turn by status and stop reason (and its duration when known)."""
    TURNS_FINISHED.labels(status=outcome.status, stop_reason=outcome.stop_reason or "none").inc()
    TURN_LLM_CALLS.observe(outcome.llm_calls)
    if duration_s is not None:
        TURN_DURATION.labels(status=outcome.status).observe(duration_s)


def record_model_call(
    provider: str, outcome: str, duration_s: float, *, input_tokens: int = 0, output_tokens: int = 0
) -> None:
    """Count one model call; `outcome` is e.g. `ok`, `error`, `retryable_error` (keep it a small set)."""
    MODEL_CALLS.labels(provider=provider, outcome=outcome).inc()
    MODEL_CALL_DURATION.labels(provider=provider, outcome=outcome).observe(duration_s)
    if input_tokens:
        MODEL_TOKENS.labels(provider=provider, kind="input").inc(input_tokens)
    if output_tokens:
        MODEL_TOKENS.labels(provider=provider, kind="output").inc(output_tokens)


def record_model_throttled(model: str, limit: str, wait_s: float) -> None:
    """Count one model call held back by a rate limit (`model` is `provider:model`: the limits are set per
    model, and few models run in a fleet) and the wait it was given."""
    MODEL_THROTTLED.labels(model=model, limit=limit).inc()
    MODEL_THROTTLED_WAIT.labels(model=model, limit=limit).inc(wait_s)


def record_tool_outcome(outcome: ToolOutcome) -> None:
    """Count one tool call's outcome (the one that won) by tool and kind, with its duration."""
    kind = build_tool_kind(outcome)
    TOOL_CALLS.labels(tool=outcome.tool, kind=kind).inc()
    TOOL_CALL_DURATION.labels(tool=outcome.tool, kind=kind).observe(outcome.duration_ms / 1000.0)


class BacklogCollector(Collector):
    """The backlog gauges of one read of Redis (`orchestrator.store.backlog.Backlog`): the fleet's, so
    exported by the API alone (see the module's docstring)."""

    def __init__(self, backlog: Backlog) -> None:
        self._backlog = backlog

    def collect(self) -> Iterator[GaugeMetricFamily]:
        backlog = self._backlog
        length = GaugeMetricFamily(
            "toolloop_tool_queue_length",
            "Tool calls waiting in a tool queue for a worker (every priority list of it).",
            labels=["queue"],
        )
        age = GaugeMetricFamily(
            "toolloop_tool_queue_oldest_age_seconds",
            "Seconds since the oldest call waiting in a tool queue was dispatched (0 when it is empty).",
            labels=["queue"],
        )
        for queue in backlog.tool_queues.values():
            length.add_metric([queue.queue], queue.length)
            age.add_metric([queue.queue], queue.oldest_age_s)
        queued = GaugeMetricFamily(
            "toolloop_turns_queued",
            "Turns submitted that no orchestrator runs yet, by tenant and priority.",
            labels=["tenant", "priority"],
        )
        running = GaugeMetricFamily(
            "toolloop_turns_running",
            "Turns an orchestrator runs now, by tenant and priority.",
            labels=["tenant", "priority"],
        )
        for (tenant, priority), count in backlog.turns.items():
            queued.add_metric([tenant, priority], count.queued)
            running.add_metric([tenant, priority], count.running)
        waiting = GaugeMetricFamily(
            "toolloop_model_calls_waiting",
            "Model calls told to wait by a TOOLLOOP_MODEL_LIMITS budget, by its entry (provider:model or "
            "provider).",
            labels=["limit"],
        )
        for key, calls in backlog.model_calls_waiting.items():
            waiting.add_metric([key], calls)
        yield from (length, age, queued, running, waiting)


def render_latest(backlog: Backlog | None = None) -> tuple[bytes, str]:
    """The exposition text of this process's metrics and its content type; with `backlog`, the backlog
    gauges of that read too (`BacklogCollector`)."""
    body = generate_latest()
    if backlog is not None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(BacklogCollector(backlog))
        body += generate_latest(registry)
    return body, CONTENT_TYPE_LATEST


def serve_metrics(port: int, addr: str = "0.0.0.0") -> None:
    """Serve `/metrics` on `port` from a background thread (for the orchestrator process)."""
    start_http_server(port, addr=addr)


REDIS_CALL_ERRORS = Counter(
    "toolloop_redis_errors",
    "Redis calls of the orchestrator that failed and are retried, by loop and exception class.",
    ["loop", "kind"],
)


def record_redis_error(loop: str, exc: BaseException) -> None:
    """Count one failed Redis call that is retried: `loop` names the loop (a small fixed set), `kind` is the
    exception's class name (e.g. `ConnectionError`, `OutOfMemoryError`, `ResponseError`)."""
    REDIS_CALL_ERRORS.labels(loop=loop, kind=type(exc).__name__).inc()


BROKER_CALL_ERRORS = Counter(
    "toolloop_broker_errors",
    "Failed publishes to a Celery broker that is not the state Redis (RabbitMQ, say), retried: by loop and "
    "exception class.",
    ["loop", "kind"],
)


def record_broker_error(loop: str, exc: BaseException) -> None:
    """Count one failed publish to a broker other than the state Redis that is retried (`loop`, `kind` as
    `record_redis_error`'s)."""
    BROKER_CALL_ERRORS.labels(loop=loop, kind=type(exc).__name__).inc()


TURNS_LOST = Counter(
    "toolloop_turns_lost",
    "Turns an orchestrator ran whose keys Redis lost (it came back without its data, or its latest writes).",
)
REDIS_DATA_LOSSES = Counter(
    "toolloop_redis_data_losses",
    "Times Redis came back without its data (kind=empty) or without turns it held (kind=partial).",
    ["kind"],
)


def record_turns_lost(count: int) -> None:
    """Count `count` turns lost with Redis's data."""
    TURNS_LOST.inc(count)


def record_redis_data_loss(kind: str) -> None:
    """Count one time Redis came back without its data (`empty`) or some of it (`partial`)."""
    REDIS_DATA_LOSSES.labels(kind=kind).inc()


ARCHIVE_FAILURES = Counter(
    "toolloop_archive_failures",
    "Finished turns whose record was not handed to the archive task, by stage: `read` (their record could "
    "not be read), `publish` (the broker refused it), `stopped` (the orchestrator stopped first).",
    ["stage"],
)


def record_archive_failure(stage: str) -> None:
    """Count one finished turn whose record was not archived; `stage` is `read`, `publish` or `stopped`."""
    ARCHIVE_FAILURES.labels(stage=stage).inc()


ATTENTION_FAILURES = Counter(
    "toolloop_attention_failures",
    "Calls waiting for a person whose notice the attention task (TOOLLOOP_ATTENTION_TASK) never got: the "
    "broker refused it, or the orchestrator stopped first.",
)


def record_attention_failure() -> None:
    """Count one waiting call whose notice was not sent to the attention task."""
    ATTENTION_FAILURES.inc()
