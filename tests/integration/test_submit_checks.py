"""Refusing at submit what cannot run as asked, and direct calls of a tool that requires confirmation.

A real redis-server, a real prefork worker serving `tests.support.tools` (with its sensitive `secret_tool`)
and `tests.support.e2e_tools` (with `e2e_transfer`, which requires confirmation), in a database of their
own, and the Client, AsyncClient, HTTP API and CLI as a web app or a person uses them. No orchestrator runs:
what is accepted stays queued.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest
import redis

from orchestrator import AsyncClient, Client
from orchestrator.errors import ModelConfigError, UnknownToolError
from orchestrator.settings import Settings
from tests.support.api_server import api_client
from tests.support.e2e_tools import COUNTER_PREFIX
from tests.support.processes import TOOLLOOP_BIN, start_worker
from tests.support.store_db import store_db_url
from workers import keys
from workers.contract import FailureKind

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SERVED_DB = 12  # a worker has published its catalogue here
EMPTY_DB = 13  # no worker ever published here


def fresh_url(redis_url: str, db: int) -> str:
    url = store_db_url(redis_url, db)
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    return url


@pytest.fixture(scope="module")
def served_url(redis_url: str) -> Iterator[str]:
    url = fresh_url(redis_url, SERVED_DB)
    handle = start_worker(url, ["tests.support.tools", "tests.support.e2e_tools"], concurrency=1)
    yield url
    handle.stop()


@pytest.fixture
def client(served_url: str) -> Iterator[Client]:
    with Client(served_url) as sync_client:
        yield sync_client


def stored_turns(client: Client) -> list[bytes]:
    return sorted(client.redis.keys(keys.turn_request("*")))


def run_cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOOLLOOP_REDIS_URL": redis_url}
    return subprocess.run(
        [str(TOOLLOOP_BIN), *args], capture_output=True, text=True, env=env, timeout=30, check=False
    )


def test_tools_no_live_worker_serves_are_refused_and_nothing_is_stored(client: Client) -> None:
    before = (stored_turns(client), client.redis.llen(keys.TURN_QUEUE))
    with pytest.raises(UnknownToolError) as refused:
        client.submit(prompt="2+2?", tools=["echo", "ecoh"])
    available = refused.value.available
    assert refused.value.unknown == ["ecoh"] and available == sorted(available)
    assert str(refused.value) == (
        f"unknown tool 'ecoh' (did you mean 'echo'?) in 'tools'; available: {', '.join(available)}"
    )
    assert {"echo", "boom", "e2e_transfer"} <= set(available) and "secret_tool" not in available
    assert (stored_turns(client), client.redis.llen(keys.TURN_QUEUE)) == before
    # Known tools, and a sensitive one because the turn names it, are accepted.
    turn_id = client.submit(prompt="go", tools=["echo", "secret_tool"])
    assert client.get(turn_id).request.tools == ["echo", "secret_tool"]


def test_a_prompt_past_the_input_limit_is_refused_and_nothing_is_stored(client: Client) -> None:
    # A 30 MB prompt from a Client (the API already capped bodies at 1 MiB) held an orchestrator's loop for a
    # minute, every other turn waiting behind it.
    before = (stored_turns(client), client.redis.llen(keys.TURN_QUEUE))
    with pytest.raises(ValueError, match="prompt and messages are 1048577 bytes, over the 1048576 allowed"):
        client.submit(prompt="z" * (1024 * 1024 + 1))
    big = [{"role": "user", "content": "y" * (1024 * 1024)}]
    with pytest.raises(ValueError, match="over the 1048576 allowed"):
        client.submit(prompt="and this?", messages=big)
    assert (stored_turns(client), client.redis.llen(keys.TURN_QUEUE)) == before
    assert client.submit(prompt="z" * (1024 * 1024))  # at the limit: taken


async def test_the_async_client_refuses_the_same(served_url: str) -> None:
    async with AsyncClient(served_url) as aclient:
        with pytest.raises(UnknownToolError, match="unknown tool 'nope'"):
            await aclient.submit(prompt="x", tools=["nope"])
        with pytest.raises(ModelConfigError, match="neither `provider:model`"):
            await aclient.submit(prompt="x", model="gpt-4")
        assert await aclient.submit(prompt="x", tools=["echo"], model="smart")


def test_tools_are_checked_once_a_worker_has_published_its_catalogue(redis_url: str) -> None:
    # The rule for a fresh deployment: tools cannot be checked before a catalogue exists, so the turn is
    # kept, queued, for an orchestrator to start once workers are up; from then on they are checked.
    url = fresh_url(redis_url, EMPTY_DB)
    with Client(url) as fresh:
        turn_id = fresh.submit(prompt="2+2?", tools=["echo", "not_yet_known"])
        assert fresh.get(turn_id).request.tools == ["echo", "not_yet_known"]
        assert fresh.redis.llen(keys.TURN_QUEUE) == 1
        handle = start_worker(url, ["tests.support.tools"], concurrency=1)
        try:
            with pytest.raises(UnknownToolError, match="unknown tool 'not_yet_known'"):
                fresh.submit(prompt="2+2?", tools=["echo", "not_yet_known"])
        finally:
            handle.stop()
        assert fresh.redis.llen(keys.TURN_QUEUE) == 1


@pytest.mark.parametrize(
    ("model", "message"),
    [("gpt-4", "neither `provider:model`"), ("nowhere:x", "unknown provider 'nowhere'")],
)
def test_a_model_name_no_orchestrator_can_serve_is_refused(client: Client, model: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        client.submit(prompt="x", model=model)


def test_the_api_answers_422_listing_public_tools(served_url: str) -> None:
    with api_client(Settings(redis_url=served_url)) as http:
        reply = http.post("/v1/turns", json={"prompt": "2+3?", "tools": ["echo", "addd"]})
        assert reply.status_code == 422, reply.text
        (error,) = reply.json()["detail"]
        assert (error["type"], error["loc"]) == ("unknown_tool", ["body", "tools", 1])
        available = error["ctx"]["available"]
        assert error["msg"] == f"unknown tool 'addd'; available: {', '.join(available)}"
        assert "echo" in available and "secret_tool" not in reply.text
        model = http.post("/v1/turns", json={"prompt": "2+3?", "model": "gpt4"})
        assert model.status_code == 422 and model.json()["detail"][0]["loc"] == ["body", "model"]
        assert http.post("/v1/turns", json={"prompt": "2+3?", "tools": ["echo"]}).status_code == 202


@pytest.mark.parametrize(
    "tools", [["--tools", "echo,ecoh"], ["--tools", "ecoh", "--tools", "echo"]], ids=["commas", "repeated"]
)
def test_the_cli_exits_2_naming_the_unknown_tool(served_url: str, tools: list[str]) -> None:
    # Repeated, the option adds to the list (the first `--tools ecoh` is not dropped for the last).
    done = run_cli(served_url, "submit", "--prompt", "2+3?", *tools)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: unknown tool 'ecoh' (did you mean 'echo'?) in 'tools'; available: ")
    assert "echo" in done.stderr and "secret_tool" not in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


# --- direct calls of a tool that requires confirmation ----------------------------------------------------


def transfers_to(client: Client, to: str) -> int:
    return int(client.redis.get(f"{COUNTER_PREFIX}transfer:{to}") or 0)


def test_call_tool_runs_a_confirmed_tool_only_when_the_caller_approves(client: Client) -> None:
    refused = client.call_tool("e2e_transfer", {"amount": 5, "to": "sync"}, timeout_s=10)
    assert (refused.ok, refused.failure_kind, refused.attempts) == (False, FailureKind.CONFIRMATION_DENIED, 0)
    assert "approve=True" in refused.content and refused.worker is None
    assert transfers_to(client, "sync") == 0  # nothing was dispatched
    approved = client.call_tool("e2e_transfer", {"amount": 5, "to": "sync"}, timeout_s=10, approve=True)
    assert approved.ok and approved.result == "sent 5.0 to sync"
    assert transfers_to(client, "sync") == 1


async def test_async_call_tool_asks_for_the_same_approval(served_url: str, client: Client) -> None:
    async with AsyncClient(served_url) as aclient:
        refused = await aclient.call_tool("e2e_transfer", {"amount": 1, "to": "async"}, timeout_s=10)
        assert refused.failure_kind is FailureKind.CONFIRMATION_DENIED
        approved = await aclient.call_tool("e2e_transfer", {"amount": 1, "to": "async"}, 10, approve=True)
    assert approved.ok and transfers_to(client, "async") == 1


def test_toolloop_call_needs_approve_for_a_confirmed_tool(served_url: str, client: Client) -> None:
    arguments = json.dumps({"amount": 2, "to": "cli"})
    refused = run_cli(served_url, "call", "e2e_transfer", "--args", arguments)
    assert refused.returncode == 1, refused.stderr
    envelope = json.loads(refused.stdout)
    assert envelope["failure_kind"] == "confirmation_denied" and "--approve" in envelope["content"]
    assert transfers_to(client, "cli") == 0
    approved = run_cli(served_url, "call", "e2e_transfer", "--args", arguments, "--approve")
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["result"] == "sent 2.0 to cli" and transfers_to(client, "cli") == 1
