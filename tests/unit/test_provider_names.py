"""A provider is its wire module plus its profile: no other code names it.

Every string literal in `orchestrator/` and `workers/` that is a provider's name (or a wire family's) is
listed, with where it is; only a provider's profile, its wire module and that module's siblings
(`gemini_request`, …), and what its profile calls for it (`sigv4`, `google_auth`) may hold one. Adding a
provider touches those files only: the registry, traits, controls, tracing, prices, windows, detection and
the settings read the profiles.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from orchestrator.providers.profiles import PROFILES

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
PROVIDERS = ROOT / "orchestrator" / "providers"
PROFILES_DIR = PROVIDERS / "profiles"
NAMES = frozenset({*PROFILES, *(profile.wire_family for profile in PROFILES.values())})


def _wire_stems() -> set[str]:
    return {profile.wire.rsplit(".", 1)[1] for profile in PROFILES.values()}


def _called_by_profiles() -> set[str]:
    """The provider modules a profile imports (its auth and endpoint helpers)."""
    called: set[str] = set()
    for path in PROFILES_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "orchestrator.providers":
                    called.update(alias.name for alias in node.names)
                elif node.module.startswith("orchestrator.providers."):
                    called.add(node.module.split(".")[2])
    return called - {"profile", "profiles", "sending"}


def _may_name_providers(path: Path) -> bool:
    if path.parent == PROFILES_DIR:
        return True
    if path.parent != PROVIDERS:
        return False
    stem = path.stem
    return stem in _called_by_profiles() or any(stem == w or stem.startswith(f"{w}_") for w in _wire_stems())


def _named(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        f"{path.relative_to(root)}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and node.value.strip().lower() in NAMES
    ]


def test_only_a_providers_own_files_name_it() -> None:
    named = [
        where
        for package in ("orchestrator", "workers")
        for path in sorted((ROOT / package).rglob("*.py"))
        if not _may_name_providers(path)
        for where in _named(path)
    ]
    assert named == []


def test_the_check_sees_a_provider_named_elsewhere(tmp_path: Path) -> None:
    stray = tmp_path / "stray.py"
    stray.write_text('KIND = "bedrock"\n"""A docstring may say gemini."""\n')
    assert [where.split(" ", 1)[1] for where in _named(stray, tmp_path)] == ["'bedrock'"]


def test_every_callable_provider_has_a_wire_module_with_the_client_contract() -> None:
    import importlib

    for name, profile in PROFILES.items():
        if profile.endpoint is None:
            continue
        wire = importlib.import_module(profile.wire)
        for function in (profile.endpoint.url_builder, "to_wire", "from_wire", "error_from_wire"):
            assert callable(getattr(wire, function, None)), f"{name}: {profile.wire}.{function}"
        for function in ("parse_rate_limits", "stream_reader", "sniff_body", "sniff_event", "sniff_error"):
            assert callable(getattr(wire, function, None)), f"{name}: {profile.wire}.{function}"
