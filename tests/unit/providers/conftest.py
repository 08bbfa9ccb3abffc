"""Provider test fixtures: the recorded bodies in ../shared/provider_responses and their expectations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import find_shared_dir

RESPONSES_DIR = find_shared_dir() / "provider_responses"


def load_expected() -> dict[str, dict[str, Any]]:
    """expected.json: file name → what a normaliser should make of that file."""
    data: dict[str, dict[str, Any]] = json.loads((RESPONSES_DIR / "expected.json").read_text("utf-8"))
    return data


def recorded_files() -> list[Path]:
    """Every recorded body (.json and .sse) except expected.json."""
    return sorted(
        p for p in RESPONSES_DIR.iterdir() if p.suffix in (".json", ".sse") and p.name != "expected.json"
    )


@pytest.fixture(scope="session")
def responses_dir(shared_dir: Path) -> Path:
    return shared_dir / "provider_responses"
