"""docker-compose.yml, the Dockerfiles, .dockerignore and prometheus.yml refer to real commands, options,
settings, services and ports.

No Docker engine runs in the test environment, so the files are checked by reading them: every `toolloop`
command in the compose file parses with the real CLI, Redis persists with AOF, workers can be scaled, Flower
runs `toolloop flower` on the workers' broker with basic auth from the environment, the API binds every
interface and so needs its token unless told otherwise, Prometheus scrapes what the compose services serve,
the image installs the project from pyproject.toml with nothing heavy or secret in the build context, and
the tools image builds FROM it.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.commands.exposure import is_loopback_host
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


TOOLLOOP_SERVICES = ("api", "orchestrator", "worker", "flower")


def cli_envvars() -> set[str]:
    """Every environment variable an option of the real `toolloop` command reads."""
    command = typer.main.get_command(app)
    names: set[str] = set()
    for sub in getattr(command, "commands", {}).values():
        for param in sub.params:
            envvar = getattr(param, "envvar", None)
            names |= {envvar} if isinstance(envvar, str) else set(envvar or ())
    return names


def option(command: list[str], name: str) -> str:
    """The value of `--name V` or `--name=V` in a command line."""
    for index, part in enumerate(command):
        if part == name:
            return command[index + 1]
        if part.startswith(f"{name}="):
            return part.split("=", 1)[1]
    raise AssertionError(f"{name} not in {command}")


TRACING_SERVICES = ("otel-collector", "jaeger")


def test_the_services_are_there(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"redis", *TOOLLOOP_SERVICES, "prometheus", *TRACING_SERVICES}


def test_the_tracing_profile_runs_a_collector_that_sends_to_jaeger(compose: dict[str, Any]) -> None:
    # Only `docker compose --profile tracing` starts them; toolloop exports only when the endpoint is set.
    for name in TRACING_SERVICES:
        assert compose["services"][name]["profiles"] == ["tracing"]
    collector = compose["services"]["otel-collector"]
    (mount,) = collector["volumes"]
    source, target, _ = mount.split(":")
    assert f"--config={target}" in collector["command"]
    config = yaml.safe_load((ROOT / source).read_text())
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    (exporter,) = config["service"]["pipelines"]["traces"]["exporters"]
    assert config["exporters"][exporter]["endpoint"].split(":")[0] == "jaeger"
    for name in TOOLLOOP_SERVICES[:3]:
        assert not compose["services"][name]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    text = (ROOT / "docker-compose.yml").read_text()
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://otel-collector:4318 docker compose --profile tracing" in text


def test_redis_persists_with_aof_and_others_wait_for_it(compose: dict[str, Any]) -> None:
    redis_service = compose["services"]["redis"]
    command = redis_service["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    # Its data directory is a named volume (declared at the top level), not the container's own layer.
    (volume,) = [v for v in redis_service["volumes"] if v.endswith(":/data")]
    assert volume.split(":")[0] in compose["volumes"]
    for name in TOOLLOOP_SERVICES:
        assert compose["services"][name]["depends_on"]["redis"]["condition"] == "service_healthy"


@pytest.mark.parametrize("service", TOOLLOOP_SERVICES)
def test_toolloop_commands_parse_with_the_real_cli(compose: dict[str, Any], service: str) -> None:
    command = [str(part) for part in compose["services"][service]["command"]]
    assert command[0] == "toolloop"
    result = CliRunner().invoke(app, [*command[1:], "--help"])
    assert result.exit_code == 0, result.output


def test_environment_names_are_real_settings(compose: dict[str, Any]) -> None:
    known = {f"TOOLLOOP_{name.upper()}" for name in Settings.model_fields}
    known |= {"OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "OTEL_EXPORTER_OTLP_ENDPOINT"}
    known |= cli_envvars()
    flower_own = {"FLOWER_BASIC_AUTH", "FLOWER_UNAUTHENTICATED_API"}
    for name in TOOLLOOP_SERVICES:
        env = compose["services"][name]["environment"]
        assert set(env) <= known | flower_own, set(env) - known - flower_own
        assert env["TOOLLOOP_REDIS_URL"] == "redis://redis:6379/0"


def test_workers_scale_and_flower_runs_toolloop_flower_behind_basic_auth(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    # A fixed container name or host port would make `--scale worker=4` fail.
    assert "container_name" not in worker and "ports" not in worker
    flower = compose["services"]["flower"]
    # `toolloop flower` finds the broker as the workers do; `celery flower` alone would try AMQP on localhost.
    assert flower["command"][:2] == ["toolloop", "flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"] == "sample"
    assert flower["environment"]["FLOWER_UNAUTHENTICATED_API"] == "false"
    port = option(flower["command"], "--port")
    assert f"{port}:{port}" in flower["ports"]


def test_flower_basic_auth_is_required_from_the_environment() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    assert "FLOWER_BASIC_AUTH: ${FLOWER_BASIC_AUTH:?" in text


def test_the_api_binds_every_interface_so_its_token_is_required_by_default(compose: dict[str, Any]) -> None:
    api = compose["services"]["api"]
    assert not is_loopback_host(option(api["command"], "--host"))
    # Unset, both default to empty: `toolloop api` then refuses to start (tests/e2e/test_api_token.py).
    assert not api["environment"]["TOOLLOOP_API_TOKEN"]
    assert not api["environment"]["TOOLLOOP_API_ALLOW_NO_TOKEN"]
    text = (ROOT / "docker-compose.yml").read_text()
    assert "TOOLLOOP_API_ALLOW_NO_TOKEN: ${TOOLLOOP_API_ALLOW_NO_TOKEN:-}" in text


def test_dockerfile_installs_the_project_from_pyproject() -> None:
    dockerfile = (ROOT / "ops" / "Dockerfile").read_text()
    assert "COPY pyproject.toml" in dockerfile
    assert re.search(r"pip install '\.\[ops\]'", dockerfile)
    for package in ("orchestrator", "workers", "ops"):
        assert f"COPY {package} ./{package}" in dockerfile
    assert "USER toolloop" in dockerfile
    # The working directory is where tool packages go (copied by Dockerfile.tools, or mounted).
    assert re.findall(r"^WORKDIR (\S+)", dockerfile, re.MULTILINE)[-1] == "/app"


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def is_ignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `path` (relative to the context) out, for the plain patterns used here."""
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        if any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
            return True
        if pattern.startswith("**/") and any(fnmatch.fnmatch(part, bare) for part in parts):
            return True
    return False


