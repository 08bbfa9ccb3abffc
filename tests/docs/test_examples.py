"""Every code example of the README and the docs site runs (or, for a command line, parses) — a broken example
fails here (the markers are described in `tests.docs.blocks`).

- Python files of the example project (`title="shop/tools.py"`) are written into one project folder and each
  imported in a fresh interpreter; plain Python blocks run as scripts there, their `#>` lines checked. Neither
  may need Redis: the one they are given answers nothing.
- `system` blocks run the same way against a real stack of this module: a redis-server, a prefork
  `toolloop worker` serving the demo's tools and the project's tool modules, `toolloop orchestrator` (which
  serves the scripted model itself) and `toolloop api`. A turn page the block prints is fetched from the API.
- `cli` blocks run in bash against that stack; every other `toolloop` line of a shell block is parsed by the
  command itself (unknown options or commands fail), and every `make` target named exists.
- JSON blocks parse (`TOOLLOOP_MCP_SERVERS` ones with the worker's own parser); each curl names a route of the
  API's schema; an `app` block names the test that serves it, which must read it from its page.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.redis_server import RedisServer
from tests.docs.blocks import ROOT, Block, all_blocks
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.processes import TOOLLOOP_BIN, WorkerHandle, start_worker
from tests.support.served import serving_api

pytestmark = pytest.mark.timeout(180)

BLOCKS = all_blocks()
SHELL_LANGUAGES = {"bash", "sh", "console", "shell"}
MAX_SKIPPED = 3
# Given to the blocks that must not need Redis: nothing listens there, so a stray use fails.
NO_REDIS_URL = "redis://127.0.0.1:1/0"
SCRIPT_TIMEOUT_S = 120


def _ids(blocks: list[Block]) -> list[str]:
    return [b.id for b in blocks]


def _of(kind: str, *, language: str = "python") -> list[Block]:
    return [b for b in BLOCKS if b.kind == kind and b.language == language]


def _included(block: Block) -> bool:
    """A block whose body is a `--8<--` include of a repository file (shown, and tested, where it lives)."""
    return block.code.strip().startswith("--8<--")


PURE = [b for b in _of("python") + _of("app") if not _included(b)]
SYSTEM = _of("system")
CLI = _of("cli", language="bash")


# --- the example project ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding every file the docs show (`title="…py"`), packages with an `__init__.py`."""
    folder = tmp_path_factory.mktemp("docs-project")
    written: dict[str, Block] = {}
    for block in BLOCKS:
        if block.language != "python" or not block.is_file or _included(block):
            continue
        assert block.title is not None
        earlier = written.get(block.title)
        assert earlier is None or earlier.code == block.code, (
            f"{block.id} shows {block.title} unlike {earlier.id if earlier else ''}: one file, one content"
        )
        written[block.title] = block
        path = folder / block.title
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.code)
        for package in path.relative_to(folder).parents:
            if package != Path("."):
                (folder / package / "__init__.py").touch()
    return folder


def tool_modules(project: Path) -> list[str]:
    """The project's modules that define tools or agents (and no MCP server, whose address the tests cannot
    reach)."""
    modules = []
    for path in sorted(project.rglob("*.py")):
        text = path.read_text()
        declares = "@tool" in text or "from workers import agent" in text
        if declares and "mcp_server(" not in text:
            modules.append(".".join(path.relative_to(project).with_suffix("").parts))
    return modules


def run_python(block: Block, project: Path, redis_url: str) -> subprocess.CompletedProcess[str]:
    """Run a block as a reader would: a file imported (a system one run), a snippet as a script."""
    if block.is_file:
        assert block.title is not None
        module = ".".join(Path(block.title).with_suffix("").parts)
        command = [sys.executable, "-c", f"import importlib; importlib.import_module({module!r})"]
        if block.kind == "system":
            command = [sys.executable, block.title]
    else:
        command = [sys.executable, "-c", block.code]
    return subprocess.run(
        command,
        cwd=project,
        env=_env(project, redis_url),
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )


