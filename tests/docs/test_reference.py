"""The reference pages say what the code does: the settings page names every setting, no page names a
`TOOLLOOP_*` variable that nothing reads, and the generated CLI reference has every command."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType
from typing import Any

from orchestrator.settings import PROVIDER_VARIABLES, Settings
from tests.docs.blocks import ROOT, doc_pages

SETTINGS_PAGE = ROOT / "docs" / "reference" / "settings.md"
VARIABLE = re.compile(r"\bTOOLLOOP_[A-Z0-9_]*[A-Z0-9]\b")


def load_hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def setting_variables() -> set[str]:
    """Every variable a toolloop process reads: the settings' fields (and aliases), and the CLI's own."""
    names: set[str] = set()
    for field_name, field in Settings.model_fields.items():
        if field.exclude:
            continue  # read from the providers' own variables, never from a TOOLLOOP_ name of its own
        names.add(f"TOOLLOOP_{field_name.upper()}")
        aliases: Any = field.validation_alias
        names.update(a for a in getattr(aliases, "choices", []) if isinstance(a, str))
    # Each provider's variables (its profile's), under its vendor's name and with the TOOLLOOP_ prefix.
    names.update(PROVIDER_VARIABLES)
    names.update(f"TOOLLOOP_{name}" for name in PROVIDER_VARIABLES)
    import typer

    from orchestrator.cli import app

    cli: Any = typer.main.get_command(app)
    for command in cli.commands.values():
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            names.update([envvar] if isinstance(envvar, str) else list(envvar or []))
    return names


def test_the_settings_page_names_every_setting() -> None:
    page = SETTINGS_PAGE.read_text()
    # A provider variable's TOOLLOOP_ twin is named by one sentence, not row by row.
    twins = {f"TOOLLOOP_{name}" for name in PROVIDER_VARIABLES}
    missing = sorted(name for name in setting_variables() - twins if f"`{name}`" not in page)
    # The provider keys are listed under their vendors' names, their TOOLLOOP_ aliases in a sentence.
    assert [m for m in missing if m not in page] == []


def test_no_page_names_a_variable_nothing_reads() -> None:
    known = setting_variables()
    unknown = {
        f"{page.relative_to(ROOT)}: {name}"
        for page in doc_pages()
        for name in VARIABLE.findall(page.read_text())
        if name not in known
    }
    assert sorted(unknown) == []


def test_the_cli_reference_lists_every_command() -> None:
    reference = load_hooks().build_cli_reference()
    import typer

    from orchestrator.cli import app

    cli: Any = typer.main.get_command(app)
    assert all(f"### `toolloop {name}`" in reference for name in cli.commands)
