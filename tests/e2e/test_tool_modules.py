"""`TOOLLOOP_TOOL_MODULES=myapp.tools toolloop worker` run from the folder that holds `myapp`, as users do.

No PYTHONPATH: the worker imports tool modules from its current folder, as `celery -A` does. A module that
does not import, or defines a bad tool, stops the worker with a short error that names it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from orchestrator.client.direct import call_tool
from orchestrator.redis_server import RedisServer
from tests.support.processes import TOOLLOOP_BIN, WorkerHandle

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

GOOD_TOOLS = '''
from workers import tool


@tool(soft_time_limit=5, time_limit=10)
def {name}(text: str) -> str:
    """Say it backwards."""
    return text[::-1]
'''

BROKEN = {
    "missing dependency": (
        "import no_such_dependency_xyz\n",
        "ModuleNotFoundError",
        "no_such_dependency_xyz",
    ),
    "error at import": (
        "raise RuntimeError('settings missing')\n",
        "RuntimeError: settings missing",
        "line 1",
    ),
    "bad tool": (
        "from workers import tool\n\n\n@tool(soft_time_limit=5, time_limit=5)\ndef bad() -> int:\n"
        '    """Bad."""\n    return 1\n',
        "defines a bad tool: tool 'bad': soft_time_limit (5 s) must be less than time_limit (5 s)",
        "tools.py, line 4)",
    ),
    "syntax error": ("def broken(:\n", "SyntaxError", "tools.py"),
}


def write_package(folder: Path, source: str) -> str:
    """`<folder>/<unique package>/tools.py` holding `source`; returns the module's dotted name."""
    package = f"myapp_{uuid.uuid4().hex[:8]}"
    (folder / package).mkdir()
    (folder / package / "__init__.py").write_text("")
    (folder / package / "tools.py").write_text(source)
    return f"{package}.tools"


def worker_env(redis_url: str, module: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "TOOLLOOP_REDIS_URL": redis_url, "TOOLLOOP_TOOL_MODULES": module}


def test_a_worker_serves_a_tool_module_of_its_current_folder(
    module_redis: RedisServer, tmp_path: Path
) -> None:
    name = f"reverse_{uuid.uuid4().hex[:6]}"
    module = write_package(tmp_path, GOOD_TOOLS.format(name=name))
    hostname = f"cwd-{uuid.uuid4().hex[:8]}@localhost"
    log = Path(tempfile.mkstemp(prefix="toolloop-worker-", suffix=".log")[1])
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(TOOLLOOP_BIN), "worker", "--concurrency=1", f"--hostname={hostname}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=worker_env(module_redis.url, module),
            cwd=tmp_path,
            start_new_session=True,
        )
    handle = WorkerHandle(process, hostname, module_redis.url, log)
    try:
        handle.wait_ready()  # its catalogue entry lists the tool
        outcome = call_tool(module_redis.url, name, {"text": "abc"}, timeout_s=15)
        assert (outcome.ok, outcome.result, outcome.worker) == (True, "cba", hostname), outcome
    finally:
        handle.stop()
        log.unlink(missing_ok=True)


@pytest.mark.parametrize(("source", "error", "where"), list(BROKEN.values()), ids=list(BROKEN))
def test_a_broken_tool_module_stops_the_worker_with_a_short_named_error(
    module_redis: RedisServer, tmp_path: Path, source: str, error: str, where: str
) -> None:
    module = write_package(tmp_path, source)
    result = subprocess.run(
        [str(TOOLLOOP_BIN), "worker", "--concurrency=1"],
        capture_output=True,
        text=True,
        env=worker_env(module_redis.url, module),
        cwd=tmp_path,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"error: tool module '{module}' ")
    assert error in lines[0] and where in lines[0]


def test_a_tool_module_that_is_not_there_names_the_folder_it_looked_in(
    module_redis: RedisServer, tmp_path: Path
) -> None:
    result = subprocess.run(
        [str(TOOLLOOP_BIN), "worker"],
        capture_output=True,
        text=True,
        env=worker_env(module_redis.url, "nowhere_pkg.tools"),
        cwd=tmp_path,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: tool module 'nowhere_pkg.tools' did not import: ModuleNotFoundError: No module named "
        f"'nowhere_pkg' (looked in the current folder {tmp_path} and on sys.path)"
    )


def test_a_worker_refuses_a_queue_none_of_its_tools_uses(module_redis: RedisServer) -> None:
    result = subprocess.run(
        [str(TOOLLOOP_BIN), "worker", "--queues=tools"],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "TOOLLOOP_REDIS_URL": module_redis.url,
            "TOOLLOOP_TOOL_MODULES": "workers.examples",
        },
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: --queues tools: no tool of this worker uses that queue")
    assert "tool.add" in result.stderr and len(result.stderr.strip().splitlines()) == 1