def _env(project: Path, redis_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "TOOLLOOP_REDIS_URL": redis_url,
        "PYTHONPATH": f"{project}{os.pathsep}{ROOT}",
        "PATH": f"{TOOLLOOP_BIN.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        # The tracing example exports to a collector nobody runs: give up on it at once.
        "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
    }


def check_output(block: Block, done: subprocess.CompletedProcess[str]) -> None:
    """The run succeeded and printed the block's `#>` lines, in order (`…` matching anything)."""
    story = f"{block.id} exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, story
    printed = done.stdout.splitlines()
    at = 0
    for wanted in block.expected_output:
        pattern = re.compile(".*".join(re.escape(piece) for piece in wanted.split("…")))
        while at < len(printed) and not pattern.fullmatch(printed[at]):
            at += 1
        assert at < len(printed), f"{block.id} did not print {wanted!r} (in order)\n{story}"
        at += 1


@pytest.mark.parametrize("block", PURE, ids=_ids(PURE))
def test_a_python_example_runs_alone(block: Block, project: Path) -> None:
    check_output(block, run_python(block, project, NO_REDIS_URL))


# --- against a real system ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docs_worker(module_redis: RedisServer, project: Path) -> Iterator[WorkerHandle]:
    modules = ["workers.examples", *tool_modules(project)]
    handle = start_worker(
        module_redis.url, modules, concurrency=2, env={"PYTHONPATH": f"{project}{os.pathsep}{ROOT}"}
    )
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def docs_orchestrator(module_redis: RedisServer, docs_worker: WorkerHandle) -> Iterator[OrchestratorHandle]:
    handle = start_orchestrator(module_redis.url)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def docs_api(module_redis: RedisServer, docs_orchestrator: OrchestratorHandle) -> Iterator[str]:
    with serving_api(module_redis.url) as url:
        yield url


@pytest.mark.e2e
@pytest.mark.parametrize("block", SYSTEM, ids=_ids(SYSTEM))
def test_a_system_example_runs_against_toolloop(
    block: Block, project: Path, module_redis: RedisServer, docs_api: str
) -> None:
    done = run_python(block, project, module_redis.url)
    check_output(block, done)
    for turn_id in re.findall(r"/ui/turns/(turn_\w+)", done.stdout):
        page = httpx.get(f"{docs_api}/ui/turns/{turn_id}", timeout=10)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"], page.text
        turn = httpx.get(f"{docs_api}/v1/turns/{turn_id}", timeout=10).json()
        assert turn["status"] == "completed", turn


@pytest.mark.e2e
@pytest.mark.parametrize("block", CLI, ids=_ids(CLI))
def test_a_cli_example_runs_against_toolloop(
    block: Block, project: Path, module_redis: RedisServer, docs_orchestrator: OrchestratorHandle
) -> None:
    script = "set -euo pipefail\n" + block.code
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=project,
        env=_env(project, module_redis.url),
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    check_output(block, done)


# --- command lines, JSON, routes ----------------------------------------------------------------------------


def shell_commands(block: Block) -> Iterator[list[str]]:
    """Each command of a shell block as words: continuations and quotes across lines joined, prompts,
    comments, `&` and the variables set before the command dropped."""
    pending = ""
    for raw in block.code.replace("\\\n", " ").splitlines():
        line = raw if pending else raw.strip().removeprefix("$ ")
        pending = f"{pending}\n{line}" if pending else line
        if not pending.strip() or pending.lstrip().startswith("#"):
            pending = ""
            continue
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # a quote that closes on a later line
            continue
        pending = ""
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0], re.DOTALL):
            words.pop(0)
        if words and words[-1] == "&":
            words.pop()
        if words and words[0] != "export":
            yield words
    assert not pending, f"{block.id}: a quote is never closed"


