"""Model controls at submit and approvals with edits and reasons, over a real redis-server.

The Client, AsyncClient, HTTP API and CLI as a web app or a person uses them, in a database of their own. No
orchestrator runs: what is accepted stays queued, and an approval is read back from the turn's control
stream, where the orchestrator would read it (`store.codec.ControlRequest`).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from orchestrator import AsyncClient, Client
from orchestrator.errors import CallNotWaitingError
from orchestrator.settings import Settings
from orchestrator.store import operations
from orchestrator.store.codec import ControlRequest
from orchestrator.store.runner import SyncRunner
from tests.support.approvals import ahold_for_approval, hold_for_approval
from tests.support.processes import TOOLLOOP_BIN
from tests.support.store_db import empty_db_url
from workers import keys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CONTROLS_DB = 15


@pytest.fixture
def db_url(redis_url: str) -> str:
    return empty_db_url(redis_url, CONTROLS_DB)


@pytest.fixture
def client(db_url: str) -> Iterator[Client]:
    with Client(db_url) as sync_client:
        yield sync_client


def run_cli(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOOLLOOP_REDIS_URL": redis_url}
    return subprocess.run(
        [str(TOOLLOOP_BIN), *args], capture_output=True, text=True, env=env, timeout=30, check=False
    )


def stored(client: Client) -> int:
    return len(client.redis.keys(keys.turn_request("*")))


def read_control(client: Client, turn_id: str) -> list[ControlRequest]:
    """The turn's control stream, read with the operation the orchestrator reads it with."""
    return SyncRunner(client.redis).run(operations.read_control(turn_id, "0"))


# --- refused at submit ----------------------------------------------------------------------------------


def test_the_clients_refuse_a_setting_the_provider_cannot_honour_and_store_nothing(client: Client) -> None:
    with pytest.raises(ValueError, match=r"^model_settings\.seed: seed is not supported by openai_responses"):
        client.submit(prompt="x", model="openai_responses:gpt-x", model_settings={"seed": 3})
    with pytest.raises(ValueError, match=r"^output_schema: not a valid JSON Schema"):
        client.submit(prompt="x", output_schema={"type": "objekt"})
    assert stored(client) == 0
    turn_id = client.submit(prompt="x", model=["scripted:plan", "openai:gpt-x"], model_settings={"seed": 3})
    assert client.get(turn_id).request.model_settings.seed == 3


async def test_the_async_client_refuses_the_same(db_url: str) -> None:
    async with AsyncClient(db_url, settings=Settings(redis_url=db_url, model_smart="anthropic:c")) as aclient:
        with pytest.raises(ValueError, match=r"model_settings\.seed: seed is not supported by anthropic"):
            await aclient.submit(prompt="x", model="smart", model_settings={"seed": 3})
        turn_id = await aclient.submit(prompt="x", model="fast", model_settings={"seed": 3})  # not known here
        assert (await aclient.get(turn_id)).request.model == "fast"


def test_the_api_schema_shows_the_fields_and_422s_name_the_field(api: httpx.Client) -> None:
    document = api.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    turn = schemas["TurnBody"]["properties"]
    assert {"instructions", "model_settings", "output_schema", "model"} <= set(turn)
    assert {"type": "array", "items": {"type": "string"}} in turn["model"]["anyOf"]
    assert set(schemas["ModelSettings"]["properties"]) == {
        *("temperature", "top_p", "max_output_tokens", "stop", "seed"),
        *("reasoning_effort", "parallel_tool_calls", "extra"),
    }
    assert set(schemas["ApprovalBody"]["properties"]) == {"approved", "arguments", "reason", "decided_by"}
    refused = api.post(
        "/v1/turns",
        json={"prompt": "x", "model": "anthropic:c", "model_settings": {"seed": 1, "stop": ["a"]}},
    )
    assert refused.status_code == 422
    (error,) = refused.json()["detail"]
    assert error == {
        "type": "unsupported_setting",
        "loc": ["body", "model_settings", "seed"],
        "msg": "seed is not supported by anthropic (model anthropic:c)",
    }
    schema = api.post("/v1/turns", json={"prompt": "x", "output_schema": {"type": "objekt"}})
    assert schema.status_code == 422
    assert schema.json()["detail"][0]["loc"] == ["body", "output_schema"]
    assert schema.json()["detail"][0]["type"] == "invalid_schema"
    typo = api.post("/v1/turns", json={"prompt": "x", "model_settings": {"temprature": 1}})
    assert typo.status_code == 422
    assert typo.json()["detail"][0]["loc"] == ["body", "model_settings", "temprature"]
    accepted = api.post(
        "/v1/turns", json={"prompt": "x", "model": ["scripted:plan"], "instructions": "Be kind."}
    )
    assert accepted.status_code == 202


def test_the_cli_exits_2_with_one_line(db_url: str, client: Client) -> None:
    done = run_cli(db_url, "submit", "--prompt", "x", "--model", "anthropic:c", "--seed", "1")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: model_settings.seed: seed is not supported by anthropic (model anthropic:c)\n"
    )
    bad = run_cli(db_url, "submit", "--prompt", "x", "--output-schema", '{"type": 3}')
    assert bad.returncode == 2 and bad.stderr.startswith("error: output_schema: not a valid JSON Schema")
    effort = run_cli(db_url, "submit", "--prompt", "x", "--reasoning-effort", "max")
    assert effort.returncode == 2 and "reasoning_effort" in effort.stderr and "Traceback" not in effort.stderr
    assert stored(client) == 0
    queued = run_cli(db_url, "submit", "--prompt", "x", "--model", "scripted:a", "--model", "scripted:b")
    assert queued.returncode == 0, queued.stderr
    assert client.get(queued.stdout.strip()).request.model == ["scripted:a", "scripted:b"]


