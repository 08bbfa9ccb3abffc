"""The lister of a worker's MCP servers (`workers.mcp.watcher`) against the real test server over stdio: a
2026 server (changes on a `subscriptions/listen` stream) and a handshake-era one (changes as
`notifications/tools/list_changed`), a server that is down, then up."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.mcp_support import SERVER_COMMAND
from workers.mcp.config import McpServer
from workers.mcp.watcher import Reports, watch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def reports_until(out: io.StringIO, done: Any, timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """The reports written so far, once `done(reports)` holds."""
    for _ in range(int(timeout_s / 0.05)):
        reports = [json.loads(line) for line in out.getvalue().splitlines()]
        if done(reports):
            return reports
        await asyncio.sleep(0.05)
    raise AssertionError(f"no such reports in {timeout_s} s: {out.getvalue()}")


def listed(report: dict[str, Any]) -> list[str]:
    return sorted(tool["name"] for tool in report.get("tools", []))


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.wait([task], timeout=10)


@pytest.mark.parametrize("era", ["2026", "handshake"])
async def test_a_listing_then_one_per_change(tmp_path: Path, era: str) -> None:
    extra = tmp_path / "extra.txt"
    env = {"MCP_TEST_EXTRA_FILE": str(extra)} | ({"MCP_TEST_LEGACY": "1"} if era == "handshake" else {})
    out = io.StringIO()
    task = asyncio.create_task(watch(McpServer(name="t", command=SERVER_COMMAND, env=env), Reports(out)))
    try:
        (first,) = await reports_until(out, lambda reports: reports)
        assert first["server"] == "t" and "echo" in listed(first) and "extra_one" not in listed(first)
        book = next(tool for tool in first["tools"] if tool["name"] == "book")
        assert "$defs" in book["inputSchema"]  # as the server wrote it: sanitised by the worker, not here
        extra.write_text("one\n")
        reports = await reports_until(out, lambda reports: len(reports) >= 2)
        assert "extra_one" in listed(reports[1]) and "error" not in reports[1]
    finally:
        await stop(task)


async def test_a_server_down_is_reported_and_tried_again_until_up(tmp_path: Path) -> None:
    flag = tmp_path / "up"
    server = McpServer(name="late", command=SERVER_COMMAND, env={"MCP_TEST_REQUIRE_FILE": str(flag)})
    out = io.StringIO()
    task = asyncio.create_task(watch(server, Reports(out)))
    try:
        (down,) = await reports_until(out, lambda reports: reports)
        assert down["server"] == "late" and "tools" not in down and down["error"]
        flag.touch()
        reports = await reports_until(out, lambda reports: "tools" in reports[-1])
        assert "echo" in listed(reports[-1]) and all("error" in report for report in reports[:-1])
    finally:
        await stop(task)
