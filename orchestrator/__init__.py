"""toolloop's orchestrator: owns each turn's loop; never imports tool code.

`from orchestrator import Client` (or `AsyncClient`) is what a web app needs; they are loaded on first use so
that importing the package stays cheap for workers and the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.client.redis_client import (
        AsyncClient,
        CallNotWaitingError,
        Client,
        ModelSettings,
        ModelStreamResetEvent,
        OtherEvent,
        StreamEvent,
        TextDeltaEvent,
        ThinkingDeltaEvent,
        ToolCallStartedEvent,
        ToolFinishedEvent,
        ToolProgressEvent,
        ToolStartedEvent,
        TurnFinishedEvent,
        TurnOutcome,
        UnknownTurnError,
    )

__all__ = [
    "AsyncClient",
    "CallNotWaitingError",
    "Client",
    "ModelSettings",
    "ModelStreamResetEvent",
    "OtherEvent",
    "StreamEvent",
    "TextDeltaEvent",
    "ThinkingDeltaEvent",
    "ToolCallStartedEvent",
    "ToolFinishedEvent",
    "ToolProgressEvent",
    "ToolStartedEvent",
    "TurnFinishedEvent",
    "TurnOutcome",
    "UnknownTurnError",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from orchestrator.client import redis_client as client

        return getattr(client, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
