"""`python -m ops.bench --quick --json-only` prints every figure, well-formed; never a timing assertion."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from ops.bench.scenarios import QUICK

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
    "conversation_json_kb": False,
    "redis_written_per_turn_ratio": False,
    "redis_written_per_turn_kb": False,
    "redis_held_per_turn_ratio": False,
    "redis_held_per_turn_kb": False,
    "redis_held_past_1h_per_turn_ratio": False,
    "redis_used_memory_per_turn_ratio": False,
    # Issue 14: a streamed turn's events and Redis bytes, against the same turn not streamed.
    "streamed_turn_events": False,
    "streamed_turn_text_deltas": False,
    "streamed_turn_redis_written_kb": True,
    "streamed_turn_events_held_kb": True,
    # Issue 16: CPU per tool call by process and throughput, the model over HTTP, against plain Celery.
    "cpu_ms_per_call_all": True,
    "worker_cpu_ms_per_call": True,
    "orchestrator_cpu_ms_per_call": False,
    "redis_cpu_ms_per_call": True,
    "client_cpu_ms_per_call": True,
    "model_server_cpu_ms_per_call": False,
    "tool_calls_per_s_http_w2": True,
    # Issues 35 and 36: what Redis does per tool call and per turn, against plain Celery's tasks.
    "redis_commands_per_call": True,
    "redis_commands_per_turn": True,
    "redis_cpu_ms_per_turn": True,
    "tool_calls_per_s_per_redis_core": True,
    "redis_used_memory_per_turn_kb": False,
    # Issue 36 item 3: the first token's overhead through both paths, and the CPU per streamed delta.
    "first_token_overhead_client_p50_ms": False,
    "first_token_overhead_client_p99_ms": False,
    "first_token_overhead_sse_p50_ms": False,
    "first_token_overhead_sse_p99_ms": False,
    "streamed_delta_cpu_ms_client": False,
    "streamed_delta_cpu_ms_sse": False,
    # Issue 35 item 3: a burst's commands across a three-master cluster, and a call's commands there.
    "cluster_commands_spread_pct": False,
    "cluster_redis_commands_per_call": False,
    "cluster_redis_cpu_ms_per_call": False,
    "cluster_turns_per_s": False,
    # Issue 19: the speed claims the suite no longer makes.
    "wait_wake_p99_ms": False,
    "cancel_latency_p99_ms": False,
    "parallel_tools_ratio": False,
    "orchestrator_stop_s": False,
}
# The CPU rows of the quick run (the full run adds the 100-round one).
EXPECTED.update({f"orchestrator_cpu_ms_per_call_r{rounds}": False for rounds in QUICK.cpu_rounds})
# Issue 36's storage figures: reported against their targets (never asserted here), with what they came from.
STORAGE_GOALS = {"redis_written_per_turn_ratio": "<= 3", "redis_held_per_turn_ratio": "<= 1.2"}


@pytest.mark.e2e
# The quick run took 143-155 s on 2 cores shared with other tests (load 3-4; the HTTP variant with the Redis
# rows and the first token: ~45 s of it), and the cluster's burst adds ~25 s; room for more load.
@pytest.mark.timeout(330)
def test_quick_bench_prints_every_metric() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ops.bench", "--quick", "--json-only"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=320,
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
    _check_growth_figures(by_name)
    _check_http_figures(by_name)
    _check_redis_figures(by_name)
    _check_first_token_figures(by_name)
    # A streamed answer of 1,500 characters is several coalesced events, fewer than its words (~200).
    deltas = by_name["streamed_turn_text_deltas"]
    assert deltas["answer_chars"] == QUICK.stream_answer_chars
    assert isinstance(deltas["value"], float | int) and 2 <= deltas["value"] < 100


def _check_growth_figures(by_name: dict[str, dict[str, object]]) -> None:
    """The storage and CPU rows say what they measured: turn shape, sizes, and the parts of each figure."""
    conversation = by_name["conversation_json_kb"]
    assert conversation["rounds"] == 40
    assert conversation["result_kb"] == 8
    # 40 results of 8 kB each: the conversation the ratios divide by is at least their size.
    assert isinstance(conversation["value"], float) and conversation["value"] >= 320
    for name, goal in STORAGE_GOALS.items():
        assert by_name[name]["goal"] == goal
        assert isinstance(by_name[name]["met"], bool)
    assert by_name["redis_written_per_turn_ratio"]["written_kb"] == pytest.approx(
        by_name["redis_written_per_turn_kb"]["value"], rel=0.01
    )
    held = by_name["redis_held_per_turn_ratio"]
    assert isinstance(held["value"], float)
    assert by_name["redis_held_per_turn_kb"]["value"] == pytest.approx(
        held["value"] * conversation["value"], rel=0.01
    )
    assert isinstance(held["own_keys_kb"], float) and held["own_keys_kb"] > 0
    kinds = held["by_kind_kb"]
    # Every turn leaves at least its request and its outcome under its own id.
    assert isinstance(kinds, dict) and any("{turn}" in kind for kind in kinds)
    for rounds in QUICK.cpu_rounds:
        row = by_name[f"orchestrator_cpu_ms_per_call_r{rounds}"]
        assert row["rounds"] == rounds
        assert row["result_kb"] == 50
        assert isinstance(row["calls"], int) and row["calls"] >= rounds
        assert isinstance(row["model_cpu_ms"], float | int)


def _check_http_figures(by_name: dict[str, dict[str, object]]) -> None:
    """The HTTP variant's rows say what they compared: calls, workers, and the parts of "all processes"."""
    cpu_all = by_name["cpu_ms_per_call_all"]
    assert cpu_all["calls"] == QUICK.http_turns * 5 * QUICK.http_rounds
    assert cpu_all["workers"] == 2
    parts = {"client", "worker_parent", "worker_children", "redis"}
    assert isinstance(cpu_all["toolloop_ms"], dict) and set(cpu_all["toolloop_ms"]) == {
        *parts,
        "orchestrator",
    }
    assert isinstance(cpu_all["celery_ms"], dict) and set(cpu_all["celery_ms"]) == parts
    # The model server stands for a hosted model: reported on its own row, never in "all".
    assert cpu_all["model_server_excluded"] is True
    assert by_name["model_server_cpu_ms_per_call"]["in_all"] is False
    worker = by_name["worker_cpu_ms_per_call"]
    assert {"parent_ms", "children_ms", "celery_parent_ms", "celery_children_ms"} <= set(worker)
    assert {"commands_per_call", "celery_commands_per_task"} <= set(by_name["redis_cpu_ms_per_call"])


