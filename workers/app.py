"""The Celery app and its whole configuration, in one place.

`create_app(settings)` is what both sides build on: it imports no tool module, so the orchestrator can use
it to publish tasks by name. `create_worker_app(settings)` is the worker's app: it imports the tool modules
of `settings.tool_modules` (from the current folder too, as `celery -A` does), registers one task
`tool.<name>` per tool, publishes the catalogue, and answers a tool task it does not serve
(`workers.unserved`). `build_worker_queues` says which queues a worker consumes: exactly its tools' own.

Design notes: docs/design/tool-calls.md, "How Celery is configured".
"""

from __future__ import annotations

import importlib
import os
import ssl
import sys
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from celery import Celery, signals

from workers.broker import use_master_checking_sentinels
from workers.connect import build_sentinel_broker_url, is_sentinel_url, resolve_master_name
from workers.contract import TASK_NAME_PREFIX, ToolSpec, build_task_name
from workers.errors import ToolDefinitionError, ToolModuleError
from workers.settings import WorkerSettings, get_worker_settings

_CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}
RESULT_EXPIRES_S = 24 * 3600


class ToolloopCelery(Celery):
    """A Celery app that carries the toolloop settings it was built from."""

    settings: WorkerSettings
    # A pool process resolves the task of an MCP tool listed after it was forked (`workers.mcp.registry`).
    registry_cls = "workers.mcp.registry:ToolTaskRegistry"

    def worker_main(self, argv: list[str] | None = None) -> NoReturn:
        """Run Celery's `worker` command, then exit with the worker's exit code.

        Celery's own `worker_main` exits 0 whatever happened: the code its command passes to click's
        `ctx.exit` does not come back out of `Celery.start` (click runs without `standalone_mode`), so a
        worker stopped by an "Unrecoverable error" (EX_FAILURE) looked like a clean stop to its supervisor.
        The code is read from the worker itself instead.
        """
        if argv is None or "worker" not in argv:
            raise ValueError("the worker sub-command must be in argv")
        started: list[Any] = []

        def keep(sender: Any = None, **_: Any) -> None:
            if getattr(sender, "app", None) is self:
                started.append(sender)

        signals.worker_init.connect(keep, weak=False, dispatch_uid=f"toolloop-exit-code-{id(self)}")
        returned: Any = self.start(argv=argv)  # celery-types has it NoReturn; it returns
        exitcode = getattr(started[-1], "exitcode", None) if started else None
        raise SystemExit(exitcode or returned or 0)


# kombu's Redis transport keeps a list per step and serves the lowest first (its default steps, stated here
# because publisher and workers must agree: `orchestrator.publishing.publisher.REDIS_PRIORITIES`).
PRIORITY_STEPS = (0, 3, 6, 9)
# kombu's name for a body kept as the text it is (`Channel.encode_body` leaves 'utf-8' alone).
BODY_ENCODING = "utf-8"


def build_result_backend_url(settings: WorkerSettings) -> str:
    """Where Celery keeps the results of tasks other than tools: the state Redis, or the broker when the state
    is on a Redis Cluster (its own Redis; `rpc://` for an AMQP broker)."""
    if settings.redis_cluster:
        broker = settings.effective_broker_url
        return broker if broker.startswith(("redis://", "rediss://", "sentinel://")) else "rpc://"
    if is_sentinel_url(settings.redis_url):
        return build_sentinel_broker_url(settings.redis_url)
    return settings.redis_url