@pytest.mark.parametrize(
    "path",
    [
        ".venv",
        ".git",
        ".mypy_cache",
        ".ruff_cache",
        ".pytest_cache",
        ".hypothesis",
        ".env",
        "orchestrator/__pycache__",
        "workers/__pycache__/app.cpython-311.pyc",
        "toolloop.egg-info",
        "tests",
    ],
)
def test_the_build_context_leaves_out_the_venv_git_caches_and_secrets(path: str) -> None:
    assert is_ignored(path, dockerignore_patterns()), f"{path} would be sent to the Docker daemon"


def test_the_build_context_keeps_what_the_dockerfile_copies() -> None:
    dockerfile = (ROOT / "ops" / "Dockerfile").read_text()
    sources = [
        source.rstrip("*")
        for line in re.findall(r"^COPY (.+)$", dockerfile, re.MULTILINE)
        for source in line.split()[:-1]
    ]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not is_ignored(source, dockerignore_patterns()), f"{source} is copied but ignored"


def test_the_tools_image_builds_from_ours_into_its_working_directory(compose: dict[str, Any]) -> None:
    tools = (ROOT / "ops" / "Dockerfile.tools").read_text()
    base = re.search(r"^ARG TOOLLOOP_IMAGE=(\S+)", tools, re.MULTILINE)
    assert base is not None and base.group(1) == compose["services"]["api"]["image"]
    assert re.search(r"^FROM \$\{TOOLLOOP_IMAGE\}", tools, re.MULTILINE)
    assert re.search(r"^COPY \$\{TOOLS_PACKAGE\} /app/\$\{TOOLS_PACKAGE\}", tools, re.MULTILINE)
    assert "TOOLLOOP_TOOL_MODULES=${TOOLS_PACKAGE}.tools" in tools
    # Root only to install; the workers run unprivileged as in the base image (Celery refuses root).
    assert re.findall(r"^USER (\S+)", tools, re.MULTILINE)[-1] == "toolloop"


@pytest.fixture(scope="module")
def prometheus_jobs() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load((ROOT / "ops" / "prometheus.yml").read_text())
    return {job["job_name"]: job for job in config["scrape_configs"]}


def test_prometheus_runs_in_compose_with_this_config(compose: dict[str, Any]) -> None:
    prometheus = compose["services"]["prometheus"]
    assert prometheus["image"].startswith("prom/prometheus:")
    assert "./ops/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert {"api", "orchestrator"} <= set(prometheus["depends_on"])


def test_prometheus_scrapes_the_api_where_compose_serves_it_with_its_token(
    compose: dict[str, Any], prometheus_jobs: dict[str, dict[str, Any]]
) -> None:
    job = prometheus_jobs["toolloop-api"]
    [target] = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    api = compose["services"][host]
    assert option(api["command"], "--port") == port
    # The token reaches Prometheus as a compose secret, read from the same variable the API reads.
    secret = Path(job["authorization"]["credentials_file"])
    assert secret.parent == Path("/run/secrets")
    assert secret.name in compose["services"]["prometheus"]["secrets"]
    assert compose["secrets"][secret.name]["environment"] == "TOOLLOOP_API_TOKEN"


def test_prometheus_scrapes_every_orchestrator_on_its_metrics_port(
    compose: dict[str, Any], prometheus_jobs: dict[str, dict[str, Any]]
) -> None:
    [discovery] = prometheus_jobs["toolloop-orchestrator"]["dns_sd_configs"]
    [service_name] = discovery["names"]
    orchestrator = compose["services"][service_name]
    assert discovery["port"] == int(orchestrator["environment"]["TOOLLOOP_METRICS_PORT"])
    # A fixed container name would stop `--scale orchestrator=N`, and with it the DNS answer of every replica.
    assert "container_name" not in orchestrator
