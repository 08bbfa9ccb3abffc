"""The tool side of toolloop's one error tree (drawn whole in `orchestrator.errors`).

The root lives here because `workers` is the leaf package: tool modules and workers import it without
importing the orchestrator, and the orchestrator's errors derive from the same root.

    ToolloopError(Exception)
    ├── ToolDefinitionError(ValueError)   a bad tool definition, raised when the tool module is imported
    ├── TransientToolError                raised BY a tool for a failure another attempt may fix (retried)
    └── InvalidResultError(ValueError)    a tool returned something JSON cannot carry (→ `invalid_result`)
"""

from __future__ import annotations

__all__ = ["InvalidResultError", "ToolDefinitionError", "ToolloopError", "TransientToolError"]


class ToolloopError(Exception):
    """The root of every error toolloop raises on purpose; anything else escaping is a bug."""


class ToolDefinitionError(ToolloopError, ValueError):
    """A tool definition that cannot be served: bad guardrail values, bad name, duplicate name."""


class TransientToolError(ToolloopError):
    """Raise it from a tool for a failure another attempt may fix; the call is retried with backoff."""


class InvalidResultError(ToolloopError, ValueError):
    """A tool returned something that is not JSON-serialisable (becomes an `invalid_result` outcome)."""
