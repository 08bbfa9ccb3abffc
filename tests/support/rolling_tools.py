"""A second tool module, served beside `tests.support.tools` by other workers in the rolling-deploy tests.

Each tool has its own queue (`tool.<name>`), so one worker can serve this module narrowed with `--queues`.
"""

from __future__ import annotations

from workers import tool


@tool(soft_time_limit=5, time_limit=10)
def shout(text: str) -> str:
    """Say a text loudly."""
    return f"{text.upper()}!"


@tool(soft_time_limit=5, time_limit=10, requires_confirmation=True)
def ship_parcel(parcel: str) -> str:
    """Ship a parcel; a human approves it first (so a turn can wait before dispatching it)."""
    return f"shipped {parcel}"
