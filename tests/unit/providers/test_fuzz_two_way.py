"""Property: the two-way providers' normalisers give a Turn or a ProviderError for any body, never raise;
and whatever they return goes back out through `to_wire` as a request body that is plain JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.model import ProviderError, ToolMessage, Turn, UserMessage, assistant_message_from_turn
from orchestrator.providers import anthropic, openai_chat, openai_responses
from orchestrator.providers.base import ModelRequest

pytestmark = pytest.mark.timeout(60)

MODULES = (openai_chat, openai_responses, anthropic)
KEYS = [
    "choices",
    "message",
    "delta",
    "content",
    "tool_calls",
    "function",
    "arguments",
    "name",
    "id",
    "index",
    "reasoning_content",
    "reasoning",
    "refusal",
    "finish_reason",
    "usage",
    "output",
    "type",
    "call_id",
    "summary",
    "text",
    "status",
    "incomplete_details",
    "input",
    "thinking",
    "signature",
    "stop_reason",
    "content_block",
    "partial_json",
    "error",
    "message_start",
    "output_index",
    "item",
    "content_index",
    "summary_index",
]
TYPES = [
    "message",
    "function_call",
    "reasoning",
    "output_text",
    "refusal",
    "text",
    "tool_use",
    "thinking",
    "redacted_thinking",
    "content_block_start",
    "content_block_delta",
    "message_delta",
    "message_stop",
    "input_json_delta",
    "response.completed",
    "response.output_item.added",
    "error",
]
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(TYPES)
)
bodies = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=6),
    max_leaves=40,
)


def check_round_trip(module: Any, result: object) -> None:
    assert isinstance(result, Turn | ProviderError), result
    if isinstance(result, Turn):
        assistant = assistant_message_from_turn(result)
        answers = [ToolMessage(tool_call_id=c.id, name=c.name, content="ok") for c in result.tool_calls]
        body = module.to_wire(
            ModelRequest(model="m", messages=[UserMessage(content="x"), assistant, *answers])
        )
        json.dumps(body)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies)
def test_random_bodies(body: object) -> None:
    for module in MODULES:
        check_round_trip(module, module.from_wire(body))
        check_round_trip(module, module.from_wire(json.dumps(body)))
        assert isinstance(module.error_from_wire(500, body), ProviderError)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(bodies, max_size=6), cut=st.integers(min_value=0, max_value=400))
def test_random_streams(events: list[object], cut: int) -> None:
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
    for module in MODULES:
        check_round_trip(module, module.from_stream(text))
        check_round_trip(module, module.from_stream(text[:cut]))