def build_celery_config(settings: WorkerSettings) -> dict[str, Any]:
    """The Celery configuration of every toolloop process (pure: a dict of Celery settings)."""
    config: dict[str, Any] = {
        # JSON only: a pickled payload is refused, so nothing but data crosses.
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
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            # Redis: a list per priority step, the lowest served first (the publisher's lanes use 0 and 6).
            "priority_steps": list(PRIORITY_STEPS),
            # Redis: message bodies (JSON text) as they are, not in kombu's default base64, a third bigger on
            # every LPUSH, unacked copy and event. Each message says its encoding: any kombu reads both.
            "body_encoding": BODY_ENCODING,
            **build_sentinel_options(settings.effective_broker_url, settings),
        },
        "result_backend_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            **build_sentinel_options(settings.redis_url, settings),
        },
        # Flower is a window on these events.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": True,
        # Tool outcomes travel in our own keys; Celery results exist only for other tasks, and expire.
        # Celery's Redis backend speaks no Redis Cluster: on one, they go to the broker (`rpc://` for AMQP).
        "result_backend": build_result_backend_url(settings),
        "result_expires": RESULT_EXPIRES_S,
        "broker_connection_retry_on_startup": True,
        # A Redis blip must not kill running tools: a redelivered copy meets the running guard instead.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # ... and the consumer's channels survive that blip with calls running (kombu would exit the worker).
        "worker_consumer": "workers.broker:RestartSafeConsumer",
        "enable_utc": True,
    }
    if is_sentinel_url(settings.effective_broker_url):
        config["broker_failover_strategy"] = StayOnSentinels
        use_master_checking_sentinels()
    config.update(build_ssl_config(settings))
    return config


class StayOnSentinels:
    """kombu's failover strategy for a `sentinel://` broker URL: never switch to another part of the URL.

    kombu reads a `;`-separated URL as alternative brokers and, when connecting fails, switches to the next.
    For a Sentinel URL every part is already one of the sentinels its channel asks for the master, so a
    switch finds nothing new — and it closes the connection under the consumer's channels, after which the
    next lost connection kills the worker (AttributeError in kombu's channel close: "Unrecoverable error").
    Falsy, so that `Connection.maybe_switch_next` never switches; an iterator, as kombu skips its first entry.
    """

    def __init__(self, alternates: Iterable[str]) -> None:
        self._first = next(iter(alternates), "")

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> StayOnSentinels:
        return self

    def __next__(self) -> str:
        return self._first


def build_sentinel_options(url: str, settings: WorkerSettings) -> dict[str, Any]:
    """For a `sentinel://` broker or backend URL, the transport option naming its master (kombu and Celery
    find no Redis without it); nothing for other URLs. Raises `RedisConfigError` when no name is set."""
    if not is_sentinel_url(url):
        return {}
    return {"master_name": resolve_master_name(settings.redis_master_name)}


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
    signals.before_task_publish.connect(
        drop_repeated_reprs, weak=False, dispatch_uid="toolloop-drop-repeated-reprs"
    )
    return app


def drop_repeated_reprs(
    sender: str | None = None, properties: dict[str, Any] | None = None, **_: Any
) -> None:
    """Celery's `before_task_publish` receiver: a tool-call message carries nothing twice or unread.

    `send_task` puts `argsrepr`/`kwargsrepr` in the message's headers, where workers and Flower read them,
    and hands them on as leftover publish options, which kombu adds to the properties: every message would
    carry its redacted arguments twice. `reply_to` names where an RPC result backend would answer: a tool
    task stores no result. Redis stores each message twice (its queue, then the unacked hash).
    """
    if properties is not None and sender is not None and sender.startswith(TASK_NAME_PREFIX):
        for name in ("argsrepr", "kwargsrepr", "reply_to"):
            properties.pop(name, None)


