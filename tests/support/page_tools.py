"""The page tool of the long-conversation end-to-end test, served by a real prefork worker
(`TOOLLOOP_TOOL_MODULES=tests.support.page_tools`)."""

from __future__ import annotations

from workers import tool

PAGE_BYTES = 8_000


def build_page(url: str) -> str:
    """A page of about `PAGE_BYTES` of text that names its URL, the same for the same URL."""
    line = f"{url}: a paragraph of the page, long enough to weigh on the model's context window.\n"
    return (line * (PAGE_BYTES // len(line) + 1))[:PAGE_BYTES]


@tool(soft_time_limit=10, time_limit=20)
def fetch_page(url: str) -> str:
    """Fetch a web page and return its text."""
    return build_page(url)
