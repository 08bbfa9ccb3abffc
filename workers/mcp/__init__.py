"""The tools of MCP servers, served as tool tasks (issue 18).

`mcp_server(...)` (also `from workers import mcp_server`) adds a server from a tool module;
`TOOLLOOP_MCP_SERVERS` adds them from the environment (`workers.mcp.config`). The worker lists their tools
and keeps the listings current (`serving`, `watcher`), each tool a `Tool` like an `@tool`'s (`tool`, its
parameters from the server's schema: `schema`), each call run on the pool process's session (`sessions`)
and its answer mapped onto the outcome (`results`). This package imports the `mcp` SDK only where a
session is opened.
"""

from workers.mcp.config import McpServer, mcp_server

__all__ = ["McpServer", "mcp_server"]
