"""`ProviderError.details`: provider extras worth keeping (Groq's `failed_generation`), shown by normalize."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.model import ProviderError
from orchestrator.providers.body import build_error
from orchestrator.providers.detect import from_response
from tests.unit.providers.conftest import load_expected

pytestmark = pytest.mark.timeout(30)

EXPECTED = load_expected()
GROQ_ERROR = "groq__error_400_tool_use_failed.json"
ERRORS = [name for name, entry in EXPECTED.items() if entry.get("kind") == "error"]


def normalize_error(path: Path, provider: str, status: int) -> ProviderError:
    error = from_response(path.read_bytes(), provider=provider, status=status)
    assert isinstance(error, ProviderError), error
    return error


def test_groq_keeps_the_generation_it_could_not_parse(responses_dir: Path) -> None:
    expected = EXPECTED[GROQ_ERROR]
    error = normalize_error(responses_dir / GROQ_ERROR, "groq", 400)
    assert error.details == {"failed_generation": expected["failed_generation"]}
    assert (error.code, error.message) == ("tool_use_failed", expected["message"])  # nothing else moved
    # Found by the body alone too, with no provider named.
    detected = from_response((responses_dir / GROQ_ERROR).read_bytes(), status=400)
    assert isinstance(detected, ProviderError) and detected.details == error.details


@pytest.mark.parametrize("name", [n for n in ERRORS if "failed_generation" not in EXPECTED[n]])
def test_errors_without_extras_have_no_details(responses_dir: Path, name: str) -> None:
    expected = EXPECTED[name]
    error = normalize_error(responses_dir / name, expected["provider"], expected["http_status"])
    assert error.details is None


def test_details_are_bounded_and_only_strings_are_kept() -> None:
    huge = build_error("groq", 400, {"error": {"message": "m", "failed_generation": "x" * 100_000}})
    assert huge.details is not None and 0 < len(huge.details["failed_generation"]) <= 16_000
    for odd in (None, "", 42, {"nested": "object"}, ["a"]):
        error = build_error("groq", 400, {"error": {"message": "m", "failed_generation": odd}})
        assert error.details is None, odd
    # The error survives the round trip a turn's stored outcome makes.
    assert ProviderError.model_validate_json(huge.model_dump_json()) == huge


def run_normalize(path: Path, provider: str, status: int) -> tuple[int, dict[str, object]]:
    arguments = ["normalize", str(path), "--provider", provider, "--status", str(status)]
    result = CliRunner().invoke(app, arguments)
    output: dict[str, object] = json.loads(result.stdout)
    return result.exit_code, output


def test_normalize_shows_details_only_when_present(responses_dir: Path) -> None:
    code, groq = run_normalize(responses_dir / GROQ_ERROR, "groq", 400)
    assert code == 4
    assert groq["error"] == {
        "provider": "groq",
        "status": 400,
        "type": "invalid_request_error",
        "code": "tool_use_failed",
        "message": EXPECTED[GROQ_ERROR]["message"],
        "request_id": None,
        "retryable": False,
        "details": {"failed_generation": EXPECTED[GROQ_ERROR]["failed_generation"]},
    }
    code, openai = run_normalize(responses_dir / "openai__error_429_rate_limit_exceeded.json", "openai", 429)
    assert code == 4 and isinstance(openai["error"], dict) and "details" not in openai["error"]
