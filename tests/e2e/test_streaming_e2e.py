"""Streaming end to end: the scripted model streams its answer slowly over HTTP to a real
`toolloop orchestrator`, which writes it as `text_delta` events while the model writes; a client follows them
through `Client.events`, `Client.stream`, `toolloop submit --stream` and the API's SSE endpoint (reconnecting
with `Last-Event-ID`), with a real prefork worker running the tools."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.client.redis_client import Client, TextDeltaEvent, ToolFinishedEvent, TurnFinishedEvent
from orchestrator.redis_server import RedisServer, find_free_port
from orchestrator.store.codec import TurnEvent
from tests.docs.blocks import python_block
from tests.support.e2e_processes import E2E_TOOLS, OrchestratorHandle, start_orchestrator
from tests.support.plans import plan_prompt
from tests.support.processes import ROOT, TOOLLOOP_BIN, WorkerHandle, start_worker
from tests.support.served import answers, serving_api, start_python
from tests.support.sse import SseMessage, read_sse
from tests.support.turns import event_ids

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

# Long enough that the scripted model writes it in many pieces, 20 ms apart: a second or so of writing.
ANSWER = " ".join(f"Sentence {i} of the streamed answer, written a few words at a time." for i in range(12))


ADD_THEN_ANSWER = [{"calls": [{"name": "e2e_add", "arguments": {"a": 2, "b": 3}}]}, {"text": ANSWER}]


@pytest.fixture(scope="module")
def stream_worker(module_redis: RedisServer) -> Iterator[WorkerHandle]:
    # The demo's tools too: the streaming guide's FastAPI example offers get_weather.
    handle = start_worker(module_redis.url, [E2E_TOOLS, "workers.examples"], concurrency=2)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def streaming_orchestrator(
    module_redis: RedisServer, stream_worker: WorkerHandle
) -> Iterator[OrchestratorHandle]:
    # No TOOLLOOP_SCRIPTED_BASE_URL: the orchestrator serves the scripted model itself, over HTTP, paced.
    # Its default model plays plans: the streaming guide's example names none.
    env = {"TOOLLOOP_SCRIPTED_STREAM_DELAY_S": "0.02", "TOOLLOOP_MODEL": "scripted:plan"}
    handle = start_orchestrator(module_redis.url, env=env)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def api_url(module_redis: RedisServer, streaming_orchestrator: OrchestratorHandle) -> Iterator[str]:
    with serving_api(module_redis.url) as url:
        yield url


@pytest.fixture
def client(module_redis: RedisServer, streaming_orchestrator: OrchestratorHandle) -> Iterator[Client]:
    c = Client(module_redis.url)
    yield c
    c.close()


def deltas_of(events: list[TurnEvent], llm_call: int) -> list[TurnEvent]:
    return [e for e in events if e.name == "text_delta" and e.data["llm_call"] == llm_call]


def test_the_answer_arrives_in_pieces_while_the_model_writes_it(client: Client) -> None:
    turn_id = client.submit(prompt=plan_prompt(ADD_THEN_ANSWER), model="scripted:plan")
    events = list(client.events(turn_id))
    outcome = client.wait(turn_id, timeout=30)
    assert outcome.status == "completed", outcome
    final_call = outcome.llm_calls - 1
    pieces = deltas_of(events, final_call)
    names = [e.name for e in events]
    # Several events, spread over the writing (distinct times), all before the model's response is recorded.
    assert len(pieces) >= 3, names
    assert len({e.at for e in pieces}) >= 3
    responded = max(i for i, e in enumerate(events) if e.name == "model_responded")
    assert events.index(pieces[-1]) < responded < names.index("turn_finished")
    assert "".join(e.data["text"] for e in pieces) == outcome.text == ANSWER
    # Coalesced: far fewer events than the pieces the model streamed (one per word or so).
    assert len(pieces) < len(ANSWER.split()) / 3


def test_client_stream_yields_typed_events_with_the_outcome_last(client: Client) -> None:
    turn_id = client.submit(prompt=plan_prompt(ADD_THEN_ANSWER), model="scripted:plan")
    streamed = list(client.stream(turn_id))
    last = streamed[-1]
    assert isinstance(last, TurnFinishedEvent)
    assert last.outcome.status == "completed"
    text = "".join(e.text for e in streamed if isinstance(e, TextDeltaEvent))
    assert text == last.outcome.text == ANSWER
    finished = [e for e in streamed if isinstance(e, ToolFinishedEvent)]
    assert [(e.tool, e.ok) for e in finished] == [("e2e_add", True)]


def test_a_turn_that_asks_for_no_streaming_gets_its_text_in_one_event(client: Client) -> None:
    turn_id = client.submit(prompt=plan_prompt([{"text": ANSWER}]), model="scripted:plan", stream=False)
    events = list(client.events(turn_id))
    assert [e.data["text"] for e in events if e.name == "text_delta"] == [ANSWER]


def test_submit_stream_prints_the_answer_as_it_is_written(module_redis: RedisServer) -> None:
    prompt = plan_prompt(ADD_THEN_ANSWER)
    result = subprocess.run(
        [str(TOOLLOOP_BIN), "submit", "--prompt", prompt, "--model", "scripted:plan", "--stream"],
        capture_output=True,
        text=True,
        env={"TOOLLOOP_REDIS_URL": module_redis.url, "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ANSWER + "\n"
    assert "e2e_add" in result.stderr
    assert "turn_" in result.stderr.splitlines()[0]


class _Enough(Exception):
    """Ends the first SSE connection on purpose, mid-answer."""


async def _read_in_two_connections(url: str, turn_id: str) -> tuple[list[SseMessage], list[SseMessage]]:
    first: list[SseMessage] = []

    def take(message: SseMessage) -> None:
        first.append(message)
        if sum(m.event == "text_delta" for m in first) == 2:
            raise _Enough

    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        with pytest.raises(_Enough):
            await read_sse(http, f"/v1/turns/{turn_id}/events", on_message=take)
        second = await read_sse(
            http, f"/v1/turns/{turn_id}/events", headers={"Last-Event-ID": str(first[-1].id)}
        )
    assert second.status == 200, second.body
    return first, second.messages


def test_sse_names_each_event_and_a_reconnect_misses_nothing(client: Client, api_url: str) -> None:
    turn_id = client.submit(prompt=plan_prompt(ADD_THEN_ANSWER), model="scripted:plan")
    first, second = asyncio.run(_read_in_two_connections(api_url, turn_id))
    stored = event_ids(client.redis, turn_id)
    seen = [m.id for m in first + second]
    assert seen == stored  # every event once, in order, across the two connections
    assert all(m.event == m.json()["name"] for m in first + second)
    text = "".join(m.json()["data"]["text"] for m in first + second if m.event == "text_delta")
    outcome = client.wait(turn_id, timeout=30)
    assert text == outcome.text == ANSWER
    assert second[-1].event == "turn_finished"


def test_the_docs_fastapi_example_streams_the_answer(
    client: Client, module_redis: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "readme_chat.py").write_text(python_block("docs/guides/streaming.md", "chat_app.py"))
    port = find_free_port()
    served = start_python(
        ["-m", "uvicorn", "readme_chat:app", "--port", str(port), "--app-dir", str(tmp_path)],
        env={"TOOLLOOP_REDIS_URL": module_redis.url},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        served.wait_for(lambda: answers(f"{url}/docs"), "the docs' FastAPI app answers")
        question = plan_prompt(
            [{"calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}, {"text": ANSWER}]
        )
        chunks: list[str] = []
        with httpx.stream("POST", f"{url}/chat", params={"question": question}, timeout=60) as reply:
            assert reply.status_code == 200
            chunks.extend(reply.iter_text())
    finally:
        served.kill()
    body = "".join(chunks)
    assert body == "\n[get_weather…]\n" + ANSWER
    assert len(chunks) >= 3  # the answer came in pieces, not in one body at the end
