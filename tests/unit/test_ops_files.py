"""docker-compose.yml, the Dockerfile and prometheus.yml refer to real commands, options and settings.

No Docker engine runs in the test environment, so the files are checked by reading them: every `toolloop`
command in the compose file parses with the real CLI, Redis persists with AOF, workers can be scaled, Flower
has basic auth from the environment, and the image installs the project from pyproject.toml.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
_DEFAULTED = re.compile(r"\$\{(\w+):-([^}]*)\}")
_REQUIRED = re.compile(r"\$\{(\w+):\?[^}]*\}")


def interpolate(text: str) -> str:
    """Compose's `${VAR:-default}` with the defaults, and `${VAR:?msg}` with a sample value."""
    return _REQUIRED.sub("sample", _DEFAULTED.sub(lambda m: m.group(2), text))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(interpolate((ROOT / "docker-compose.yml").read_text()))
    return loaded


def test_the_services_are_there(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"redis", "api", "orchestrator", "worker", "flower"}


def test_redis_persists_with_aof_and_others_wait_for_it(compose: dict[str, Any]) -> None:
    redis_service = compose["services"]["redis"]
    command = redis_service["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert redis_service["volumes"]
    for name in ("api", "orchestrator", "worker", "flower"):
        assert compose["services"][name]["depends_on"]["redis"]["condition"] == "service_healthy"


@pytest.mark.parametrize("service", ["api", "orchestrator", "worker"])
def test_toolloop_commands_parse_with_the_real_cli(compose: dict[str, Any], service: str) -> None:
    command = [str(part) for part in compose["services"][service]["command"]]
    assert command[0] == "toolloop"
    result = CliRunner().invoke(app, [*command[1:], "--help"])
    assert result.exit_code == 0, result.output


def test_environment_names_are_real_settings(compose: dict[str, Any]) -> None:
    known = {f"TOOLLOOP_{name.upper()}" for name in Settings.model_fields}
    known |= {"OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "TOOLLOOP_METRICS_PORT"}
    for name in ("api", "orchestrator", "worker"):
        env = compose["services"][name]["environment"]
        assert set(env) <= known, set(env) - known
        assert env["TOOLLOOP_REDIS_URL"] == "redis://redis:6379/0"


def test_workers_scale_and_flower_has_basic_auth(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    # A fixed container name or host port would make `--scale worker=4` fail.
    assert "container_name" not in worker and "ports" not in worker
    flower = compose["services"]["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"] == "sample"
    command = flower["command"]
    assert command[:2] == ["celery", "--broker=redis://redis:6379/0"] and command[2] == "flower"


def test_flower_basic_auth_is_required_from_the_environment() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "FLOWER_BASIC_AUTH: ${FLOWER_BASIC_AUTH:?" in text


def test_dockerfile_installs_the_project_from_pyproject() -> None:
    dockerfile = (ROOT / "ops" / "Dockerfile").read_text()
    assert "COPY pyproject.toml" in dockerfile
    assert re.search(r"pip install '\.\[ops\]'", dockerfile)
    for package in ("orchestrator", "workers", "ops"):
        assert f"COPY {package} ./{package}" in dockerfile
    assert "USER toolloop" in dockerfile


def test_prometheus_scrapes_the_api_and_orchestrators(compose: dict[str, Any]) -> None:
    config = yaml.safe_load((ROOT / "ops" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["toolloop-api"]["static_configs"][0]["targets"] == ["api:8000"]
    assert jobs["toolloop-orchestrator"]["dns_sd_configs"][0]["port"] == int(
        compose["services"]["orchestrator"]["environment"]["TOOLLOOP_METRICS_PORT"]
    )
