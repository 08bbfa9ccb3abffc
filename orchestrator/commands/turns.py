"""`toolloop orchestrator` (the process that drives turns) and `toolloop demo` (the whole system, once)."""

from __future__ import annotations

import asyncio
import logging
import resource

import typer
from pydantic import ValidationError
from pydantic_settings import SettingsError

from orchestrator.commands.exits import describe_validation_error
from orchestrator.errors import ModelConfigError
from orchestrator.pricing import build_price_table
from orchestrator.settings import get_settings
from workers.connect import probe_redis_layout

# A setting the orchestrator cannot start with (as `toolloop submit`'s bad input).
EXIT_CONFIG = 2
# Files an orchestrator holds besides its model calls' sockets: Redis pools, Celery's producer, logs, metrics.
OTHER_FILES = 256


def orchestrator(
    orchestrator_id: str | None = typer.Option(
        None, "--id", help="Orchestrator id (default: host-pid-random; must be unique among live ones)."
    ),
    metrics_port: int | None = typer.Option(
        None, envvar="TOOLLOOP_METRICS_PORT", help="Serve Prometheus /metrics of this process on this port."
    ),
    log_level: str = typer.Option("INFO", envvar="TOOLLOOP_LOG_LEVEL", help="Logging level."),
) -> None:
    """Claim turns from Redis and drive them to their outcome until SIGTERM/SIGINT."""
    from orchestrator import metrics
    from orchestrator.runtime.process import serve

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = get_settings()
        # A bad TOOLLOOP_MODEL_PRICES entry is found before anything starts: one line naming it, exit 2.
        build_price_table(settings.model_prices)
    except (ValidationError, SettingsError, ModelConfigError) as exc:
        typer.echo(f"error: {_one_line(exc)}", err=True)
        raise typer.Exit(EXIT_CONFIG) from None
    probe_redis_layout(settings.redis_url)  # a cluster taken for one Redis, or the reverse: one line, exit 2
    raise_open_files_limit(settings.model_max_connections + OTHER_FILES)
    if metrics_port is not None:
        metrics.serve_metrics(metrics_port)
    asyncio.run(serve(settings, orchestrator_id=orchestrator_id))


def raise_open_files_limit(needed: int) -> int:
    """Raise this process's soft limit on open files towards `needed` (never above the hard limit); the
    limit now. Each model call in flight holds a socket: a soft limit of 1024, common under systemd, would
    refuse connections long before TOOLLOOP_MODEL_MAX_CONNECTIONS is reached."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < ceiling:
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
        soft = ceiling
    if soft != resource.RLIM_INFINITY and soft < needed:
        logging.getLogger("toolloop.orchestrator").warning(
            "open files are limited to %d (hard limit): model calls beyond about %d in flight will fail to "
            "connect; raise the limit or lower TOOLLOOP_MODEL_MAX_CONNECTIONS",
            soft,
            max(soft - OTHER_FILES, 0),
        )
    return int(soft)


def _one_line(exc: ValidationError | SettingsError | ModelConfigError) -> str:
    if isinstance(exc, ValidationError):
        return describe_validation_error(exc, "settings")
    # pydantic-settings names the variable's field when its value is not JSON.
    return str(exc) + (": not valid JSON" if isinstance(exc.__cause__, ValueError) else "")


def demo(
    prompt: str | None = typer.Option(None, help="The user message (default: a multi-tool question)."),
    model: str | None = typer.Option(None, help="provider:model (default: TOOLLOOP_MODEL or scripted:demo)."),
    timeout_s: float = typer.Option(60.0, "--timeout", help="Seconds to wait for the turn."),
    keep_running: bool = typer.Option(
        False,
        "--keep-running",
        help="Keep everything running after the turn (its page, Flower) until Ctrl-C.",
    ),
) -> None:
    """Start Redis, a worker, an orchestrator and a model; run one real turn; print it; stop everything."""
    from orchestrator.demo.run import run_demo

    raise typer.Exit(run_demo(prompt=prompt, model=model, timeout_s=timeout_s, keep_running=keep_running))


def register(app: typer.Typer) -> None:
    """Add `orchestrator` and `demo` to `app`."""
    app.command("orchestrator")(orchestrator)
    app.command("demo")(demo)
