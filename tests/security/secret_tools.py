"""A tool whose arguments carry secrets, for the redaction checks."""

from __future__ import annotations

from typing import Any

from workers import tool


@tool(soft_time_limit=5, time_limit=10)
def secret_login(user: str, password: str, api_key: str, options: dict[str, Any] | None = None) -> str:
    """Log a user in (its password and key must never be shown anywhere)."""
    return f"logged in {user} ({len(password)}-char password)"
