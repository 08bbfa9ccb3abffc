"""A tool module serving an MCP server beside an `@tool`, through the Python API (`mcp_server`).

The server is the test server over stdio (`tests/support/mcp_server.py`); `MCP_TEST_MARK_DIR` in the
worker's environment is handed on to it (where `hang` says which process started it).
"""

from __future__ import annotations

import os

from tests.support.mcp_support import SERVER_COMMAND
from workers import mcp_server, tool

mcp_server(
    name="py",
    command=SERVER_COMMAND,
    env={"MCP_TEST_MARK_DIR": os.environ.get("MCP_TEST_MARK_DIR", "")},
    include=["echo", "hang", "crash"],
    # A call after a killed pool process opens a new session (starts the server) inside its own time: on a
    # loaded machine that alone can take seconds.
    soft_time_limit=10,
    time_limit=12,
    idempotent=["echo"],
    retries=1,
    retry_backoff=0.1,
    retry_backoff_max=0.1,
    max_result_bytes=64,
)


@tool
def local_double(x: int) -> int:
    """Double a number (an @tool beside the MCP server's tools)."""
    return 2 * x
