"""MCP servers as a tool source, end to end (issue 18): a real MCP server written with the `mcp` SDK, over
stdio and over streamable HTTP; a real prefork worker serving its tools beside `@tool`s; a real
orchestrator playing the scripted `plan` model; `toolloop tools` / `toolloop call` as users run them.

One stack per transport (Redis, worker, orchestrator), its entries:
- `t`: every tool of the server, generous limits (a stdio session starts a Python server: about 2 s);
- `h`: only `hang`, a short hard limit;
- `late`: a server down when the worker starts (HTTP: nothing listens yet; stdio: it exits at once until a
  file exists), brought up by the first test.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.client.direct import call_tool
from orchestrator.client.redis_client import Client
from orchestrator.model import ToolMessage
from orchestrator.redis_server import RedisServer, find_free_port
from tests.support.e2e_processes import E2E_TOOLS, start_orchestrator
from tests.support.mcp_support import HttpMcpServer, catalogued, stdio_entry
from tests.support.plans import plan_prompt
from tests.support.processes import TOOLLOOP_BIN, WorkerHandle, start_worker
from tests.support.turns import assert_every_call_answered_once
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# The hung tool's limits: over stdio the call first starts the server (about 2 s) within its soft limit.
# Over stdio the pool process opens its session (starts the server) inside the call's time: on a loaded
# machine that alone can take seconds, and the hung call must still reach the server before its soft limit.
HANG_LIMITS = {"stdio": (10.0, 12.0), "http": (1.5, 3.0)}


@dataclass
class Stack:
    transport: str
    redis_url: str
    worker: WorkerHandle
    folder: Path
    bring_late_up: Any

    def call(self, tool: str, arguments: dict[str, Any], timeout_s: float = 30.0) -> Any:
        return call_tool(self.redis_url, tool, arguments, timeout_s=timeout_s)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "TOOLLOOP_REDIS_URL": self.redis_url}
        return subprocess.run(
            [str(TOOLLOOP_BIN), *args], capture_output=True, text=True, env=env, timeout=60, check=False
        )


@pytest.fixture(scope="module", params=["stdio", "http"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    transport: str = request.param
    folder = tmp_path_factory.mktemp(f"mcp-{transport}")
    env = {"MCP_TEST_EXTRA_FILE": str(folder / "extra.txt"), "MCP_TEST_MARK_DIR": str(folder)}
    soft, hard = HANG_LIMITS[transport]
    with RedisServer() as redis_server, ExitStack() as cleanup:
        # Started first, ready last: it needs no worker to start, and the processes start side by side.
        orchestrator = start_orchestrator(
            redis_server.url, env={"TOOLLOOP_MODEL": "scripted:plan"}, wait=False
        )
        cleanup.callback(orchestrator.stop)
        if transport == "http":
            server = cleanup.enter_context(HttpMcpServer(env))
            late = HttpMcpServer(env, port=find_free_port())
            cleanup.callback(late.stop)
            entries = [
                server.entry("t", soft_time_limit=10, time_limit=20),
                server.entry("h", include=["hang"], soft_time_limit=soft, time_limit=hard),
                late.entry("late", include=["echo"]),
            ]
            bring_late_up: Any = late.start
        else:
            flag = folder / "late-is-up"
            entries = [
                stdio_entry("t", env, soft_time_limit=10, time_limit=20),
                stdio_entry("h", env, include=["hang"], soft_time_limit=soft, time_limit=hard),
                stdio_entry("late", {**env, "MCP_TEST_REQUIRE_FILE": str(flag)}, include=["echo"]),
            ]
            bring_late_up = flag.touch
        worker = start_worker(
            redis_server.url, [E2E_TOOLS], env={"TOOLLOOP_MCP_SERVERS": json.dumps(entries)}, concurrency=2
        )
        cleanup.callback(worker.stop)
        orchestrator.wait_registered(redis_server.url)
        yield Stack(transport, redis_server.url, worker, folder, bring_late_up)


def test_a_server_down_at_start_is_reported_retried_and_published_once_up(stack: Stack) -> None:
    # On a loaded machine the start may also say the server "has not answered yet" (its wait ran out
    # first); "is down" is said once, whatever the retries in the background.
    def late_lines() -> list[str]:
        return [line for line in stack.worker.log_text().splitlines() if "MCP server 'late'" in line]

    wait_until(lambda: any("is down: " in line for line in late_lines()), "'late' reported down", 60)
    down = [line for line in late_lines() if "is down: " in line]
    assert len(down) == 1 and "WARNING" in down[0], late_lines()
    assert "retrying in the background" in down[0]
    wait_until(lambda: "t__echo" in catalogued(stack.redis_url, stack.worker.hostname), "t__echo listed", 60)
    tools = catalogued(stack.redis_url, stack.worker.hostname)
    assert "e2e_add" in tools and not [name for name in tools if "late" in name]
    # Meanwhile the worker serves its other tools, MCP and @tool alike.
    assert stack.call("t__echo", {"text": "still here"}).result == "still here"
    assert stack.call("e2e_add", {"a": 2, "b": 3}).result == 5
    stack.bring_late_up()
    wait_until(
        lambda: "late__echo" in catalogued(stack.redis_url, stack.worker.hostname), "late__echo listed", 60
    )
    assert stack.call("late__echo", {"text": "up"}).result == "up"


def test_the_tools_are_catalogued_with_their_schemas(stack: Stack) -> None:
    listed = stack.cli("tools", "--json")
    assert listed.returncode == 0, listed.stderr
    specs = {spec["name"]: spec for spec in json.loads(listed.stdout)}
    assert {"t__echo", "t__book", "t__meet", "t__hang", "t__fail", "t__weather", "h__hang"} <= set(specs)
    assert "h__echo" not in specs and "e2e_add" in specs
    book = specs["t__book"]
    assert book["description"] == "Book a trip for some travellers."
    assert (book["queue"], book["soft_time_limit_s"], book["time_limit_s"]) == ("mcp.t", 10, 20)
    trip = book["parameters"]["properties"]["trip"]
    assert book["parameters"]["required"] == ["trip"] and trip["required"] == ["destination", "travellers"]
    traveller = trip["properties"]["travellers"]["items"]
    age = {"type": "integer", "minimum": 0, "title": "Age", "description": "Age in years."}
    assert traveller["properties"]["age"] == age
    assert "$ref" not in json.dumps(book) and "$defs" not in json.dumps(book)
    assert specs["h__hang"]["time_limit_s"] == HANG_LIMITS[stack.transport][1]


def test_toolloop_call_runs_one(stack: Stack) -> None:
    ran = stack.cli("call", "t__weather", "--args", '{"city": "Paris"}')
    assert ran.returncode == 0, ran.stderr
    outcome = json.loads(ran.stdout)
    assert outcome["result"] == {"city": "Paris", "temperature_c": 21.5, "conditions": "sunny"}
    assert outcome["content"] == "It is 21.5 °C and sunny in Paris."
    # The server's schema is checked before dispatch: a trip without travellers never reaches a worker.
    refused = stack.cli("call", "t__book", "--args", '{"trip": {"destination": "Rome"}}')
    assert refused.returncode == 1
    assert json.loads(refused.stdout)["failure_kind"] == "validation" and "travellers" in refused.stdout
    trip = {"destination": "Rome", "travellers": [{"name": "Ada", "age": 36}], "nights": 2}
    assert stack.call("t__book", {"trip": trip}).result == "booked 2 night(s) in Rome for Ada (36)"
    failed = stack.call("t__fail", {"message": "disk full"})
    assert (failed.ok, failed.failure_kind) == (False, "execution_error")
    assert failed.error == "McpToolError: Error executing tool fail: disk full"


def test_a_turn_runs_mcp_calls_in_parallel_and_goes_on_after_a_hung_one(stack: Stack) -> None:
    client = Client(stack.redis_url)
    group = uuid.uuid4().hex
    try:
        turn_id = client.submit(
            prompt=plan_prompt(
                [
                    {
                        "calls": [
                            {"name": "t__meet", "arguments": {"label": "a", "group": group}},
                            {"name": "t__meet", "arguments": {"label": "b", "group": group}},
                        ]
                    },
                    {"calls": [{"name": "h__hang", "arguments": {}}]},
                    {"calls": [{"name": "t__echo", "arguments": {"text": "after the hang"}}]},
                    {"text": "done"},
                ]
            ),
            model="scripted:plan",
        )
        outcome = client.wait(turn_id, timeout=90)
    finally:
        client.close()
    assert outcome.status == "completed", outcome
    assert_every_call_answered_once(outcome.messages)
    answers = [m for m in outcome.messages if isinstance(m, ToolMessage)]
    assert [m.name for m in answers] == ["t__meet", "t__meet", "h__hang", "t__echo"]
    first, second, hung, after = answers
    # In parallel: each call waited (up to 20 s) until the other one ran too.
    met = [json.loads(m.content) for m in (first, second)]
    assert met == [{"label": "a", "met": True}, {"label": "b", "met": True}], (first, second)
    soft_s = HANG_LIMITS[stack.transport][0]
    assert (
        hung.is_error and hung.failure_kind == "timeout" and f"timed out after {soft_s:g} s" in hung.content
    )
    assert list(stack.folder.glob("hang-*")), "the hung call never reached the server"
    assert (after.is_error, after.content) == (False, "after the hang")


def test_a_changed_tool_list_is_published_and_served(stack: Stack) -> None:
    name = f"n{uuid.uuid4().hex[:6]}"
    (stack.folder / "extra.txt").write_text(f"{name}\n")
    tool = f"t__extra_{name}"
    wait_until(lambda: tool in catalogued(stack.redis_url, stack.worker.hostname), f"{tool} listed", 30)
    # The pool processes were forked before the tool existed: the one the call reaches builds its task.
    assert stack.call(tool, {}).result == name
