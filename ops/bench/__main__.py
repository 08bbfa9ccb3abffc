"""`python -m ops.bench [--quick] [--json-only]`: JSON lines of every figure, then a table."""

from __future__ import annotations

import json
import platform
import sys
import time

import redis
import typer
from rich.console import Console

from ops.bench.report import Metric, print_table
from ops.bench.run import machine_facts, run_bench
from ops.bench.scenarios import FULL, QUICK
from ops.redis_server import find_redis_server


def main(
    quick: bool = typer.Option(False, "--quick", help="Small counts: a smoke run of every scenario."),
    json_only: bool = typer.Option(False, "--json-only", help="Only the JSON lines, no table or progress."),
) -> None:
    """Measure toolloop against plain Celery on one embedded Redis and the same workers."""
    # Wide enough for the table when the output is a file or a pipe (make bench | tee).
    out = Console(highlight=False, width=max(Console().width, 130))
    err = Console(stderr=True, highlight=False)
    metrics: list[Metric] = []

    def emit(metric: Metric) -> None:
        metrics.append(metric)
        print(metric.to_json(), flush=True)

    def progress(text: str) -> None:
        if not json_only:
            err.print(f"[dim]bench: {text}[/dim]")

    started = time.monotonic()
    run_bench(QUICK if quick else FULL, emit, progress)
    if not json_only:
        facts = {
            **machine_facts(),
            "python": platform.python_version(),
            "redis": _redis_version(),
            "mode": "quick" if quick else "full",
            "duration_s": f"{time.monotonic() - started:.0f}",
        }
        print_table(metrics, out, title="toolloop vs plain Celery")
        out.print(json.dumps(facts))


def _redis_version() -> str:
    import subprocess

    try:
        text = subprocess.run(
            [find_redis_server(), "--version"], capture_output=True, text=True, check=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    for part in text.split():
        if part.startswith("v="):
            return part[2:]
    return text.strip() or f"redis-py {redis.__version__}"


if __name__ == "__main__":
    typer.run(main)
    sys.exit(0)
