"""The docs site's build hooks (mkdocs.yml `hooks:`): what the reference pages take from the code itself.

- The HTTP API page renders the schema `orchestrator.api.app.create_app` serves with neoteroi's `[OAD(...)]`:
  each build writes it to `build/openapi.json` first (what the page's tag reads) and publishes it as the
  site's `reference/openapi.json`, so the page never describes another API and nothing generated is
  committed.
- The CLI page's `<!-- toolloop-commands -->` becomes every `toolloop` command with its arguments and options,
  read from the typer app, so a new option is documented by the build that ships it.
- The models guide's `<!-- toolloop-providers -->` becomes the table of providers a model may name, read from
  their profiles (`orchestrator.providers.profiles`), so a new provider is documented by its profile.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# build/ is the site's own output folder (site_dir is build/site), never committed.
OPENAPI_PATH = ROOT / "build" / "openapi.json"
OPENAPI_SITE_PATH = "reference/openapi.json"
CLI_MARKER = "<!-- toolloop-commands -->"
PROVIDERS_MARKER = "<!-- toolloop-providers -->"


def build_openapi_schema() -> dict[str, Any]:
    """The OpenAPI schema of the API `toolloop api` serves (default settings: the schema is the same with a
    token, which it declares as the bearer scheme either way)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from orchestrator.api.app import create_app
    from orchestrator.settings import Settings

    return create_app(Settings(api_token=None)).openapi()


def build_openapi_text() -> str:
    """The schema as the site publishes it: indented, keys in the app's order, a final newline."""
    return json.dumps(build_openapi_schema(), indent=2, ensure_ascii=False) + "\n"


def build_cli_reference() -> str:
    """Markdown for every `toolloop` command: its help, usage, arguments and options (from the typer app)."""
    import typer

    from orchestrator.cli import app

    # typer carries its own copy of click: its objects are read by what they have, not by click's classes.
    group: Any = typer.main.get_command(app)
    context = group.context_class(group, info_name="toolloop")
    names = group.list_commands(context)
    return "\n".join(_command_section(name, group.commands[name], context) for name in names)


def _command_section(name: str, command: Any, parent: Any) -> str:
    context = command.context_class(command, info_name=name, parent=parent)
    lines = [f"### `toolloop {name}`", "", _plain(command.help or ""), ""]
    lines += ["```text", " ".join(["toolloop", name, *command.collect_usage_pieces(context)]), "```", ""]
    rows: list[str] = []
    for param in command.get_params(context):
        if param.name == "help":
            continue
        record = param.get_help_record(context)
        if param.param_type_name == "argument":
            text = _cell(getattr(param, "help", None) or "argument")
            rows.append(f"| `{param.human_readable_name}` | {text}{_optional(param)} |")
        elif record is not None:
            names, text = record
            rows.append(f"| `{names}` | {_cell(text)} |")
    if rows:
        lines += ["| argument or option | meaning |", "| --- | --- |", *rows, ""]
    return "\n".join(lines)


def _optional(param: Any) -> str:
    return "" if param.required else " (optional)"


def _plain(text: str) -> str:
    # typer keeps docstrings' hard line breaks; a paragraph reads better joined.
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def on_files(files: Any, config: Any) -> Any:
    """Write the API's schema where the HTTP API page's `[OAD(...)]` reads it; publish it with the site."""
    from mkdocs.structure.files import File

    text = build_openapi_text()
    OPENAPI_PATH.parent.mkdir(parents=True, exist_ok=True)
    OPENAPI_PATH.write_text(text)
    files.append(File.generated(config, OPENAPI_SITE_PATH, content=text))
    return files


def build_providers_table() -> str:
    """The providers a model may name, one row each, from their profiles."""
    sys.path.insert(0, str(ROOT))
    from orchestrator.providers.profiles import PROFILES

    rows = [
        "| provider | what it calls | variables | output schema | extra |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, profile in PROFILES.items():
        if profile.endpoint is None:
            continue
        variables = ", ".join(f"`{v}`" for v in profile.endpoint.variables) or "none"
        extra = f"`celery-toolloop[{profile.extra}]`" if profile.extra else ""
        schema = profile.structured_output.replace("_", " ")
        rows.append(f"| `{name}:` | {_cell(profile.summary)} | {variables} | {schema} | {extra} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Put the generated command reference and providers table where their pages ask for them."""
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, build_cli_reference())
    if PROVIDERS_MARKER in markdown:
        markdown = markdown.replace(PROVIDERS_MARKER, build_providers_table())
    return markdown
