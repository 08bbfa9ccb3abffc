"""A `type` that is a list or an object (unhashable) is a malformed body, not a TypeError.

Found by the mutation fuzzer (`test_fuzz_normalisers.py`): a Responses stream event whose `type` was `[]`
reached a frozenset lookup and raised. Each case here is one such field in each shape that reads one.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.model import ProviderError
from orchestrator.providers import anthropic
from orchestrator.providers.common import IdSource
from orchestrator.providers.detect import from_response

pytestmark = pytest.mark.timeout(10)

RESPONSES_STREAM = "\n".join(
    [
        "event: response.created",
        'data: {"type": "response.created", "response": {"id": "r1", "status": "in_progress", "output": []}}',
        "",
        "event: response.in_progress",
        'data: {"type": [], "response": {"id": "r1", "status": "in_progress", "output": []}}',
        "",
    ]
)
CHAT_BODY = {
    "id": "c1",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": [{"type": {"x": 1}, "text": "hi"}]},
        }
    ],
}


@pytest.mark.parametrize(
    ("body", "provider"),
    [(RESPONSES_STREAM, "openai_responses"), (json.dumps(CHAT_BODY), "openai_chat")],
    ids=["responses-stream-event-type", "chat-content-part-type"],
)
def test_an_unhashable_type_is_a_provider_error(body: str, provider: str) -> None:
    result = from_response(body, provider=provider, ids=IdSource())
    assert isinstance(result, ProviderError), result
    assert "type" in result.message


def test_resent_thinking_skips_blocks_with_an_unhashable_type() -> None:
    blocks = [{"type": ["thinking"]}, {"type": "thinking", "thinking": "t", "signature": "s"}]
    assert anthropic._resendable_thinking(blocks) == [{"type": "thinking", "thinking": "t", "signature": "s"}]
