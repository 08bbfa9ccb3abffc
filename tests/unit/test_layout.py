"""The house rules of the layout, checked on the source (README "Layout"; ARCHITECTURE.md).

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
MAX_MODULE_LINES = 400
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


def test_no_module_is_over_the_line_limit() -> None:
    too_long = {
        str(relative(path)): lines
        for path in python_files(*PACKAGES)
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert too_long == {}


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
