"""The runtime's layering, checked on the source (orchestrator/runtime/__init__.py).

Imports between runtime modules go downwards only, so nothing climbs back into the process; and the state
machine is run (`machine.start` / `step` / `resume`) by the driver alone.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

RUNTIME = Path(__file__).resolve().parents[2] / "orchestrator" / "runtime"
PACKAGE = "orchestrator.runtime"
# Top to bottom: a module imports only from the layers below its own.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"process"}),
    frozenset({"traced"}),
    frozenset({"driver"}),
    frozenset({"adopt", "perform", "durability", "persist"}),
    frozenset({"handle", "inbox", "timers", "streaming", "turn_spans"}),
)
LAYER_OF = {name: depth for depth, layer in enumerate(LAYERS) for name in layer}
MACHINE_RUNS = frozenset({"start", "step", "resume"})


def runtime_modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(RUNTIME.glob("*.py")):
        if path.stem != "__init__":
            yield path.stem, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def runtime_imports(tree: ast.Module) -> Iterator[str]:
    """The runtime modules an import statement reaches, wherever the statement is."""
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            if name.startswith(f"{PACKAGE}."):
                yield name.removeprefix(f"{PACKAGE}.").split(".")[0]


def machine_runs(tree: ast.Module) -> Iterator[str]:
    """`machine.start(...)`-style calls, and imports of start/step/resume from the machine."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "machine"
            and node.attr in MACHINE_RUNS
        ):
            yield f"machine.{node.attr}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("orchestrator.machine"):
            yield from (f"import {alias.name}" for alias in node.names if alias.name in MACHINE_RUNS)


def test_every_runtime_module_has_a_layer() -> None:
    assert {name for name, _ in runtime_modules()} == set(LAYER_OF)


def test_runtime_modules_import_only_downwards() -> None:
    upwards = [
        f"{name} imports {target}"
        for name, tree in runtime_modules()
        for target in runtime_imports(tree)
        if target != name and LAYER_OF[target] <= LAYER_OF[name]
    ]
    assert upwards == []


def test_only_the_driver_runs_the_machine() -> None:
    runs = {name: sorted(set(machine_runs(tree))) for name, tree in runtime_modules()}
    assert {name: found for name, found in runs.items() if found} == {
        "driver": ["machine.resume", "machine.start", "machine.step"]
    }
