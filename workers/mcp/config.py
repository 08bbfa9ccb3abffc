"""MCP servers a worker serves the tools of: `TOOLLOOP_MCP_SERVERS`, or `mcp_server(...)` in a tool module.

An entry is a stdio server (`command`, an argv list, and `env`) or a streamable HTTP one (`url` and
`headers`), with guardrails for all of its tools: time limits, a queue, retries of transport failures, size
caps, and lists of its tool names (`include`, `exclude`, `sensitive`, `requires_confirmation`,
`idempotent`). Its tools are published as `<name>__<tool>`.

A bad entry is a `McpConfigError` whose message is one line naming the entry: raised by `mcp_server(...)`
when a tool module calls it, and when a worker starts with `TOOLLOOP_MCP_SERVERS`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from workers.errors import McpConfigError

# Server names: a tool name is `<server>__<tool>`, split at the first `__`, so a server name holds no `__`
# and does not end with `_`; short, so that the full names stay within the 64 characters providers allow.
_SERVER_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,31}$")
SEPARATOR = "__"
QUEUE_PREFIX = "mcp."
ENV_NAME = "TOOLLOOP_MCP_SERVERS"


class McpServer(BaseModel):
    """One MCP server and the guardrails of its tools (time limits in seconds, sizes in bytes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    command: list[str] | None = None
    env: dict[str, str] | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    soft_time_limit: float | None = Field(default=None, gt=0)
    time_limit: float | None = Field(default=None, gt=0)
    queue: str | None = None
    include: list[str] | None = None
    exclude: list[str] = Field(default_factory=list)
    sensitive: list[str] = Field(default_factory=list)
    requires_confirmation: list[str] = Field(default_factory=list)
    idempotent: list[str] = Field(default_factory=list)
    retries: int = Field(default=0, ge=0)
    retry_backoff: float = Field(default=1.0, gt=0)
    retry_backoff_max: float = Field(default=30.0, gt=0)
    max_args_bytes: int = Field(default=64 * 1024, gt=0)
    max_result_bytes: int = Field(default=64 * 1024, gt=0)

    @model_validator(mode="after")
    def _check(self) -> McpServer:
        problem = find_problem(self)
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def transport(self) -> str:
        """`stdio` (a command) or `http` (a streamable HTTP URL)."""
        return "stdio" if self.command is not None else "http"

    @property
    def queue_name(self) -> str:
        """The Celery queue of its calls: `queue`, else its own, `mcp.<name>`."""
        return self.queue or f"{QUEUE_PREFIX}{self.name}"

    @property
    def limits_s(self) -> tuple[float, float]:
        """(soft, hard) limits as `@tool` resolves them: one given, the other follows; none, 30 / 60."""
        soft, hard = self.soft_time_limit, self.time_limit
        if soft is None and hard is None:
            return 30.0, 60.0
        if soft is None:
            assert hard is not None
            return hard / 2, hard
        return (soft, hard) if hard is not None else (soft, soft * 2)

    def serves(self, tool: str) -> bool:
        """Whether its tool `tool` (the server's own name for it) is published: `include`, then `exclude`."""
        return (self.include is None or tool in self.include) and tool not in self.exclude

    def describe(self) -> str:
        """Where it is, for log lines: the command, or the URL without its query."""
        if self.command is not None:
            return " ".join(self.command)
        return (self.url or "").split("?", 1)[0]


def find_problem(server: McpServer) -> str | None:
    """What is wrong with an entry pydantic accepted (its fields' types), or None."""
    name = server.name
    if not _SERVER_NAME.match(name) or SEPARATOR in name or name.endswith("_"):
        return (
            f"name {name!r} is not valid: a letter, then letters, digits, '_' or '-' (no '__', not ending "
            "with '_'), at most 32 characters"
        )
    if (server.command is None) == (server.url is None):
        return 'give either "command" (a stdio server) or "url" (a streamable HTTP server), not both'
    if server.command is not None and (not server.command or not all(part for part in server.command)):
        return '"command" must be a non-empty list of non-empty strings (the argv of the server)'
    if server.url is not None and not server.url.startswith(("http://", "https://")):
        return f'"url" must be an http:// or https:// URL, not {server.url!r}'
    if server.env is not None and server.command is None:
        return '"env" is for a stdio server (one with "command")'
    if server.headers is not None and server.url is None:
        return '"headers" is for a streamable HTTP server (one with "url")'
    soft, hard = server.soft_time_limit, server.time_limit
    if soft is not None and hard is not None and soft >= hard:
        return f"soft_time_limit ({soft:g} s) must be less than time_limit ({hard:g} s)"
    if server.retry_backoff_max < server.retry_backoff:
        return "retry_backoff must be at most retry_backoff_max"
    if server.queue is not None and not server.queue.strip():
        return '"queue" must be a non-empty name'
    return None


def build_server(entry: object, where: str) -> McpServer:
    """An entry (a JSON object, or `mcp_server`'s keywords) as an `McpServer`; `McpConfigError` otherwise."""
    label = where
    if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
        label = f"{where} ({entry['name']!r})"
    if not isinstance(entry, Mapping):
        raise McpConfigError(f"{label}: an MCP server must be a JSON object, not {type(entry).__name__}")
    try:
        return McpServer.model_validate(dict(entry))
    except ValidationError as exc:
        raise McpConfigError(f"{label}: {describe_errors(exc)}") from None


def describe_errors(exc: ValidationError) -> str:
    """pydantic's errors of an entry as one line: `"command": Input should be a valid list; …`."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown setting"
        parts.append(f'"{where}": {message}' if where else message)
    return "; ".join(parts)


def parse_servers(text: str | None) -> list[McpServer]:
    """The servers of `TOOLLOOP_MCP_SERVERS` (a JSON list of objects); empty or unset: none."""
    if text is None or not text.strip():
        return []
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as exc:
        raise McpConfigError(f"{ENV_NAME} is not valid JSON: {exc}") from None
    if not isinstance(entries, list):
        raise McpConfigError(f"{ENV_NAME} must be a JSON list of servers, not {type(entries).__name__}")
    return [build_server(entry, f"{ENV_NAME}[{index}]") for index, entry in enumerate(entries)]


# Servers registered from Python by the tool modules a worker imports (`mcp_server`), by name.
_registered: dict[str, McpServer] = {}


def mcp_server(
    name: str,
    *,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
    url: str | None = None,
    headers: dict[str, str] | None = None,
    soft_time_limit: float | None = None,
    time_limit: float | None = None,
    queue: str | None = None,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    sensitive: list[str] | None = None,
    requires_confirmation: list[str] | None = None,
    idempotent: list[str] | None = None,
    retries: int = 0,
    retry_backoff: float = 1.0,
    retry_backoff_max: float = 30.0,
    max_args_bytes: int = 64 * 1024,
    max_result_bytes: int = 64 * 1024,
) -> McpServer:
    """Serve the tools of an MCP server from the worker that imports this module (beside its `@tool`s).

    The same settings as an entry of `TOOLLOOP_MCP_SERVERS`; its tools are published as `<name>__<tool>`.
    Raises `McpConfigError` (a `ToolDefinitionError`) for a bad entry, or a second server of that name.
    """
    given: dict[str, Any] = {
        "name": name,
        "command": command,
        "env": env,
        "url": url,
        "headers": headers,
        "soft_time_limit": soft_time_limit,
        "time_limit": time_limit,
        "queue": queue,
        "include": include,
        "exclude": exclude or [],
        "sensitive": sensitive or [],
        "requires_confirmation": requires_confirmation or [],
        "idempotent": idempotent or [],
        "retries": retries,
        "retry_backoff": retry_backoff,
        "retry_backoff_max": retry_backoff_max,
        "max_args_bytes": max_args_bytes,
        "max_result_bytes": max_result_bytes,
    }
    server = build_server(given, "mcp_server")
    existing = _registered.get(server.name)
    if existing is not None and existing != server:  # the same call again (a module reloaded) is fine
        raise McpConfigError(f"mcp_server ({server.name!r}): a server of that name is already registered")
    _registered[server.name] = server
    return server


def registered_servers() -> list[McpServer]:
    """The servers `mcp_server(...)` registered in this process."""
    return list(_registered.values())


def merge_servers(configured: Iterable[McpServer], registered: Iterable[McpServer]) -> list[McpServer]:
    """Every server a worker serves, each name once; `McpConfigError` when two differ under one name."""
    merged: dict[str, McpServer] = {}
    for server in [*configured, *registered]:
        existing = merged.get(server.name)
        if existing is not None and existing != server:
            raise McpConfigError(
                f"MCP server {server.name!r} is defined twice ({ENV_NAME} and mcp_server, or twice in one)"
            )
        merged[server.name] = server
    return list(merged.values())
