"""A conversation that outgrows its model's context window keeps working (issue 13).

Twenty turns of one `conversation_id`, each fetching an ~8 kB page, against a local server that speaks
OpenAI Chat Completions with a 15,000-token window and refuses a longer request with OpenAI's own 400
`context_length_exceeded` body. The model is one the known table lacks, so the orchestrator starts from its
default window, learns the real one from the refusal, shrinks the view and calls again. Every turn completes;
the stored history keeps every message of every turn, whole; no request the server saw parts a tool call
from its result. On a main without the context budget, 13 of the 20 turns fail with `provider_error`.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest

from orchestrator.client.redis_client import Client
from orchestrator.model import AssistantMessage, ToolMessage, UserMessage
from orchestrator.redis_server import RedisServer, find_free_port
from tests.support.context_model import SmallWindowModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.page_tools import build_page
from tests.support.processes import WorkerHandle, start_worker
from tests.support.turns import assert_every_call_answered_once, wait_outcome

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TURNS = 20
WINDOW_TOKENS = 15_000
# A model the known table lacks: its window is the default until the server's refusal states it.
MODEL = "openai:local-small-window"


@pytest.fixture(scope="module")
def small_model() -> Iterator[SmallWindowModelServer]:
    with SmallWindowModelServer(WINDOW_TOKENS) as server:
        yield server


@pytest.fixture(scope="module")
def page_worker(module_redis: RedisServer) -> Iterator[WorkerHandle]:
    handle = start_worker(module_redis.url, ["tests.support.page_tools"], concurrency=2)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def small_window_orchestrator(
    module_redis: RedisServer, small_model: SmallWindowModelServer, page_worker: WorkerHandle
) -> Iterator[OrchestratorHandle]:
    env = {
        "TOOLLOOP_MODEL": MODEL,
        "OPENAI_BASE_URL": small_model.base_url,
        "OPENAI_API_KEY": "sk-test",
        "TOOLLOOP_METRICS_PORT": str(find_free_port()),
    }
    handle = start_orchestrator(module_redis.url, env=env)
    yield handle
    handle.stop()


def pairing_breaks(messages: list[dict[str, Any]]) -> list[str]:
    """Where a request parts a call from its result: each assistant message with tool calls must be followed
    by exactly one tool message per call, and every tool message must answer the calls just before it."""
    breaks: list[str] = []
    expected: list[str] = []
    for index, message in enumerate(messages):
        if message.get("role") == "tool":
            if message.get("tool_call_id") not in expected:
                breaks.append(f"message {index}: result {message.get('tool_call_id')} without its call")
            else:
                expected.remove(message["tool_call_id"])
            continue
        if expected:
            breaks.append(f"message {index}: calls {expected} without their results")
        expected = [call["id"] for call in message.get("tool_calls") or []]
    if expected:
        breaks.append(f"calls {expected} without their results at the end")
    return breaks


def test_twenty_turns_against_a_small_window_all_complete(
    small_window_orchestrator: OrchestratorHandle, small_model: SmallWindowModelServer, client: Client
) -> None:
    conversation = "long-conversation"
    statuses = []
    outcome = None
    for number in range(TURNS):
        turn_id = client.submit(
            prompt=f"Turn {number}: fetch page {number} and tell me what it says.",
            tools=["fetch_page"],
            conversation_id=conversation,
        )
        outcome = wait_outcome(client, turn_id, timeout_s=60)
        statuses.append((number, outcome.status, outcome.stop_reason, outcome.error))
    assert all(status == "completed" for _, status, _, _ in statuses), statuses

    # The stored history: every message of all twenty turns, each page whole.
    assert outcome is not None
    history = outcome.messages
    assert_every_call_answered_once(history)
    users = [m.content for m in history if isinstance(m, UserMessage)]
    assert users == [f"Turn {n}: fetch page {n} and tell me what it says." for n in range(TURNS)]
    results = [m for m in history if isinstance(m, ToolMessage)]
    assert [m.content for m in results] == [
        build_page(f"https://example.test/page/{n}") for n in range(TURNS)
    ]
    finals = [m for m in history if isinstance(m, AssistantMessage) and not m.tool_calls]
    assert len(finals) == TURNS
    assert len(history) == 4 * TURNS

    # What the server saw: it refused some requests (the window was learned that way), every accepted one
    # fit, older pages were elided or dropped to get there, and none parted a call from its result.
    received = small_model.received
    assert any(r.refused for r in received)
    accepted = [r for r in received if not r.refused]
    assert all(r.tokens <= WINDOW_TOKENS for r in accepted)
    assert any("tool result elided to fit the context window" in str(r.body) for r in accepted)
    for r in received:
        assert pairing_breaks(r.body["messages"]) == [], r.body["messages"]
    # Each refusal was followed by one call made again that fit: no turn was refused twice in a row.
    refusals_in_a_row = [a.refused and b.refused for a, b in pairwise(received)]
    assert not any(refusals_in_a_row)
