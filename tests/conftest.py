"""Session-wide fixtures: the shared test data beside the checkout, a real Redis, real workers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def find_shared_dir() -> Path:
    """`../shared` beside the checkout, as CI has it (TOOLLOOP_SHARED_DIR overrides)."""
    override = os.environ.get("TOOLLOOP_SHARED_DIR")
    candidate = Path(override) if override else ROOT.parent / "shared"
    if not (candidate / "provider_responses").is_dir():
        raise RuntimeError(f"shared test data not found at {candidate}: clone with ../shared beside it")
    return candidate


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return find_shared_dir()
