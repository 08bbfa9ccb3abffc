"""A bare message or list of tool calls, as a framework's own log writes it: read, never called."""

from __future__ import annotations

from orchestrator.providers.profile import ProviderProfile

PROFILE = ProviderProfile(
    name="bare",
    wire="orchestrator.providers.bare",
    summary="a bare assistant message or list of tool calls (read only)",
    wire_family="bare",
    endpoint=None,
    detect_rank=90,
    aliases=("message", "tool_calls", "turn"),
)
