"""The house rules of the layout, checked on the source (docs/development.md, "Layout"; docs/design/index.md).

Each rule here was broken once: workers loading model credentials, a Redis client opened without the TLS
policy, Lua hidden in Python strings, the sensitive-tool rule written four times, errors in four modules.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import ToolloopError
from workers.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "workers")
ERROR_MODULES = {Path("orchestrator/errors.py"), Path("workers/errors.py")}
CONNECT_MODULE = Path("workers/connect.py")
LISTING_MODULE = Path("workers/contract.py")
# Names a class derives from when it is an exception of ours (the builtins ours also derive from).
EXCEPTION_BASES = {"Exception", "ValueError", "LookupError", "RuntimeError", "KeyError", "TypeError"}


def python_files(*packages: str) -> Iterator[Path]:
    for package in packages:
        yield from sorted((ROOT / package).rglob("*.py"))


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def relative(path: Path) -> Path:
    return path.relative_to(ROOT)


def imported_modules(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_workers_import_nothing_from_the_orchestrator() -> None:
    offenders = [
        f"{relative(path)} imports {module}"
        for path in python_files("workers")
        for module in imported_modules(parse(path))
        if module == "orchestrator" or module.startswith("orchestrator.")
    ]
    assert offenders == []


def module_name(path: Path) -> str:
    parts = list(relative(path).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(*packages: str) -> dict[str, set[str]]:
    """Each module of the packages and the modules of theirs it imports, wherever the import statement is
    (a function-local import is an import all the same), except under `if TYPE_CHECKING:`."""
    paths = {module_name(path): path for path in python_files(*packages)}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        tree = parse(path)
        typing_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for inner in ast.walk(node)
        }
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                # `from a.b import c` reaches the module a.b.c when there is one, else a.b itself.
                targets.update(
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                    for alias in node.names
                )
        found = set()
        for target in targets:
            reached = target
            while reached and reached not in paths:
                reached = reached.rpartition(".")[0]
            if reached and reached != name:
                found.add(reached)
        graph[name] = found
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module: each is an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_no_import_cycle() -> None:
    assert strongly_connected(import_graph(*PACKAGES)) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]


def test_no_python_module_holds_lua() -> None:
    holders = [str(relative(p)) for p in python_files(*PACKAGES, "ops") if "redis.call(" in p.read_text()]
    assert holders == []


def test_every_exception_class_lives_in_the_error_tree() -> None:
    outside = []
    for path in python_files(*PACKAGES, "ops"):
        for node in ast.walk(parse(path)):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
            is_error = bases & EXCEPTION_BASES or any(b.endswith("Error") for b in bases)
            if is_error and relative(path) not in ERROR_MODULES:
                outside.append(f"{relative(path)}:{node.lineno} {node.name}")
    assert outside == []


def test_the_error_tree_has_one_root() -> None:
    from orchestrator import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, ToolloopError), name


def test_redis_is_opened_only_through_the_connect_helper() -> None:
    # `Redis.from_url` or `Redis(...)` anywhere else could skip the rediss:// certificate policy.
    offenders = []
    for path in python_files(*PACKAGES):
        if relative(path) == CONNECT_MODULE:
            continue
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                func = node.func
                opened = func.attr == "from_url" and getattr(func.value, "attr", None) == "Redis"
                opened = opened or (
                    func.attr == "Redis" and getattr(func.value, "id", "") in {"redis", "aioredis"}
                )
                if opened:
                    offenders.append(f"{relative(path)}:{node.lineno}")
    assert offenders == []


def test_the_sensitive_filter_is_written_once() -> None:
    # Filtering on `.sensitive` (a comprehension's condition, or `not x.sensitive`) belongs to build_listing.
    places = []
    for path in python_files(*PACKAGES):
        for node in ast.walk(parse(path)):
            conditions: list[ast.expr] = []
            if isinstance(node, ast.comprehension):
                conditions = list(node.ifs)
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                conditions = [node.operand]
            for condition in conditions:
                for inner in ast.walk(condition):
                    if isinstance(inner, ast.Attribute) and inner.attr == "sensitive":
                        places.append(f"{relative(path)}:{inner.lineno}")
    assert places, "the rule itself must be found"
    assert {p.split(":")[0] for p in places} == {str(LISTING_MODULE)}


@pytest.mark.parametrize(
    "variable", ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "TOOLLOOP_API_TOKEN", "TOOLLOOP_MODEL"]
)
def test_a_tool_worker_never_reads_model_credentials(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(variable, "sk-secret-value")
    settings = WorkerSettings()
    assert "sk-secret-value" not in repr(settings.model_dump())
    credentials = {"api_key", "api_token", "key", "token", "model"}
    assert not [f for f in WorkerSettings.model_fields if any(part in f for part in credentials)]