SHELL = [b for b in BLOCKS if b.language in SHELL_LANGUAGES]


def _toolloop_group() -> Any:
    import typer

    from orchestrator.cli import app

    return typer.main.get_command(app)


@pytest.mark.parametrize("block", SHELL, ids=_ids(SHELL))
def test_a_shell_examples_commands_exist(block: Block) -> None:
    group = _toolloop_group()
    makefile = (ROOT / "Makefile").read_text()
    for words in shell_commands(block):
        if words[0] == "toolloop":
            name, *args = words[1:]
            assert name in group.commands, f"{block.id}: no command `toolloop {name}`"
            command = group.commands[name]
            try:
                command.make_context(name, list(args))
            except Exception as exc:  # typer's own click raises its UsageError subclasses
                pytest.fail(f"{block.id}: `{shlex.join(words)}` does not parse: {exc}")
        elif words[0] == "make":
            for target in words[1:]:
                defined = re.search(rf"^{re.escape(target)}:", makefile, re.MULTILINE)
                assert defined, f"{block.id}: no make {target}"


JSON_BLOCKS = [b for b in BLOCKS if b.language == "json"]


@pytest.mark.parametrize("block", JSON_BLOCKS, ids=_ids(JSON_BLOCKS))
def test_a_json_example_parses(block: Block) -> None:
    value = json.loads(block.code)
    if block.title == "TOOLLOOP_MCP_SERVERS":
        from workers.mcp.config import parse_servers

        assert len(parse_servers(json.dumps(value))) == len(value)


def _routes() -> list[tuple[re.Pattern[str], set[str]]]:
    from orchestrator.api.app import create_app
    from orchestrator.settings import Settings

    schema = create_app(Settings(api_token=None)).openapi()
    routes = []
    for path, operations in schema["paths"].items():
        pattern = re.compile(re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)))
        routes.append((pattern, {method.upper() for method in operations}))
    return routes


CURLS = [b for b in SHELL if "curl " in b.code]


@pytest.mark.parametrize("block", CURLS, ids=_ids(CURLS))
def test_a_curl_example_names_a_route_of_the_api(block: Block) -> None:
    routes = _routes()
    for words in shell_commands(block):
        if words[0] != "curl":
            continue
        (url,) = [w for w in words if w.startswith("localhost:")]
        path = url.split("localhost:8000", 1)[1].split("?")[0]
        method = words[words.index("-X") + 1] if "-X" in words else ("POST" if "-d" in words else "GET")
        allowed = [methods for pattern, methods in routes if pattern.fullmatch(path)]
        assert allowed and method in allowed[0], f"{block.id}: the API has no {method} {path}"


APPS = _of("app")


@pytest.mark.parametrize("block", APPS, ids=_ids(APPS))
def test_an_app_example_is_served_by_the_test_it_names(block: Block) -> None:
    found = re.search(r"run by (?P<test>tests/\S+\.py)", block.marker or "")
    assert found, f"{block.id}: an app example names the test that serves it"
    test = (ROOT / found["test"]).read_text()
    assert block.page in test and f'"{block.title}"' in test, f"{found['test']} does not read {block.id}"


def test_few_examples_opt_out_and_each_says_why() -> None:
    skipped = [b for b in BLOCKS if b.kind == "skip"]
    assert all(re.fullmatch(r"skip \(.{8,}\)", b.marker or "") for b in skipped), _ids(skipped)
    assert len(skipped) <= MAX_SKIPPED, _ids(skipped)


def test_every_marker_is_known() -> None:
    kinds = {"python", "system", "cli", "app", "skip"}
    assert {b.id: b.kind for b in BLOCKS if b.kind not in kinds} == {}
    assert all(b.language == "python" for b in BLOCKS if b.kind in {"system", "app"})
    assert all(b.language == "bash" for b in BLOCKS if b.kind == "cli")
