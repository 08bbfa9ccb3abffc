"""The `toolloop` command. Each area registers its own subcommands from `orchestrator.commands`."""

from __future__ import annotations

import typer

from orchestrator.commands import flower, normalize, tools, turns, turns_api

app = typer.Typer(
    name="toolloop",
    help="Run LLM tool-calling loops on Celery workers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for module in (tools, normalize, turns, turns_api, flower):
    module.register(app)


def main() -> None:
    app()