# --- approvals with edits and reasons -------------------------------------------------------------------


async def test_an_approval_carries_its_edited_arguments_and_a_denial_its_reason(
    client: Client, db_url: str
) -> None:
    turn_id = client.submit(prompt="x")
    async with AsyncClient(db_url) as aclient:
        first, second, third, fourth = await ahold_for_approval(aclient.store, turn_id, 4)
        assert await aclient.approve(turn_id, second, False, reason="not today")
        with pytest.raises(ValueError, match="a denial says why"):
            await aclient.approve(turn_id, third, False, arguments={"amount": 1})
    assert client.approve(turn_id, first, True, arguments={"amount": 5, "to": "bob"})
    assert client.approve(turn_id, third, True)
    controls = read_control(client, turn_id)
    shown = [(c.call_id, c.approved, c.arguments, c.reason) for c in controls]
    assert shown == [
        (second, False, None, "not today"),
        (first, True, {"amount": 5, "to": "bob"}, None),
        (third, True, None, None),
    ]
    with pytest.raises(ValueError, match="not a JSON number"):
        client.approve(turn_id, fourth, True, arguments={"amount": float("inf")})


def test_only_a_call_the_turn_waits_on_takes_an_answer_and_the_first_answer_stands(
    api: httpx.Client, client: Client, db_url: str
) -> None:
    queued = client.submit(prompt="x")
    with pytest.raises(CallNotWaitingError, match="no call with this id waits"):
        client.approve(queued, "call_0", True)  # nothing waits on a turn no orchestrator has started
    turn_id = client.submit(prompt="x")
    (waiting,) = hold_for_approval(db_url, turn_id, 1)
    with pytest.raises(CallNotWaitingError, match="no call with this id waits"):
        client.approve(turn_id, "call_bogus", True, arguments={"id": 5})
    unknown = api.post(f"/v1/turns/{turn_id}/approvals/call_bogus", json={"approved": True})
    assert unknown.status_code == 409 and "is not waiting for approval" in unknown.json()["detail"]
    assert client.approve(turn_id, waiting, True, arguments={"id": 1})
    # Before the orchestrator has read the first answer, a second one is refused: the first stands.
    with pytest.raises(CallNotWaitingError, match="decided already"):
        client.approve(turn_id, waiting, False, reason="changed my mind")
    again = run_cli(db_url, "approve", turn_id, waiting, "--arguments", json.dumps({"id": 2}))
    assert again.returncode == 1 and "decided already" in again.stderr and again.stdout == ""
    assert [(c.call_id, c.approved, c.arguments) for c in read_control(client, turn_id)] == [
        (waiting, True, {"id": 1})
    ]


def test_the_api_and_the_cli_carry_them_too(api: httpx.Client, client: Client, db_url: str) -> None:
    turn_id = client.submit(prompt="x")
    c1, c2, c3, c4, c5, c6 = hold_for_approval(db_url, turn_id, 6)
    edited = api.post(f"/v1/turns/{turn_id}/approvals/{c1}", json={"approved": True, "arguments": {"n": 1}})
    assert edited.status_code == 202, edited.text
    denied = api.post(f"/v1/turns/{turn_id}/approvals/{c2}", json={"approved": False, "reason": "no"})
    assert denied.status_code == 202
    extra = api.post(f"/v1/turns/{turn_id}/approvals/{c3}", json={"approved": True, "why": "x"})
    assert extra.status_code == 422
    both = api.post(f"/v1/turns/{turn_id}/approvals/{c3}", json={"approved": False, "arguments": {}})
    assert both.status_code == 422 and both.json()["detail"][0]["loc"] == ["body", "arguments"]
    assert api.post("/v1/turns/turn_none/approvals/c", json={"approved": True}).status_code == 404
    cli = run_cli(db_url, "approve", turn_id, c4, "--arguments", json.dumps({"n": 2}))
    assert (cli.returncode, cli.stdout) == (0, "approved\n"), cli.stderr
    cli_deny = run_cli(db_url, "approve", turn_id, c5, "--deny", "--reason", "too much")
    assert (cli_deny.returncode, cli_deny.stdout) == (0, "denied\n")
    usage = run_cli(db_url, "approve", turn_id, c6, "--deny", "--arguments", "{}")
    assert usage.returncode == 2 and usage.stderr.startswith("error: --arguments edit an approved call")
    not_json = run_cli(db_url, "approve", turn_id, c6, "--arguments", "[1]")
    assert not_json.returncode == 2 and "must be a JSON object" in not_json.stderr
    unknown = run_cli(db_url, "approve", "turn_none", "c")
    assert unknown.returncode == 1 and unknown.stderr == "error: unknown turn 'turn_none'\n"
    controls = read_control(client, turn_id)
    shown = [(c.call_id, c.approved, c.arguments, c.reason) for c in controls]
    assert shown == [
        (c1, True, {"n": 1}, None),
        (c2, False, None, "no"),
        (c4, True, {"n": 2}, None),
        (c5, False, None, "too much"),
    ]
