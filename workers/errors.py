"""The tool side of toolloop's one error tree (drawn whole in `orchestrator.errors`).

The root lives here because `workers` is the leaf package: tool modules and workers import it without
importing the orchestrator, and the orchestrator's errors derive from the same root.

    ToolloopError(Exception)
    ├── ToolDefinitionError(ValueError)   a bad tool definition, raised when the tool module is imported
    │   └── McpConfigError                a bad MCP server entry (TOOLLOOP_MCP_SERVERS, `mcp_server(...)`)
    ├── ToolModuleError(ImportError)      a tool module a worker was told to serve did not import
    ├── TransientToolError                raised BY a tool for a failure another attempt may fix (retried)
    ├── InvalidResultError(ValueError)    a tool returned something JSON cannot carry (→ `invalid_result`)
    ├── McpToolError                      an MCP server answered a call with an error (→ `execution_error`)
    ├── ToolCallFailed                    raised by the tool TASK after a failure outcome (Flower: FAILURE)
    ├── ToolCallRetried                   why the tool task is retried (the exception Flower shows with RETRY)
    └── RedisConfigError(ValueError)      a Redis URL that names no Redis (a Sentinel URL without its master)
"""

from __future__ import annotations

__all__ = [
    "InvalidResultError",
    "McpConfigError",
    "McpToolError",
    "RedisConfigError",
    "ToolCallFailed",
    "ToolCallRetried",
    "ToolDefinitionError",
    "ToolModuleError",
    "ToolloopError",
    "TransientToolError",
]


class ToolloopError(Exception):
    """The root of every error toolloop raises on purpose; anything else escaping is a bug."""


class ToolDefinitionError(ToolloopError, ValueError):
    """A tool definition that cannot be served: bad guardrail values, bad name, duplicate name."""


class ToolModuleError(ToolloopError, ImportError):
    """A module of `TOOLLOOP_TOOL_MODULES` that could not be imported, or defines a bad tool.

    The message names the module and the cause in a line or two (`toolloop worker` prints it as is);
    `name` is the module, `__cause__` the original error.
    """

    def __init__(self, module: str, message: str) -> None:
        super().__init__(message, name=module)
        self.module = module


class McpConfigError(ToolDefinitionError):
    """An MCP server entry a worker cannot serve (`workers.mcp.config`): one line naming the entry and why.

    Raised when `mcp_server(...)` is called with it, or when the worker starts with it in
    `TOOLLOOP_MCP_SERVERS`: the worker stops before serving anything."""


class McpToolError(ToolloopError):
    """An MCP server answered a tool call with `isError: true` (the message is the text it gave), or with an
    MCP error response (an unknown tool, invalid parameters: the message names the server and the error).

    Raised in the pool process by an MCP tool's `invoke`, it ends the call as `execution_error`, never
    retried: the server had the call and said it failed."""


class TransientToolError(ToolloopError):
    """Raise it from a tool for a failure another attempt may fix; the call is retried with backoff."""


class InvalidResultError(ToolloopError, ValueError):
    """A tool returned something that is not JSON-serialisable (becomes an `invalid_result` outcome)."""


class ToolCallFailed(ToolloopError):
    """Raised by the tool task once the call's failure outcome is written, so that Flower shows FAILURE.

    `str(exc)` is "<failure kind>: <message>". The outcome in Redis stays the record; this only tells Celery
    (and so Flower) how the task ended. It is in the task's `throws`: Celery logs it in one line, and nothing
    retries it or answers the call again.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message

    def __reduce__(self) -> tuple[type[ToolCallFailed], tuple[str, str]]:
        # The pool child hands it to the worker's parent pickled: rebuild it from both parts, not from args.
        return (type(self), (self.kind, self.message))


class ToolCallRetried(ToolloopError):
    """Why a tool task is retried: a transient failure, a duplicate delivery, Redis unavailable.

    Carried by Celery's `Retry` into the `task-retried` event, it is the exception Flower shows with RETRY.
    """


class RedisConfigError(ToolloopError, ValueError):
    """A Redis URL that cannot be connected as configured: a `sentinel://` URL without
    `TOOLLOOP_REDIS_MASTER_NAME`, or whose parts disagree. Raised at startup, before anything runs."""
