"""`toolloop demo` as a user runs it: completes a real turn and leaves no process behind, even on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

TOOLLOOP_BIN = Path(sys.executable).parent / "toolloop"
ROOT = Path(__file__).resolve().parents[2]
# Anything that would point the demo at another Redis or a real model.
_OVERRIDES = (
    "TOOLLOOP_REDIS_URL",
    "TOOLLOOP_MODEL",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
)


def demo_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _OVERRIDES and not k.startswith("TOOLLOOP_")}
    # A wide console keeps each printed line whole, so the test can read pids and names from it.
    return {**env, "COLUMNS": "250", "TERM": "dumb"}


def running_processes_matching(tokens: list[str]) -> list[str]:
    """Command lines of live (non-zombie) processes that mention any token."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and any(token in cmdline for token in tokens):
            found.append(f"{proc.name}: {cmdline}")
    return found


def started_by_demo(output: str) -> tuple[list[int], list[str]]:
    """The pids the demo reported and tokens (worker name, Redis port) that identify its processes."""
    # Each once: a line the demo printed just before an interrupt may reach the pipe twice.
    pids = list(dict.fromkeys(int(p) for p in re.findall(r"pid (\d+)", output)))
    tokens = re.findall(r"demo-[0-9a-f]{8}@localhost", output)
    tokens += [f"--port {port} " for port in re.findall(r"redis://127\.0\.0\.1:(\d+)/0", output)]
    return pids, tokens


def assert_nothing_left(output: str) -> None:
    pids, tokens = started_by_demo(output)
    assert len(pids) >= 3, output  # redis, worker, orchestrator (and the API, once it started)
    assert len(tokens) >= 2, output
    alive = [pid for pid in pids if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
    assert not alive, f"left running: {alive}"
    assert not running_processes_matching(tokens)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_demo_completes_a_turn_and_leaves_no_process_behind() -> None:
    result = subprocess.run(
        [str(TOOLLOOP_BIN), "demo"],
        capture_output=True,
        text=True,
        env=demo_env(),
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert '"status": "completed"' in output
    for expected in ("13.0", "42.0", "get_weather", "Where to look next", "toolloop show turn_"):
        assert expected in output, output
    assert_nothing_left(output)


def test_demo_interrupted_with_ctrl_c_stops_everything_it_started() -> None:
    process = subprocess.Popen(
        [str(TOOLLOOP_BIN), "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=demo_env(),
        cwd=ROOT,
        start_new_session=True,
    )
    assert process.stdout is not None
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if "orchestrator (pid" in line:
                # The worker and the orchestrator are starting: interrupt the demo as Ctrl-C would.
                os.kill(process.pid, signal.SIGINT)
                break
        rest, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    output = "".join(lines) + rest
    assert process.returncode == 130, output
    assert "interrupted" in output
    assert_nothing_left(output)
