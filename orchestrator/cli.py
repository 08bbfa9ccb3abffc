"""The `toolloop` command. Each area registers its own subcommands from `orchestrator.commands`."""

from __future__ import annotations

import typer

from orchestrator.commands import flower, normalize, tools, turns, turns_api
from workers.errors import RedisConfigError

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
    try:
        app()
    except RedisConfigError as exc:
        # A configuration mistake (a Sentinel URL without its master name, say): one line, not a traceback.
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
