"""The state machine's layering, checked on the source (orchestrator/machine/__init__.py).

Imports go downwards only; no machine module imports I/O, a clock, randomness or another orchestrator
package (vendor traits come from `orchestrator.providers.traits`, which is pure data); no vendor name is
written in the machine's code.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

import orchestrator.machine
from orchestrator.providers.profiles import PROFILES
from orchestrator.providers.traits import PROVIDER_TRAITS

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[3]
MACHINE = ROOT / "orchestrator" / "machine"
TRAITS = ROOT / "orchestrator" / "providers" / "traits.py"
PACKAGE = "orchestrator.machine"

# Top to bottom: a module imports only from the layers below its own (validation and view are leaves).
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"loop"}),
    frozenset({"model_calls"}),
    frozenset({"answers", "model_errors"}),
    frozenset({"tool_round"}),
    frozenset({"agents"}),
    frozenset({"stopping", "waits"}),
    frozenset({"draft"}),
    frozenset({"validation", "view", "budgets"}),
    frozenset({"state", "events"}),
    frozenset({"layout"}),  # the stored layout of a state, on JSON
)
LAYER_OF = {name: depth for depth, layer in enumerate(LAYERS) for name in layer}
FORBIDDEN_ROOTS = frozenset({"redis", "httpx", "celery", "kombu", "asyncio", "time", "random"})
FORBIDDEN_PACKAGES = ("orchestrator.runtime", "orchestrator.store", "orchestrator.providers")
ALLOWED_PROVIDER_MODULE = "orchestrator.providers.traits"
IO_ROOTS = frozenset({"httpx", "httpcore", "redis", "celery", "kombu", "botocore", "google"})
WIRE_MODULES = frozenset(profile.wire for profile in PROFILES.values())


def machine_modules() -> Iterator[tuple[str, ast.Module, str]]:
    for path in sorted(MACHINE.glob("*.py")):
        source = path.read_text(encoding="utf-8")
        yield path.stem, ast.parse(source, filename=str(path)), source


def imported(tree: ast.Module) -> Iterator[str]:
    """Every name an import statement reaches, as `package.module[.name]`, wherever the statement is."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, "relative imports would hide from these checks"
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def test_every_module_has_a_layer() -> None:
    assert {stem for stem, _, _ in machine_modules()} - {"__init__"} == set(LAYER_OF)


def test_imports_go_downwards_only() -> None:
    upward = []
    for stem, tree, _ in machine_modules():
        if stem == "__init__":
            continue  # the face, above every layer
        for name in imported(tree):
            if not within(name, PACKAGE):
                continue
            parts = name.split(".")
            target = parts[2] if len(parts) > 2 else "__init__"
            if LAYER_OF.get(target, -1) <= LAYER_OF[stem]:
                upward.append(f"{stem} imports {name}")
    assert upward == []


def test_the_face_is_the_loop() -> None:
    _, tree, _ = next(m for m in machine_modules() if m[0] == "__init__")
    assert {name.rsplit(".", 1)[0] for name in imported(tree)} == {f"{PACKAGE}.loop"}
    assert sorted(orchestrator.machine.__all__) == ["Policy", "parkable", "resume", "start", "step"]


def test_no_io_clock_randomness_or_other_orchestrator_packages() -> None:
    offenders = []
    for stem, tree, _ in machine_modules():
        for name in imported(tree):
            if within(name, ALLOWED_PROVIDER_MODULE):
                continue
            if name.split(".")[0] in FORBIDDEN_ROOTS or any(within(name, p) for p in FORBIDDEN_PACKAGES):
                offenders.append(f"{stem} imports {name}")
    assert offenders == []


def test_traits_are_pure_data() -> None:
    # Traits are read from the providers' profiles: importing them (and every profile) loads no I/O library
    # and no wire module.
    probe = (
        "import sys, orchestrator.providers.traits\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        f"{sorted(IO_ROOTS)!r} or m in {sorted(WIRE_MODULES)!r}))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.strip()
    assert loaded == "[]"


def _vendor_pattern() -> re.Pattern[str]:
    names = {*PROVIDER_TRAITS, *(t.wire_family for t in PROVIDER_TRAITS.values())}
    return re.compile("|".join(sorted(map(re.escape, names), key=len, reverse=True)), re.IGNORECASE)


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _code_words(tree: ast.Module, source: str) -> Iterator[tuple[int, str]]:
    """Identifiers, string literals and comments, with their line; docstrings are documentation, not code."""
    documentation = {
        id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and _is_text(node.value)
    }
    for node in ast.walk(tree):
        if _is_text(node) and id(node) not in documentation:
            yield node.lineno, node.value
        elif isinstance(node, ast.Name):
            yield node.lineno, node.id
        elif isinstance(node, ast.Attribute):
            yield node.lineno, node.attr
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            yield node.lineno, node.name
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def test_no_vendor_name_in_the_machine_code() -> None:
    vendor = _vendor_pattern()
    found = [
        f"{stem}.py:{line}: {text!r}"
        for stem, tree, source in machine_modules()
        for line, text in _code_words(tree, source)
        if vendor.search(text)
    ]
    assert found == []
