"""The Celery app and its whole configuration, in one place (SPEC §8.2, ARCHITECTURE "Celery facts").

`create_app(settings)` is what both sides build on: it imports no tool module, so the orchestrator can use
it to publish tasks by name. `create_worker_app(settings)` is the worker's app: it imports the tool modules
of `settings.tool_modules`, registers one task `tool.<name>` per tool, and publishes the catalogue.
"""

from __future__ import annotations

import importlib
import ssl
from typing import Any

from celery import Celery

from workers.settings import WorkerSettings, get_worker_settings

_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
RESULT_EXPIRES_S = 24 * 3600


class ToolloopCelery(Celery):
    """A Celery app that carries the toolloop settings it was built from."""

    settings: WorkerSettings


def build_celery_config(settings: WorkerSettings) -> dict[str, Any]:
    """The Celery configuration of every toolloop process (pure: a dict of Celery settings)."""
    config: dict[str, Any] = {
        # JSON only: a pickled payload is refused, so nothing but data crosses (SPEC §4.2, §8.2).
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # At-least-once with no silent loss: ack after the run, requeue when the child dies, one at a time.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # An unacked message is redelivered after this; it must exceed the longest hard limit + queue wait.
        "broker_transport_options": {"visibility_timeout": settings.visibility_timeout_s},
        "result_backend_transport_options": {"visibility_timeout": settings.visibility_timeout_s},
        # Flower is a window on these events (SPEC §7.3).
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": True,
        # Tool outcomes travel in our own keys; Celery results exist only for other tasks, and expire.
        "result_backend": settings.redis_url,
        "result_expires": RESULT_EXPIRES_S,
        "task_default_queue": settings.default_queue,
        "broker_connection_retry_on_startup": True,
        # A Redis blip must not kill running tools: a redelivered copy meets the running guard instead.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "enable_utc": True,
    }
    config.update(build_ssl_config(settings))
    return config


def build_ssl_config(settings: WorkerSettings) -> dict[str, Any]:
    """For rediss:// URLs, certificate checks set explicitly (kombu would silently skip them otherwise)."""
    cert_reqs = _CERT_REQS.get(settings.redis_ssl_cert_reqs.lower())
    if cert_reqs is None:
        raise ValueError(
            "TOOLLOOP_REDIS_SSL_CERT_REQS must be required, optional or none, "
            f"not {settings.redis_ssl_cert_reqs!r}"
        )
    config: dict[str, Any] = {}
    if settings.effective_broker_url.startswith("rediss://"):
        config["broker_use_ssl"] = {"ssl_cert_reqs": cert_reqs}
    if settings.redis_url.startswith("rediss://"):
        config["redis_backend_use_ssl"] = {"ssl_cert_reqs": cert_reqs}
    return config


def create_app(settings: WorkerSettings | None = None, *, main: str = "toolloop") -> ToolloopCelery:
    """A configured Celery app that knows no tool: what the orchestrator publishes with."""
    settings = settings or get_worker_settings()
    app = ToolloopCelery(main, broker=settings.effective_broker_url, set_as_current=False)
    app.settings = settings
    app.conf.update(build_celery_config(settings))
    return app


def create_worker_app(settings: WorkerSettings | None = None) -> ToolloopCelery:
    """The worker's app: imports the tool modules and registers one `tool.<name>` task per tool.

    Tools registered later in this process (a tool module imported at run time) get their task too.
    """
    from workers.catalogue import connect_catalogue_publisher
    from workers.tasks import register_tool_task, register_worker_signals
    from workers.tools import Tool, registry

    settings = settings or get_worker_settings()
    app = create_app(settings, main="toolloop-worker")
    for module in settings.tool_module_list:
        importlib.import_module(module)
    for tool in registry:
        register_tool_task(app, tool)

    def serve_new_tool(tool: Tool[Any, Any]) -> None:
        register_tool_task(app, tool)

    registry.on_add(serve_new_tool)
    register_worker_signals(app)
    connect_catalogue_publisher(app)
    return app
