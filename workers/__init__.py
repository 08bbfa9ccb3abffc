"""toolloop's tool runtime: a leaf package that imports nothing from `orchestrator`.

`from workers import tool` is all a tool module needs; `ToolContext` and `TransientToolError` are the two
other names a tool may use.
"""

from workers.tools import ToolContext, ToolDefinitionError, TransientToolError, registry, tool

__all__ = ["ToolContext", "ToolDefinitionError", "TransientToolError", "registry", "tool"]
