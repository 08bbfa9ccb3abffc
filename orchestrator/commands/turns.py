"""Subcommands of `toolloop` (filled in by the area that owns them)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this area's commands to `app`."""
