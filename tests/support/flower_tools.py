"""A tool for the Flower test, on its own queue so that only that test's worker serves it."""

from __future__ import annotations

from workers import tool

FLOWER_QUEUE = "flower_test"


@tool(queue=FLOWER_QUEUE, soft_time_limit=5, time_limit=10)
def lookup_account(account: str, api_token: str) -> str:
    """Look an account up with a secret token (the token must never show in Flower)."""
    return f"account {account} ok (token of {len(api_token)} chars)"