def create_worker_app(settings: WorkerSettings | None = None) -> ToolloopCelery:
    """The worker's app: imports the tool modules and registers one `tool.<name>` task per tool.

    Raises `ToolModuleError` for a module that does not import or defines a bad tool. Tools registered
    later in this process (a tool module imported at run time) get their task too; the worker consumes
    their queue only if it already did (a queue they share with a tool it was started with).
    """
    from workers.acks import connect_ack_retries
    from workers.catalogue import connect_catalogue_publisher
    from workers.descendants import connect_descendant_reaper
    from workers.mcp.serving import start_mcp_serving
    from workers.metrics import connect_metrics_server
    from workers.shutdown import connect_stop_watchdog
    from workers.tasks import register_tool_task, register_worker_signals
    from workers.time_limits import connect_late_limit_guard
    from workers.tools import Tool, registry
    from workers.unserved import connect_unserved_answer

    settings = settings or get_worker_settings()
    app = create_app(settings, main="toolloop-worker")
    import_tool_modules(settings.tool_module_list)
    for tool in registry:
        register_tool_task(app, tool)

    def serve_new_tool(tool: Tool[Any, Any]) -> None:
        # A tool listed again (an MCP server's new listing) keeps its task: it calls the same server tool.
        if build_task_name(tool.name) not in app.tasks:
            register_tool_task(app, tool)

    registry.on_add(serve_new_tool)
    start_mcp_serving(app, settings)
    register_worker_signals(app)
    connect_catalogue_publisher(app)
    connect_unserved_answer(app)
    connect_descendant_reaper(app)
    connect_late_limit_guard(app)
    connect_ack_retries(app)
    connect_stop_watchdog(settings)
    connect_metrics_server(app, settings.worker_metrics_port)
    return app


def import_tool_modules(modules: Iterable[str]) -> None:
    """Import each tool module, the current folder first on the path (`myapp.tools` beside you imports).

    The folder stays on the path for the life of the process, not only while importing as `celery -A` has
    it: a tool that imports a sibling module lazily, in the pool child, must find it too. Raises
    `ToolModuleError` naming the module and its error in a line.
    """
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:  # a tool module may raise anything while it is imported
            raise ToolModuleError(module, describe_import_error(module, exc, cwd)) from exc


def describe_import_error(module: str, exc: BaseException, cwd: str) -> str:
    """One line on why tool module `module` did not import: its error, and where in the module's code."""
    if isinstance(exc, ToolDefinitionError):
        what = f"tool module '{module}' defines a bad tool: {exc}"
    else:
        what = f"tool module '{module}' did not import: {type(exc).__name__}: {exc}"
    if isinstance(exc, ModuleNotFoundError) and exc.name and _is_prefix(exc.name, module):
        return f"{what} (looked in the current folder {cwd} and on sys.path)"
    where = _user_frame(exc, cwd)
    return f"{what} (at {where})" if where else what


def _is_prefix(package: str, module: str) -> bool:
    return module == package or module.startswith(package + ".")


def _user_frame(exc: BaseException, cwd: str) -> str | None:
    """`file, line N` of the innermost frame outside toolloop's `workers` and the import machinery."""
    machinery = (Path(__file__).resolve().parent, Path(importlib.__file__).resolve().parent)
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.filename.startswith("<"):
            continue
        path = Path(frame.filename).resolve()
        if any(path.is_relative_to(folder) for folder in machinery):
            continue
        shown = path.relative_to(cwd) if path.is_relative_to(cwd) else path
        return f"{shown}, line {frame.lineno}"
    return None


def build_worker_queues(
    specs: Iterable[ToolSpec], requested: Sequence[str] | None, mcp_queues: Iterable[str] = ()
) -> list[str]:
    """The queues a worker serving `specs` consumes: all of its tools' queues, or the `requested` ones.

    `mcp_queues` are its MCP servers' queues, consumed even while a server has listed no tool yet.
    Raises ValueError (one line) when there is no tool to serve, or when a requested queue is one none of
    the tools uses — a worker consuming it would take calls it cannot run.
    """
    tool_queues = sorted({spec.queue for spec in specs} | set(mcp_queues))
    if not tool_queues:
        raise ValueError("no tool to serve: TOOLLOOP_TOOL_MODULES defines no @tool, and no MCP server is set")
    if requested is None:
        return tool_queues
    chosen = list(dict.fromkeys(q.strip() for q in requested if q.strip()))
    foreign = [queue for queue in chosen if queue not in tool_queues]
    if foreign or not chosen:
        raise ValueError(
            f"--queues {', '.join(foreign) or '(empty)'}: no tool of this worker uses "
            f"{'that queue' if len(foreign) == 1 else 'these queues'}, so it could not run what arrives "
            f"there; its tools' queues are {', '.join(tool_queues)}"
        )
    return chosen
