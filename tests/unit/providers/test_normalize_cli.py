"""`toolloop normalize` as a user runs it: its documented JSON, exit 4 for errors, exit 2 for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.unit.providers.conftest import load_expected

EXPECTED = load_expected()
TURN_KEYS = {"type", "text", "thinking", "tool_calls", "usage", "model", "finish_reason"}
ERROR_KEYS = {"provider", "status", "type", "code", "message", "request_id", "retryable"}
TOOLLOOP = Path(sys.executable).with_name("toolloop")


def run(*args: str, stdin: bytes | None = None) -> tuple[int, Any, str]:
    result = CliRunner().invoke(app, ["normalize", *args], input=stdin)
    output = json.loads(result.stdout) if result.stdout.strip() else None
    return result.exit_code, output, result.stderr


@pytest.mark.parametrize("name", [n for n, e in EXPECTED.items() if e.get("kind") != "error"])
def test_every_recorded_response(responses_dir: Path, name: str) -> None:
    expected = EXPECTED[name]
    code, out, _ = run(str(responses_dir / name))
    assert code == 0
    assert set(out) == TURN_KEYS
    assert (out["type"], out["text"] or "", out["model"]) == (
        expected["type"],
        expected["text"] or "",
        expected["model"],
    )
    assert [(c["name"], c["arguments"]) for c in out["tool_calls"]] == [
        (c["name"], c["args"]) for c in expected["tool_calls"]
    ]
    assert all(set(c) == {"id", "name", "arguments"} and c["id"] for c in out["tool_calls"])
    assert set(out["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}
    assert (out["usage"]["input_tokens"], out["usage"]["output_tokens"]) == (
        expected["usage"]["input_tokens"],
        expected["usage"]["output_tokens"],
    )


@pytest.mark.parametrize("name", [n for n, e in EXPECTED.items() if e.get("kind") == "error"])
def test_every_recorded_error_exits_4(responses_dir: Path, name: str) -> None:
    expected = EXPECTED[name]
    code, out, _ = run(
        str(responses_dir / name),
        "--provider",
        expected["provider"],
        "--status",
        str(expected["http_status"]),
    )
    assert code == 4
    extras = {"details"} if "failed_generation" in expected else set()
    assert set(out) == {"error"} and set(out["error"]) == ERROR_KEYS | extras
    assert (out["error"]["provider"], out["error"]["status"], out["error"]["retryable"]) == (
        expected["provider"],
        expected["http_status"],
        expected["retryable"],
    )
    assert out["error"]["message"] == expected["message"]


def test_error_body_without_status_is_still_exit_4(responses_dir: Path) -> None:
    code, out, _ = run(str(responses_dir / "anthropic__error_529_overloaded.json"))
    assert code == 4 and out["error"]["type"] == "overloaded_error" and out["error"]["retryable"] is True


def test_stdin_and_output_read_back_as_a_turn(responses_dir: Path) -> None:
    body = (responses_dir / "cohere_v2__tool_plan_and_null_arguments.json").read_bytes()
    code, first, _ = run("-", stdin=body)
    assert code == 0
    code, second, _ = run("-", stdin=json.dumps(first).encode())
    assert code == 0 and second == first


def test_broken_arguments_are_shown_with_the_reason(tmp_path: Path) -> None:
    body = {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{oops"}}]}
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(body))
    code, out, _ = run(str(path))
    assert code == 0 and out["type"] == "tool_calls"
    assert (
        out["tool_calls"][0]["raw_arguments"] == "{oops"
        and "not valid JSON" in out["tool_calls"][0]["arguments_error"]
    )


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["/nonexistent/response.json"], None, "no such file"),
        (["-"], b"this is not json", "not valid JSON"),
        (["-"], b"", "empty response body"),
        (["-", "--provider", "nonesuch"], b"{}", "unknown provider"),
        (["-"], b'{"hello": "world"}', "unrecognised response shape"),
    ],
)
def test_unreadable_input_is_one_line_and_exit_2(args: list[str], stdin: bytes | None, message: str) -> None:
    code, out, err = run(*args, stdin=stdin)
    assert code == 2 and out is None
    assert message in err and len(err.strip().splitlines()) == 1


def test_directory_is_exit_2(tmp_path: Path) -> None:
    code, _, err = run(str(tmp_path))
    assert code == 2 and "is a directory" in err


@pytest.mark.timeout(60)
def test_the_installed_command(responses_dir: Path) -> None:
    stream = responses_dir / "gemini__stream_function_call_then_empty_text.sse"
    done = subprocess.run(
        [str(TOOLLOOP), "normalize", "-"],
        input=stream.read_bytes(),
        capture_output=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["type"], out["model"], out["finish_reason"]) == ("tool_calls", "gemini-3-pro-preview", "stop")
    error = responses_dir / "openai__error_429_rate_limit_exceeded.json"
    done = subprocess.run(
        [str(TOOLLOOP), "normalize", str(error), "--provider", "openai", "--status", "429"],
        capture_output=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 4 and json.loads(done.stdout)["error"]["code"] == "rate_limit_exceeded"