def _check_redis_figures(by_name: dict[str, dict[str, object]]) -> None:
    """The Redis rows agree with each other and say what they counted; their goals are reported."""
    commands = by_name["redis_commands_per_call"]
    assert commands["goal"] == "ratio <= 1" and isinstance(commands["met"], bool)
    assert commands["calls"] == QUICK.http_turns * 5 * QUICK.http_rounds
    for side in ("by_command", "celery_by_command"):
        breakdown = commands[side]
        assert isinstance(breakdown, dict) and breakdown
        assert all(isinstance(calls, float | int) and calls > 0 for calls in breakdown.values())
    # A turn's 5 calls against 5 plain tasks: the same ratio per turn as per call.
    per_turn = by_name["redis_commands_per_turn"]
    assert per_turn["calls_per_turn"] == 5
    assert per_turn["ratio"] == pytest.approx(commands["ratio"], rel=0.01)
    cpu = by_name["redis_cpu_ms_per_call"]
    assert cpu["goal"] == "ratio <= 1"
    assert isinstance(cpu["info_cpu_ms"], float | int) and cpu["info_cpu_ms"] > 0
    assert by_name["redis_cpu_ms_per_turn"]["ratio"] == pytest.approx(cpu["ratio"], rel=0.01)
    core = by_name["tool_calls_per_s_per_redis_core"]
    assert isinstance(cpu["value"], float | int)
    assert core["value"] == pytest.approx(1000 / cpu["value"], rel=0.01)
    assert core["goal"] == "ratio >= 1"
    memory = by_name["redis_memory_per_turn_kb"]
    assert memory["calls_per_turn"] == 5 and memory["tasks"] == QUICK.http_turns * 5
    assert isinstance(memory["raw_kb"], float | int)
    assert by_name["redis_used_memory_per_turn_kb"]["rounds"] == 40


def _check_first_token_figures(by_name: dict[str, dict[str, object]]) -> None:
    """A dozen turns at once per path, each timed from its first byte at the model server; goals reported."""
    for path in ("client", "sse"):
        for pct, goal in (("p50", "<= 10"), ("p99", "<= 50")):
            row = by_name[f"first_token_overhead_{path}_{pct}_ms"]
            assert row["goal"] == goal and isinstance(row["met"], bool)
            assert row["turns_at_once"] == 12
            assert row["samples"] == 12 * QUICK.first_token_batches
        cpu = by_name[f"streamed_delta_cpu_ms_{path}"]
        assert isinstance(cpu["separated"], bool)
        deltas = cpu["text_deltas_per_turn"]
        # A streamed answer of 600 characters written over about a second is several deltas, a plain one one.
        assert isinstance(deltas, float | int) and deltas > 1
        assert cpu["plain_text_deltas_per_turn"] == 1
    parts = by_name["streamed_delta_cpu_ms_sse"]["by_part_ms"]
    assert isinstance(parts, dict) and "api" in parts
