"""Hostile models mid-turn: a tool name that reaches for a sensitive tool outside the turn's allowlist, and
provider bodies that are garbage. Whole system (`FaultEnv`): Redis, `toolloop worker`, `toolloop orchestrator`
reaching its model over HTTP — the scripted one, or here a server that answers garbage.

- Allowlist: the call is answered `not_allowed`/`not_found`, the sensitive tool never runs and is never
  offered (listed) to the model.
- Garbage: the turn ends `failed`/`provider_error` with a clear message; the orchestrator stays up.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from orchestrator.model import ToolMessage
from tests.faults.env import PLAN_MODEL, FaultEnv, call, check_turn, is_running
from tests.hostile.hostile_tools import RUNS
from tests.support.turns import turn_events
from workers.contract import FailureKind

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

HOSTILE_MODULES = ("tests.faults.fault_tools", "tests.hostile.hostile_tools")
REFUSED = {FailureKind.NOT_ALLOWED, FailureKind.NOT_FOUND}


@pytest.fixture(scope="module")
def env() -> Iterator[FaultEnv]:
    with FaultEnv() as fault_env:
        fault_env.start_worker(concurrency=2, modules=HOSTILE_MODULES)
        fault_env.start_orchestrator()
        yield fault_env


SNEAKY_NAMES = [
    "delete_file",
    "delete_file<|channel|>commentary",
    "delete_file<|constrain|>json",
    "transfer_funds",
    "transfer_funds<|channel|>x",
    "DELETE_FILE",
    " delete_file",
    "delete_file ",
    "tool.delete_file",
    "functions.delete_file",
    "delete_file\u200b",
    "../delete_file",
]


def test_sensitive_tools_outside_the_allowlist_never_run(env: FaultEnv) -> None:
    calls = [call(name, path="/etc/passwd", amount=1e6, to="mallory") for name in SNEAKY_NAMES]
    calls.append(call("fault_work", tag="allowed", seconds=0.0))
    turn_id = env.submit(calls, tools=["fault_work"])
    outcome = env.client.wait(turn_id, 60)
    check_turn(outcome)
    answers = [m for m in outcome.messages if isinstance(m, ToolMessage)]
    assert len(answers) == len(calls)
    for answer in answers:
        if answer.name == "fault_work":
            assert not answer.is_error
            continue
        assert answer.is_error and answer.failure_kind in REFUSED, (answer.name, answer.content)
        assert "deleted" not in answer.content and "sent" not in answer.content
    assert env.redis.get(RUNS + "delete_file") is None
    assert env.redis.get(RUNS + "transfer_funds") is None
    # Never listed: not offered to the model, and not named in any refusal as an available tool.
    started = next(e for e in turn_events(env.redis, turn_id) if e["name"] == "turn_started")
    assert started["data"]["tools"] == ["fault_work"]
    for answer in answers:
        if answer.is_error and "available" in answer.content:
            assert "delete_file" not in answer.content.split("available", 1)[1]
            assert "transfer_funds" not in answer.content.split("available", 1)[1]


def test_a_turn_with_no_allowlist_is_not_offered_sensitive_tools(env: FaultEnv) -> None:
    turn_id = env.client.submit(
        prompt=json.dumps({"plan": [{"calls": [call("delete_file", path="/")]}]}), model=PLAN_MODEL
    )
    outcome = env.client.wait(turn_id, 60)
    check_turn(outcome)
    (answer,) = [m for m in outcome.messages if isinstance(m, ToolMessage)]
    assert answer.is_error and answer.failure_kind in REFUSED
    started = next(e for e in turn_events(env.redis, turn_id) if e["name"] == "turn_started")
    assert "delete_file" not in started["data"]["tools"]
    assert "transfer_funds" not in started["data"]["tools"]
    assert env.redis.get(RUNS + "delete_file") is None


# --- malformed provider bodies -----------------------------------------------------------------------

GARBAGE: dict[str, tuple[int, str, bytes]] = {
    "html": (200, "text/html", b"<html><body>502 Bad Gateway</body></html>"),
    "truncated": (
        200,
        "application/json",
        b'{"id": "x", "choices": [{"message": {"role": "assistant", "cont',
    ),
    "no-choices": (200, "application/json", b'{"id": "x", "object": "chat.completion"}'),
    "wrong-types": (200, "application/json", b'{"choices": "many", "usage": [1, 2]}'),
    "null": (200, "application/json", b"null"),
    "empty": (200, "application/json", b""),
    "not-utf8": (200, "application/json", b'{"choices": [{"message": {"content": "\xff\xfe"}}]}'),
    "error-garbage": (400, "application/json", b"\x00\x01 not an error body"),
}


class _GarbageModel(BaseHTTPRequestHandler):
    """First call of a turn: a valid tool call. Any later call: the garbage its model name asks for."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        kind = str(body["model"]).removeprefix("garbage-")
        if not any(m.get("role") == "tool" for m in body["messages"]):
            tool_call: dict[str, Any] = {"id": f"call_{id(body)}", "type": "function"}
            tool_call["function"] = {
                "name": "fault_work",
                "arguments": json.dumps({"tag": kind, "seconds": 0}),
            }
            message = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
            reply = {"id": "c1", "object": "chat.completion", "model": body["model"], "created": 0}
            reply["choices"] = [{"index": 0, "message": message, "finish_reason": "tool_calls"}]
            self._send(200, "application/json", json.dumps(reply).encode())
            return
        self._send(*GARBAGE[kind])

    def _send(self, status: int, content_type: str, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # the base class's name
        return


@pytest.fixture(scope="module")
def garbage_env() -> Iterator[FaultEnv]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _GarbageModel)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with FaultEnv() as fault_env:
            fault_env.start_worker(concurrency=2)
            base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
            # A user's OpenAI-compatible server: OPENAI_BASE_URL and a key, the model named `openai:…`.
            fault_env.start_orchestrator(env={"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "test-key"})
            yield fault_env
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_garbage_from_the_provider_mid_turn_fails_the_turn_cleanly(garbage_env: FaultEnv, kind: str) -> None:
    turn_id = garbage_env.client.submit(
        prompt="do the work",
        tools=["fault_work"],
        model=f"openai:garbage-{kind}",
        limits={"max_model_retries": 0},
    )
    outcome = garbage_env.client.wait(turn_id, 60)
    check_turn(outcome)
    assert outcome.status == "failed" and outcome.stop_reason == "provider_error", outcome.model_dump_json()
    assert outcome.error is not None and outcome.error.message.strip()
    assert outcome.llm_calls == 2
    (answer,) = [m for m in outcome.messages if isinstance(m, ToolMessage)]
    assert not answer.is_error  # the round before the garbage was answered
    assert all(is_running(p) for p in garbage_env.orchestrators)
