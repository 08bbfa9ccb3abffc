"""Over-long-context errors of every provider, normalised to one code with the sizes they state.

The bodies are the providers' own words (OpenAI, Anthropic and Gemini as their APIs answer; vLLM as its
OpenAI-compatible server does); recorded error bodies that are not about the context stay as they were.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.providers import anthropic, bedrock, cohere, gemini, openai_chat, openai_responses
from orchestrator.providers.base import WireFormat

pytestmark = pytest.mark.timeout(30)

RECORDED = Path(__file__).resolve().parents[4] / "shared" / "provider_responses"

OPENAI = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in "
        "130532 tokens (130000 in the messages, 532 in the functions). Please reduce the length of the "
        "messages or functions.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
OPENAI_GPT5 = {
    "error": {
        "message": "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in "
        "301234 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
GROQ = {
    "error": {
        "message": "Please reduce the length of the messages or completion.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
VLLM = {
    "object": "error",
    "message": "This model's maximum context length is 32768 tokens. However, you requested 33000 tokens "
    "(32000 in the messages, 1000 in the completion). Please reduce the length of the messages or "
    "completion.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}
ANTHROPIC = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 208310 tokens > 200000 maximum",
    },
    "request_id": "req_011CSVr7aBmVBX3fycHTLhQf",
}
GEMINI = {
    "error": {
        "code": 400,
        "message": "The input token count (1196265) exceeds the maximum number of tokens allowed (1048575).",
        "status": "INVALID_ARGUMENT",
    }
}
MISTRAL = {
    "object": "error",
    "message": "Prompt contains 40012 tokens and 0 draft tokens, too large for model with 32768 maximum "
    "context length",
    "type": "invalid_request_message_error",
    "param": None,
    "code": None,
}
BEDROCK = {"message": "Input is too long for requested model."}
COHERE = {
    "message": "too many tokens: total number of tokens in the prompt cannot exceed 4081 - received 4381. "
    "Try using a shorter prompt, or enabling prompt truncating."
}

CASES: list[tuple[str, WireFormat, dict[str, Any], int | None, int | None]] = [
    ("openai", openai_chat, OPENAI, 128_000, 130_532),
    ("openai gpt-5", openai_chat, OPENAI_GPT5, 272_000, 301_234),
    ("openai responses", openai_responses, OPENAI, 128_000, 130_532),
    ("groq (no sizes)", openai_chat, GROQ, None, None),
    ("vllm", openai_chat, VLLM, 32_768, 33_000),
    ("anthropic", anthropic, ANTHROPIC, 200_000, 208_310),
    ("gemini", gemini, GEMINI, 1_048_575, 1_196_265),
    ("mistral", openai_chat, MISTRAL, 32_768, 40_012),
    ("bedrock", bedrock, BEDROCK, None, None),
    ("cohere", cohere, COHERE, 4_081, 4_381),
]


@pytest.mark.parametrize(
    ("module", "body", "window", "prompt"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_each_providers_overflow_is_one_code_with_its_sizes(
    module: WireFormat, body: dict[str, Any], window: int | None, prompt: int | None
) -> None:
    error = module.error_from_wire(400, body)
    assert error.code == "context_length_exceeded"
    assert error.status == 400
    assert not error.retryable  # the same request would fail the same way: the view must shrink first
    details = error.details or {}
    assert details.get("context_window_tokens") == window
    assert details.get("prompt_tokens") == prompt
    assert error.message  # the provider's words are kept


def test_a_streamed_overflow_without_a_status_is_recognised_too() -> None:
    error = anthropic.error_from_wire(None, ANTHROPIC)
    assert (error.code, (error.details or {}).get("context_window_tokens")) == (
        "context_length_exceeded",
        200_000,
    )


def test_a_provider_code_other_than_ours_is_kept_in_details() -> None:
    body = {"error": {"message": "prompt is too long: 300 tokens > 200 maximum", "code": "prompt_too_long"}}
    error = openai_chat.error_from_wire(400, body)
    assert error.code == "context_length_exceeded"
    assert (error.details or {})["provider_code"] == "prompt_too_long"


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("openai__error_400_tool_call_ids_without_tool_messages.json", openai_chat),
        ("anthropic__error_400_tool_use_without_tool_result.json", anthropic),
        ("anthropic__error_429_rate_limit.json", anthropic),
        ("openai__error_429_rate_limit_exceeded.json", openai_chat),
    ],
)
def test_recorded_errors_about_something_else_are_left_alone(name: str, module: WireFormat) -> None:
    body = json.loads((RECORDED / name).read_text(encoding="utf-8"))
    status = 429 if "429" in name else 400
    error = module.error_from_wire(status, body)
    assert error.code != "context_length_exceeded"
    assert "context_window_tokens" not in (error.details or {})
