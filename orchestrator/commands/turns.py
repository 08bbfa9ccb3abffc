"""`toolloop orchestrator` (the process that drives turns) and `toolloop demo` (the whole system, once)."""

from __future__ import annotations

import asyncio
import logging

import typer

from orchestrator.settings import get_settings


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
    if metrics_port is not None:
        metrics.serve_metrics(metrics_port)
    asyncio.run(serve(get_settings(), orchestrator_id=orchestrator_id))


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
    from ops.demo import run_demo

    raise typer.Exit(run_demo(prompt=prompt, model=model, timeout_s=timeout_s, keep_running=keep_running))


def register(app: typer.Typer) -> None:
    """Add `orchestrator` and `demo` to `app`."""
    app.command("orchestrator")(orchestrator)
    app.command("demo")(demo)
