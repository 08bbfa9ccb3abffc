"""Every recorded provider body normalises to its expected.json entry, by these rules:

null text equals ""; ids that are null in the expectation must be synthesised, non-empty and unique; thinking
is compared with whitespace runs collapsed (the separator between summary parts is a convention).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.model import ProviderError, Turn
from orchestrator.providers.common import IdSource
from orchestrator.providers.detect import from_response
from tests.unit.providers.conftest import load_expected, recorded_files

EXPECTED = load_expected()
RESPONSES = [e for e in EXPECTED.values() if e.get("kind") != "error"]
ERRORS = [e for e in EXPECTED.values() if e.get("kind") == "error"]


def _words(value: str | None) -> list[str]:
    return (value or "").split()


def check_turn(turn: Turn | ProviderError, expected: dict[str, Any]) -> None:
    assert isinstance(turn, Turn), turn
    assert turn.type == expected["type"]
    assert (turn.text or "") == (expected["text"] or "")
    assert _words(turn.thinking) == _words(expected["thinking"])
    assert turn.thinking is None or turn.thinking.strip(), "blank thinking must be None"
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [
        (c["name"], c["args"]) for c in expected["tool_calls"]
    ]
    for call, want in zip(turn.tool_calls, expected["tool_calls"], strict=True):
        assert call.id.strip()
        if want["id"] is not None:
            assert call.id == want["id"]
        assert call.arguments_error is None
    assert len({c.id for c in turn.tool_calls}) == len(turn.tool_calls)
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (
        expected["usage"]["input_tokens"],
        expected["usage"]["output_tokens"],
    )
    assert turn.usage.total_tokens >= turn.usage.input_tokens + turn.usage.output_tokens
    assert turn.model == expected["model"]


def check_error(error: Turn | ProviderError, expected: dict[str, Any]) -> None:
    assert isinstance(error, ProviderError), error
    assert error.status == expected["http_status"]
    assert error.type == expected["error_type"]
    assert error.code == expected["error_code"]
    assert error.message == expected["message"]
    assert error.request_id == expected["request_id"]
    assert error.retryable is expected["retryable"]


def test_every_recorded_file_has_an_expectation() -> None:
    assert {p.name for p in recorded_files()} == set(EXPECTED)


@pytest.mark.parametrize("expected", RESPONSES, ids=lambda e: e["file"])
def test_response_with_provider_named(responses_dir: Path, expected: dict[str, Any]) -> None:
    body = (responses_dir / expected["file"]).read_bytes()
    check_turn(from_response(body, provider=expected["provider"]), expected)


@pytest.mark.parametrize("expected", RESPONSES, ids=lambda e: e["file"])
def test_response_with_shape_detected(responses_dir: Path, expected: dict[str, Any]) -> None:
    body = (responses_dir / expected["file"]).read_bytes()
    check_turn(from_response(body), expected)


@pytest.mark.parametrize("expected", RESPONSES, ids=lambda e: e["file"])
def test_response_as_text_and_as_decoded_body_agree(responses_dir: Path, expected: dict[str, Any]) -> None:
    path = responses_dir / expected["file"]
    if path.suffix == ".sse":
        # CRLF must survive being read as text: open without newline translation.
        with path.open(encoding="utf-8", newline="") as handle:
            check_turn(from_response(handle.read(), provider=expected["provider"]), expected)
        return
    body = json.loads(path.read_text("utf-8"))
    check_turn(from_response(body, provider=expected["provider"]), expected)


@pytest.mark.parametrize("expected", RESPONSES, ids=lambda e: e["file"])
def test_synthetic_ids_unique_across_a_turn(responses_dir: Path, expected: dict[str, Any]) -> None:
    body = (responses_dir / expected["file"]).read_bytes()
    ids = IdSource()
    first = from_response(body, provider=expected["provider"], ids=ids)
    second = from_response(body, provider=expected["provider"], ids=ids)
    assert isinstance(first, Turn) and isinstance(second, Turn)
    all_ids = [c.id for c in first.tool_calls + second.tool_calls]
    assert len(set(all_ids)) == len(all_ids)


@pytest.mark.parametrize("expected", ERRORS, ids=lambda e: e["file"])
def test_error_body_with_status(responses_dir: Path, expected: dict[str, Any]) -> None:
    body = (responses_dir / expected["file"]).read_bytes()
    error = from_response(body, provider=expected["provider"], status=expected["http_status"])
    check_error(error, expected)
    assert isinstance(error, ProviderError)
    assert error.provider == expected["provider"]


@pytest.mark.parametrize("expected", ERRORS, ids=lambda e: e["file"])
def test_error_body_without_status_is_still_an_error(responses_dir: Path, expected: dict[str, Any]) -> None:
    body = (responses_dir / expected["file"]).read_bytes()
    error = from_response(body)
    assert isinstance(error, ProviderError)
    assert error.status is None
    assert error.message == expected["message"]
    assert error.type == expected["error_type"]
    # Without a status, retryable comes from the error's type and code: the same answer here.
    assert error.retryable is expected["retryable"]
