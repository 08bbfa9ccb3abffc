"""A tool module whose MCP server entry is bad: the worker must stop at start, naming it."""

from __future__ import annotations

from workers import mcp_server

mcp_server(name="a__b", url="http://127.0.0.1:1/mcp")
