"""Tools for the tenant checks: one that reports the tenant it was called for, a sensitive refund that waits
for a person's approval, and a public shipment that does too."""

from __future__ import annotations

from workers import ToolContext, tool


@tool(soft_time_limit=5, time_limit=10)
def whose_tenant(ctx: ToolContext) -> str:
    """Say which tenant the call is for."""
    return ctx.tenant


@tool(soft_time_limit=5, time_limit=10, sensitive=True, requires_confirmation=True)
def refund(amount: float) -> str:
    """Refund an amount to the customer."""
    return f"refunded {amount:.2f}"


@tool(soft_time_limit=5, time_limit=10, requires_confirmation=True)
def ship(order: str) -> str:
    """Ship an order."""
    return f"shipped {order}"
