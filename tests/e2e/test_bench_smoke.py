"""`python -m ops.bench --quick --json-only` prints every figure, well-formed; never a timing assertion."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = {
    "tool_roundtrip_p50_ms": True,
    "tool_roundtrip_p99_ms": True,
    "celery_roundtrip_p50_ms": False,
    "celery_roundtrip_p99_ms": False,
    "turn_overhead_ms": False,
    "tool_calls_per_s": True,
    "celery_tasks_per_s": False,
    "tool_calls_per_s_w1": True,
    "tool_calls_per_s_w2": True,
    "tool_calls_per_s_w4": True,
    "celery_tasks_per_s_w1": False,
    "celery_tasks_per_s_w2": False,
    "celery_tasks_per_s_w4": False,
    "parked_turns_rss_mb": False,
    "parked_idle_cpu_pct": False,
    "deadline_lag_p99_ms": False,
}


@pytest.mark.e2e
@pytest.mark.timeout(150)
def test_quick_bench_prints_every_metric() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ops.bench", "--quick", "--json-only"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    by_name = {r["metric"]: r for r in records}
    assert set(EXPECTED) <= set(by_name), f"missing: {sorted(set(EXPECTED) - set(by_name))}"
    for record in records:
        assert isinstance(record["metric"], str) and record["metric"]
        assert isinstance(record["unit"], str) and record["unit"]
        assert isinstance(record["value"], int | float) and math.isfinite(record["value"])
        assert record["value"] >= 0
    for name, compares in EXPECTED.items():
        record = by_name[name]
        if compares:
            assert record["baseline"] > 0
            assert record["ratio"] == pytest.approx(record["value"] / record["baseline"], rel=0.01, abs=0.002)
        else:
            assert "ratio" not in record
