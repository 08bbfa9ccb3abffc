"""Which settings each provider refuses: one message per setting, naming it and the provider."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.model import ModelSettings
from orchestrator.providers.controls import refuse_controls, refuse_model_controls

EVERYTHING = ModelSettings(
    temperature=0.5,
    top_p=0.9,
    max_output_tokens=2000,
    stop=["END"],
    seed=1,
    reasoning_effort="medium",
    parallel_tool_calls=False,
    extra={"top_k": 5},
)
OBJECT_SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}


@pytest.mark.parametrize("provider", ["openai", "scripted"])
def test_chat_accepts_every_setting(provider: str) -> None:
    assert refuse_controls(provider, EVERYTHING, output_schema=OBJECT_SCHEMA, tool_choice="required") == []


def test_responses_refuses_stop_and_seed_and_nothing_else() -> None:
    assert refuse_controls("openai_responses", EVERYTHING) == [
        "stop is not supported by openai_responses",
        "seed is not supported by openai_responses",
    ]
    assert (
        refuse_controls("openai_responses", EVERYTHING.model_copy(update={"stop": None, "seed": None})) == []
    )


def test_anthropic_refuses_seed_and_what_extended_thinking_cannot_take() -> None:
    assert refuse_controls("anthropic", EVERYTHING, tool_choice="required") == [
        "seed is not supported by anthropic",
        "temperature cannot be combined with reasoning_effort on anthropic (extended thinking)",
        "top_p below 0.95 cannot be combined with reasoning_effort on anthropic (extended thinking)",
        "tool_choice 'required' cannot be combined with reasoning_effort on anthropic "
        "(extended thinking cannot force a tool)",
    ]
    without_thinking = EVERYTHING.model_copy(update={"seed": None, "reasoning_effort": None})
    assert refuse_controls("anthropic", without_thinking, tool_choice="required") == []


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"temperature": 1.5}, "temperature above 1 is not supported by anthropic (got 1.5)"),
        (
            {"reasoning_effort": "low", "top_p": 0.5},
            "top_p below 0.95 cannot be combined with reasoning_effort on anthropic (extended thinking)",
        ),
        (
            {"reasoning_effort": "low", "max_output_tokens": 1024},
            "max_output_tokens must be above 1024 with reasoning_effort on anthropic "
            "(the least thinking budget)",
        ),
    ],
)
def test_anthropic_ranges(settings: dict[str, Any], message: str) -> None:
    assert refuse_controls("anthropic", ModelSettings(**settings)) == [message]


def test_chat_takes_at_most_four_stop_sequences_as_openais_schema_says() -> None:
    assert refuse_controls("openai", ModelSettings(stop=list("abcde"))) == [
        "stop: openai takes at most 4 sequences (got 5)"
    ]
    assert refuse_controls("openai", ModelSettings(stop=list("abcd"))) == []


@pytest.mark.parametrize(
    ("provider", "key"),
    [("openai", "messages"), ("openai", "stream"), ("openai_responses", "input"), ("anthropic", "model")],
)
def test_extra_may_not_replace_what_toolloop_builds(provider: str, key: str) -> None:
    assert refuse_controls(provider, ModelSettings(extra={key: 1, "top_k": 3})) == [
        f"extra.{key} is not allowed: toolloop builds {key!r} itself"
    ]


@pytest.mark.parametrize("provider", ["openai", "openai_responses", "anthropic", "scripted"])
def test_an_output_schema_must_be_a_valid_schema_of_an_object(provider: str) -> None:
    assert refuse_controls(provider, ModelSettings(), output_schema=OBJECT_SCHEMA) == []
    assert refuse_controls(provider, ModelSettings(), output_schema={"properties": {}}) == []
    assert refuse_controls(provider, ModelSettings(), output_schema={"type": "array"}) == [
        f"output_schema must describe a JSON object (type: object) for {provider}"
    ]
    (invalid,) = refuse_controls(provider, ModelSettings(), output_schema={"type": "nonsense"})
    assert invalid.startswith("output_schema is not a valid JSON Schema: ")


def test_by_model_name_the_provider_part_decides_and_a_tier_refuses_nothing() -> None:
    seeded = ModelSettings(seed=3)
    assert refuse_model_controls("anthropic:claude-sonnet-4-5", seeded) == [
        "seed is not supported by anthropic"
    ]
    assert refuse_model_controls("openai:qwen3:8b", seeded) == []
    assert refuse_model_controls("fast", seeded) == []
    assert refuse_model_controls("OpenAI_Responses:gpt-5", ModelSettings(stop=["x"])) == [
        "stop is not supported by openai_responses"
    ]
