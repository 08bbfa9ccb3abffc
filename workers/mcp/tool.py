"""An MCP server's tool as a toolloop `Tool`: its spec, published as `<server>__<tool>`, and its call.

`McpTool` is registered like any `@tool` (the same registry, catalogue, Celery task and guardrails); only
`invoke` differs: it runs the call through the pool process's MCP session (`workers.mcp.sessions`). Specs
are built from the server's entry (limits, queue, flags) and, where the server listed the tool, its
description and sanitised schema (`workers.mcp.schema`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from workers.contract import ToolContext, ToolSpec
from workers.mcp.config import SEPARATOR, McpServer
from workers.mcp.schema import build_parameters
from workers.tools import Tool, is_sensitive_name

# What `@tool` accepts as a name: a full MCP tool name must be one too (`workers.tools._NAME`).
_TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class _AnyArguments(BaseModel):
    """The arguments model `Tool` keeps: an MCP tool's arguments are checked by its server's schema."""

    model_config = ConfigDict(extra="allow")


def call_remote(**arguments: Any) -> Any:
    """The function behind every MCP tool (one name, so that an updated listing replaces the tool)."""
    raise TypeError("an MCP tool runs through McpTool.invoke, in a pool process")


class McpTool(Tool[..., Any]):
    """The tool `remote` of MCP server `server`, called through the pool process's session."""

    def __init__(self, server: McpServer, remote: str, spec: ToolSpec) -> None:
        super().__init__(call_remote, spec, _AnyArguments, context_param=None, input_param=None)
        self.server = server
        self.remote = remote

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.invoke(kwargs)

    def invoke(self, arguments: Mapping[str, Any], ctx: ToolContext | None = None) -> Any:
        """Call the tool on its server; the result as `workers.mcp.results.build_result` maps it.

        Raises `McpToolError` for an `isError` answer, `TransientToolError` for a transport failure."""
        from workers.mcp.sessions import call_tool

        return call_tool(self.server, self.remote, dict(arguments))


def build_tool_name(server: McpServer, remote: str) -> str:
    """The published name of tool `remote` of `server`: `<server>__<remote>`."""
    return f"{server.name}{SEPARATOR}{remote}"


def split_tool_name(name: str) -> tuple[str, str] | None:
    """`<server>__<tool>` as (server, tool); None for a name that is not an MCP tool's."""
    server, separator, remote = name.partition(SEPARATOR)
    return (server, remote) if separator and server and remote else None


def build_spec(
    server: McpServer, remote: str, description: str = "", parameters: dict[str, Any] | None = None
) -> ToolSpec:
    """The spec of tool `remote` of `server`: the server's guardrails, the tool's description and schema."""
    name = build_tool_name(server, remote)
    soft, hard = server.limits_s
    return ToolSpec(
        name=name,
        description=description,
        parameters=parameters if parameters is not None else dict(_EMPTY_PARAMETERS),
        queue=server.queue_name,
        soft_time_limit_s=soft,
        time_limit_s=hard,
        retries=server.retries,
        retry_backoff_s=server.retry_backoff,
        retry_backoff_max_s=server.retry_backoff_max,
        max_args_bytes=server.max_args_bytes,
        max_result_bytes=server.max_result_bytes,
        idempotency="args" if remote in server.idempotent else None,
        sensitive=remote in server.sensitive or is_sensitive_name(name),
        requires_confirmation=remote in server.requires_confirmation,
    )


def build_tools(server: McpServer, listed: Iterable[Mapping[str, Any]]) -> tuple[list[McpTool], list[str]]:
    """The tools a server listed (`tools/list` entries, wire names), as it publishes them, and why any
    listed tool is left out (a name no provider accepts); `include` / `exclude` leave out silently."""
    tools: list[McpTool] = []
    skipped: list[str] = []
    for entry in listed:
        remote = entry.get("name")
        if not isinstance(remote, str) or not server.serves(remote):
            continue
        name = build_tool_name(server, remote)
        if not _TOOL_NAME.match(name):
            skipped.append(f"{name!r} is not a name models accept (letters, digits, _ . -, 64 at most)")
            continue
        description = entry.get("description") or entry.get("title") or ""
        spec = build_spec(server, remote, str(description), build_parameters(entry.get("inputSchema")))
        tools.append(McpTool(server, remote, spec))
    return tools, skipped
