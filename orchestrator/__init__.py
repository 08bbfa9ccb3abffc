"""toolloop's orchestrator: owns each turn's loop; never imports tool code.

`from orchestrator import Client` (or `AsyncClient`) is what a web app next to Redis needs, `HttpClient` (or
`AsyncHttpClient`) one that reaches toolloop by its HTTP API, with the errors only it raises
(`ApiUnavailableError`, `ApiAuthError`); they are loaded on first use so that importing the package stays
cheap for workers and the CLI. `new_turn_id` makes a turn id to submit with (a retried submit with it is a
no-op), for a turn of a conversation one that a Redis Cluster accepts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.client.http_client import ApiAuthError, ApiUnavailableError, AsyncHttpClient, HttpClient
    from orchestrator.client.redis_client import (
        AsyncClient,
        CallNotWaitingError,
        CallWaitingEvent,
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
    from orchestrator.store.codec import new_turn_id

# The HTTP clients' names, loaded from their own module.
_HTTP_NAMES = frozenset({"ApiAuthError", "ApiUnavailableError", "AsyncHttpClient", "HttpClient"})
__all__ = [
    "ApiAuthError",
    "ApiUnavailableError",
    "AsyncClient",
    "AsyncHttpClient",
    "CallNotWaitingError",
    "CallWaitingEvent",
    "Client",
    "HttpClient",
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
    "new_turn_id",
]


def __getattr__(name: str) -> Any:
    if name == "new_turn_id":
        # A fresh turn id (`new_turn_id(conversation_id)` for a turn of a conversation): for a caller that
        # keeps the id before submitting, to submit again safely.
        from orchestrator.store.codec import new_turn_id

        return new_turn_id
    if name in _HTTP_NAMES:
        from orchestrator.client import http_client

        return getattr(http_client, name)
    if name in __all__:
        from orchestrator.client import redis_client as client

        return getattr(client, name)
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
