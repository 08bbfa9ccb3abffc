"""`python -m ops.bench [--quick] [--json-only] [--http-only]`: JSON lines of every figure, then a table.

The HTTP variant (`http_variant`: CPU per tool call of every process and what Redis does per call and per
turn, the model over HTTP; then the first token's overhead, `first_token`) runs first, on a stack of its own;
the Redis Cluster's (`cluster_load`: how a burst's commands fall across three masters) last, on another;
`--http-only` runs the HTTP variant alone (about two minutes in full on 2 cores), for working on what a call
costs.
"""

from __future__ import annotations

import json
import platform
import sys
import time

import redis
import typer
from rich.console import Console

from ops.bench.cluster_load import run_cluster_load
from ops.bench.cpu import read_loadavg
from ops.bench.http_variant import run_http_variant
from ops.bench.model_limits import run_model_limits
from ops.bench.report import Metric, print_table
from ops.bench.run import machine_facts, run_bench
from ops.bench.scenarios import FULL, QUICK
from orchestrator.redis_server import find_redis_server


def main(
    quick: bool = typer.Option(False, "--quick", help="Small counts: a smoke run of every scenario."),
    json_only: bool = typer.Option(False, "--json-only", help="Only the JSON lines, no table or progress."),
    http_only: bool = typer.Option(
        False,
        "--http-only",
        help="Only the HTTP variant: CPU and Redis per tool call, throughput, the first token's overhead.",
    ),
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
    sizes = QUICK if quick else FULL
    load_before = read_loadavg()
    run_http_variant(sizes, emit, progress)
    if not http_only:
        run_bench(sizes, emit, progress)
        run_model_limits(500 if quick else 2000, emit, progress)
        run_cluster_load(sizes, emit, progress)
    if not json_only:
        facts = {
            **machine_facts(),
            "python": platform.python_version(),
            "redis": _redis_version(),
            "mode": ("quick" if quick else "full") + (", HTTP variant only" if http_only else ""),
            "loadavg_before": load_before,
            "loadavg_after": read_loadavg(),
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
