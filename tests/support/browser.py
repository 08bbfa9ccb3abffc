"""A real, headless Chromium for page tests: Debian's /usr/bin/chromium driven by Playwright.

Playwright's own browser download cannot run on our machines, so the system Chromium is launched by path
(`make setup-browser` installs it). A missing browser or Playwright fails the test with the command that
fixes it: a page test is never skipped silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext

CHROMIUM = Path("/usr/bin/chromium")
MISSING_CHROMIUM = (
    f"{CHROMIUM} is missing: run `make setup-browser` (as root: apt-get install -y chromium), "
    "then run the tests again"
)
MISSING_PLAYWRIGHT = "playwright is not installed: run `make setup` (it is in the test extras)"
# No sandbox (we run as root), no GPU, and nothing that reaches out to the network on its own.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


@contextmanager
def open_chromium(
    user_data_dir: Path, *, basic_auth: tuple[str, str] | None = None
) -> Iterator[BrowserContext]:
    """A fresh browser context (a new profile in `user_data_dir`), closed on exit; fails the test when
    Chromium or Playwright is missing."""
    if not CHROMIUM.exists():
        pytest.fail(MISSING_CHROMIUM)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(MISSING_PLAYWRIGHT)
    credentials = {"username": basic_auth[0], "password": basic_auth[1]} if basic_auth else None
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(user_data_dir),
            executable_path=str(CHROMIUM),
            headless=True,
            args=list(CHROMIUM_ARGS),
            http_credentials=credentials,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()
