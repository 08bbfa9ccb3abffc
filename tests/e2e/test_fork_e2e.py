"""Forking a turn on real processes (issue 33 item 4): a Redis of the module's own, a prefork worker serving
the e2e tools, `toolloop orchestrator` calling the scripted `plan` model over HTTP (`RecordingModelServer`,
which keeps every request), `toolloop api` with tenants' keys, and `toolloop fork`.

A turn calls `e2e_add`, then answers with the result; a fork at the tool result's index with an edited result
runs on from there: its one model request carries the edit, its answer is the edited result, no tool runs
again, and the original's messages and outcome are as before. Also: a fork with another model and its own
instructions (seen at the model server), a fork of a turn still waiting for an approval, the links both ways
(the views, and the turn pages in Chromium), the errors, and the same over HTTP (a tenant forks only its own
turns) and on the command line.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator import AsyncClient, HttpClient
from orchestrator.client.redis_client import Client, UnknownTurnError
from orchestrator.errors import ApiAuthError
from orchestrator.model import ForkedFrom, ToolMessage, TurnOutcome
from orchestrator.redis_server import RedisServer
from tests.support import served
from tests.support.browser import open_chromium
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle
from tests.support.plans import marked_plan_prompt
from tests.support.processes import TOOLLOOP_BIN
from tests.support.turns import event_data, wait_outcome
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

ACME_KEY = "fork-acme-key-7d1e"
OTHER_KEY = "fork-other-key-2b9c"
READER_KEY = "fork-reader-key-51aa"
KEYS = {
    ACME_KEY: {"tenant": "acme", "scopes": ["submit", "read"]},
    OTHER_KEY: {"tenant": "other", "scopes": ["submit", "read"]},
    READER_KEY: {"tenant": "acme", "scopes": ["read"]},
}
ADD_PLAN = [{"calls": [{"name": "e2e_add", "arguments": {"a": 2, "b": 3}}]}]
# The original's messages: 0 the plan, 1 the call, 2 its result, 3 the answer.
RESULT_AT = 2


@pytest.fixture(scope="module", autouse=True)
def running(orchestrator_process: OrchestratorHandle) -> OrchestratorHandle:
    return orchestrator_process


@pytest.fixture(scope="module")
def api_url(module_redis: RedisServer) -> Iterator[str]:
    with served.serving_api(module_redis.url, env={"TOOLLOOP_API_KEYS": json.dumps(KEYS)}) as base:
        yield base


def requests_with(server: RecordingModelServer, marker: str) -> list[dict[str, Any]]:
    return [r for r in server.requests() if marker in json.dumps(r)]


def edited_result(outcome: TurnOutcome, content: str) -> dict[str, Any]:
    original = outcome.messages[RESULT_AT]
    assert isinstance(original, ToolMessage)
    return {"role": "tool", "tool_call_id": original.tool_call_id, "name": original.name, "content": content}


def run_original(client: Client, tenant: str | None = None) -> tuple[str, str, TurnOutcome]:
    prompt, marker = marked_plan_prompt(ADD_PLAN)
    turn_id = client.submit(prompt=prompt, tools=["e2e_add"], model="scripted:plan", tenant=tenant)
    outcome = wait_outcome(client, turn_id)
    assert outcome.status == "completed" and "→ 5" in (outcome.text or "")
    assert [m.role for m in outcome.messages] == ["user", "assistant", "tool", "assistant"]
    return turn_id, marker, outcome


def test_a_fork_at_an_edited_tool_result_runs_on_with_the_edit_and_leaves_the_original_as_it_was(
    client: Client, model_server: RecordingModelServer, module_redis_client: Any
) -> None:
    original, marker, outcome = run_original(client)
    before = client.get(original)
    assert before.forks == []

    fork = client.fork(original, RESULT_AT, replace=edited_result(outcome, "42"))

    forked = wait_outcome(client, fork)
    assert forked.status == "completed"
    assert "e2e_add(a=2, b=3) → 42" in (forked.text or "") and "→ 5" not in (forked.text or "")
    assert forked.messages[:RESULT_AT] == outcome.messages[:RESULT_AT]
    assert forked.messages[RESULT_AT].model_dump() == {
        **outcome.messages[RESULT_AT].model_dump(),
        "content": "42",
    }
    # One model call, whose request carries the edit (and the original's call, not a new one); no tool ran.
    requests = requests_with(model_server, marker)
    assert len(requests) == 3  # the original's two, the fork's one
    tool_messages = [m for m in requests[-1]["messages"] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["42"]
    assert forked.llm_calls == 1 and forked.tool_executions == 0
    assert event_data(module_redis_client, fork, "tool_dispatched") == []

    # The original is untouched: its messages and outcome as before; the two link to each other.
    after = client.get(original)
    assert after.messages == before.messages and after.outcome == before.outcome
    assert [(link.turn_id, link.at) for link in after.forks] == [(fork, RESULT_AT)]
    assert client.get(fork).request.forked_from == ForkedFrom(turn_id=original, at=RESULT_AT)
    assert client.get(fork).forks == []


def test_a_fork_with_another_model_and_instructions_re_runs_from_message_k(
    client: Client, model_server: RecordingModelServer
) -> None:
    original, marker, outcome = run_original(client)

    # At 0 without a replacement: the plan again, answered by another model under the fork's instructions.
    fork = client.fork(original, 0, model="scripted:plan-b", instructions="Answer in one line.")

    forked = wait_outcome(client, fork)
    assert forked.status == "completed" and "→ 5" in (forked.text or "")
    assert forked.tool_executions == 1  # re-run from message 0: the call runs again, as the fork's own
    fork_requests = requests_with(model_server, marker)[2:]
    assert [r["model"] for r in fork_requests] == ["plan-b", "plan-b"]
    assert all(
        r["messages"][0] == {"role": "system", "content": "Answer in one line."} for r in fork_requests
    )
    assert client.get(original).outcome == outcome
    assert [link.turn_id for link in client.get(original).forks] == [fork]


def test_a_turn_waiting_for_an_approval_is_forked_from_what_is_stored_of_it(client: Client) -> None:
    plan = [*ADD_PLAN, {"calls": [{"name": "e2e_transfer", "arguments": {"amount": 5, "to": "bob"}}]}]
    prompt, _ = marked_plan_prompt(plan)
    original = client.submit(prompt=prompt, tools=["e2e_add", "e2e_transfer"], model="scripted:plan")
    waiting = wait_for(lambda: v if (v := client.get(original)).pending_approvals else None, "the approval")
    assert waiting.status.value == "waiting" and len(waiting.messages) == 3  # round one stored, two waiting
    edited = edited_result(TurnOutcome(turn_id=original, status="completed", messages=waiting.messages), "40")

    async def fork_async() -> str:
        async with AsyncClient(client.redis_url) as async_client:
            return await async_client.fork(original, RESULT_AT, replace=edited)

    fork = asyncio.run(fork_async())

    # The fork plays on from its own history: the transfer waits for its own approval.
    pending = wait_for(lambda: client.get(fork).pending_approvals or None, "the fork's approval")
    assert client.approve(fork, pending[0].call_id, True)
    forked = wait_outcome(client, fork)
    assert forked.status == "completed" and "→ 40" in (forked.text or "")
    assert client.get(original).status.value == "waiting"  # the original still waits for its person
    assert client.cancel(original)
    assert wait_outcome(client, original).status == "cancelled"


def test_a_fork_that_does_not_fit_is_refused_and_links_nothing(client: Client) -> None:
    original, _, outcome = run_original(client)
    with pytest.raises(ValueError, match="at: 4 is out of range: the turn has 4 messages"):
        client.fork(original, 4)
    with pytest.raises(ValueError, match="replace: not a message"):
        client.fork(original, RESULT_AT, replace={"role": "tool", "content": "no call"})
    wrong = {**edited_result(outcome, "1"), "tool_call_id": "call_nobody"}
    with pytest.raises(ValueError, match="tool_call_id 'call_nobody' answers no call waiting at message 2"):
        client.fork(original, RESULT_AT, replace=wrong)
    with pytest.raises(ValueError, match="message 3 would be a assistant message"):
        client.fork(original, 3)
    with pytest.raises(UnknownTurnError):
        client.fork("turn_never_submitted", 0)
    assert client.get(original).forks == []


def test_over_http_a_tenant_forks_its_own_turns(api_url: str, client: Client) -> None:
    with HttpClient(api_url, token=ACME_KEY) as acme:
        prompt, _ = marked_plan_prompt(ADD_PLAN)
        original = acme.submit(prompt=prompt, tools=["e2e_add"], model="scripted:plan")
        outcome = acme.wait(original, timeout=60)
        fork = acme.fork(original, RESULT_AT, replace=edited_result(outcome, "7"), fork_id=f"{original}-f")
        assert fork == f"{original}-f"
        # Sent again with its id (a retry after a lost answer): the same fork, stored and linked once.
        assert acme.fork(original, RESULT_AT, replace=edited_result(outcome, "7"), fork_id=fork) == fork
        forked = acme.wait(fork, timeout=60)
        assert forked.status == "completed" and "→ 7" in (forked.text or "")
        view = acme.get(fork)
        assert view.tenant == "acme" and view.request.forked_from == ForkedFrom(
            turn_id=original, at=RESULT_AT
        )
        assert [(link.turn_id, link.at) for link in acme.get(original).forks] == [(fork, RESULT_AT)]
        with pytest.raises(ValueError, match="at: 9 is out of range"):
            acme.fork(original, 9)
        with pytest.raises(ValueError, match=r"fork_id: turn id .* is another turn's"):
            acme.fork(original, 0, fork_id=original)
        with pytest.raises(UnknownTurnError):
            acme.fork("turn_never_submitted", 0)
    with HttpClient(api_url, token=OTHER_KEY) as other, pytest.raises(UnknownTurnError):
        other.fork(original, 0)  # another tenant's turn is not there for this key
    with HttpClient(api_url, token=READER_KEY) as reader, pytest.raises(ApiAuthError):
        reader.fork(original, 0)  # forking is submitting
    headers = {"Authorization": f"Bearer {ACME_KEY}"}
    refused = httpx.post(f"{api_url}/v1/turns/{original}/fork", json={"at": -1}, headers=headers, timeout=10)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "at"]
    bad = {"at": 2, "replace": {"role": "robot"}}
    assert (
        httpx.post(f"{api_url}/v1/turns/{original}/fork", json=bad, headers=headers, timeout=10).status_code
        == 422
    )
    assert [link.turn_id for link in client.get(original).forks] == [fork]


def test_toolloop_fork_prints_the_forks_id_and_ends_with_the_codes_of_its_failures(
    client: Client, module_redis: RedisServer, tmp_path: Path
) -> None:
    original, _, outcome = run_original(client)
    replace = tmp_path / "result.json"
    replace.write_text(json.dumps(edited_result(outcome, "11")))
    env = {**os.environ, "TOOLLOOP_REDIS_URL": module_redis.url}

    def fork(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(TOOLLOOP_BIN), "fork", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)

    done = fork(original, "--at", str(RESULT_AT), "--replace", f"@{replace}")
    assert done.returncode == 0, done.stderr
    fork_id = done.stdout.strip()
    forked = wait_outcome(client, fork_id)
    assert "→ 11" in (forked.text or "")
    assert client.get(fork_id).request.forked_from == ForkedFrom(turn_id=original, at=RESULT_AT)

    unknown = fork("turn_never_submitted", "--at", "0")
    assert unknown.returncode == 1 and unknown.stderr.startswith("error: unknown turn")
    out_of_range = fork(original, "--at", "7")
    assert out_of_range.returncode == 2 and "at: 7 is out of range" in out_of_range.stderr
    not_json = fork(original, "--at", "2", "--replace", "{not json")
    assert not_json.returncode == 2 and "--replace is not valid JSON" in not_json.stderr
    not_message = fork(original, "--at", "2", "--replace", '{"role": "robot"}')
    assert not_message.returncode == 2 and "replace: not a message" in not_message.stderr
    assert "Traceback" not in unknown.stderr + out_of_range.stderr + not_json.stderr + not_message.stderr
    assert [link.turn_id for link in client.get(original).forks] == [fork_id]


def test_the_turn_pages_link_a_fork_and_its_original(api_url: str, client: Client, tmp_path: Path) -> None:
    original, _, outcome = run_original(client, tenant="acme")
    fork = client.fork(original, RESULT_AT, replace=edited_result(outcome, "8"))
    wait_outcome(client, fork)
    with open_chromium(tmp_path / "profile") as browser:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        refused = page.goto(f"{api_url}/ui/turns/{fork}")
        assert refused is not None and refused.status == 401
        page.locator("#key").fill(READER_KEY)
        with page.expect_navigation():
            page.locator("#sign-in button[type=submit]").click()
        links = page.locator("#turn-links")
        links.wait_for(state="visible", timeout=30_000)
        assert links.inner_text() == f"forked from {original} at message {RESULT_AT}"
        page.locator("#turn-links a").click()
        page.wait_for_url(f"{api_url}/ui/turns/{original}", timeout=30_000)
        links.wait_for(state="visible", timeout=30_000)
        assert links.inner_text() == f"forks: {fork} (at message {RESULT_AT})"
        assert errors == []
