"""toolloop's tool runtime: a leaf package that imports nothing from `orchestrator`.

`from workers import tool` is all a tool module needs; `ToolContext` and `TransientToolError` are the two
other names a tool may use. `mcp_server(...)` serves the tools of an MCP server from the same worker, and
`agent(...)` declares a named agent beside the tools (`workers.agents`).
"""

from workers.agents import AgentSpec, agent
from workers.mcp.config import mcp_server
from workers.tools import ToolContext, ToolDefinitionError, TransientToolError, registry, tool

__all__ = [
    "AgentSpec",
    "ToolContext",
    "ToolDefinitionError",
    "TransientToolError",
    "agent",
    "mcp_server",
    "registry",
    "tool",
]
