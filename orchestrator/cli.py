"""The `toolloop` command. Each area registers its own subcommands from `orchestrator.commands`.

`toolloop --version` prints the installed distribution's version; `--install-completion` and
`--show-completion` set up shell completion (typer's).
"""

from __future__ import annotations

import inspect
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

import orchestrator.commands.schedules as schedule_commands
from orchestrator.commands import flower, fork, normalize, tools, turns, turns_api
from orchestrator.commands.exits import describe_validation_error
from workers.errors import RedisConfigError

# The distribution `pip install` knows toolloop by (the command and the packages are named otherwise).
DISTRIBUTION = "celery-toolloop"
# The project file of a source tree, beside the `orchestrator` package.
SOURCE_PROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

app = typer.Typer(
    name="toolloop",
    help="Run LLM tool-calling loops on Celery workers.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

for module in (tools, normalize, turns, turns_api, fork, flower):
    module.register(app)
schedule_commands.register(app)


def build_help(doc: str) -> str:
    """A command's docstring as its help: each paragraph's lines joined, so that the terminal wraps them.

    Typer's rich help keeps every line break of a paragraph after the first, and a docstring's lines are
    wrapped for the source: at 80 columns, sentences broke midway."""
    return "\n\n".join(" ".join(line.strip() for line in para.splitlines()) for para in doc.split("\n\n"))


def _reflow_help(group: typer.Typer) -> None:
    for command in group.registered_commands:
        if command.help is None and command.callback is not None:
            command.help = build_help(inspect.getdoc(command.callback) or "")
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _reflow_help(sub.typer_instance)


_reflow_help(app)


def read_version(project_file: Path = SOURCE_PROJECT) -> str:
    """The installed distribution's version; run from a source tree that was never installed, the version
    its `pyproject.toml` declares, marked `+source`; `unknown` when neither can be read."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        project = tomllib.loads(project_file.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return "unknown"
    if project.get("name") != DISTRIBUTION or not isinstance(project.get("version"), str):
        return "unknown"
    return f"{project['version']}+source"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"toolloop {read_version()}")
        raise typer.Exit()


@app.callback()
def toolloop(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print toolloop's version and exit."
        ),
    ] = False,
) -> None:
    """Run LLM tool-calling loops on Celery workers."""
    del version  # handled by its callback, before any command runs


def main() -> None:
    try:
        app()
    except RedisConfigError as exc:
        # A configuration mistake (a Sentinel URL without its master name, say): one line, not a traceback.
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    except ValidationError as exc:
        # Settings read from the environment that break a rule (a cluster without its broker, say), met by a
        # command that reads them before it can say so itself: one line too. Any other is a bug: raised.
        if not exc.title.endswith("Settings"):
            raise
        typer.echo(f"error: {describe_validation_error(exc, 'settings')}", err=True)
        raise SystemExit(2) from None
