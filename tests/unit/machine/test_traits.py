"""The provider traits the request-time view reads (orchestrator/providers/traits.py)."""

from __future__ import annotations

import pytest

from orchestrator.providers.traits import PROVIDER_TRAITS, provider_of, traits_of, wire_family

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("provider", "family"),
    [
        ("openai", "openai_chat"),
        ("scripted:demo", "openai_chat"),
        (" OpenAI_Chat ", "openai_chat"),
        ("openai_responses:gpt-4.1", "openai_responses"),
        ("anthropic:claude:x", "anthropic"),
        ("bedrock", "bedrock"),  # not in the table: a family of its own
        (None, None),
    ],
)
def test_wire_family(provider: str | None, family: str | None) -> None:
    assert wire_family(provider) == family


def test_the_family_of_a_listed_provider_is_the_one_of_its_traits() -> None:
    for provider, traits in PROVIDER_TRAITS.items():
        assert wire_family(provider) == traits.wire_family == traits_of(provider).wire_family


@pytest.mark.parametrize(
    ("provider", "call_id", "accepted"),
    [
        ("openai", "call_" + "x" * 35, True),
        ("openai", "call_" + "x" * 36, False),
        ("openai_responses", "fc_" + "x" * 61, True),
        ("anthropic:claude", "toolu_" + "x" * 58, True),
        ("anthropic:claude", "toolu_" + "x" * 59, False),
        ("anthropic", "call.A/1", False),
        ("unknown", "x" * 40, True),
        ("unknown", "x" * 41, False),
        ("unknown", "a:b", False),
    ],
)
def test_tool_call_id_rules(provider: str, call_id: str, accepted: bool) -> None:
    assert traits_of(provider).accepts_tool_call_id(call_id) is accepted


def test_provider_of_keeps_the_name_as_written() -> None:
    assert provider_of("OpenAI:gpt-4.1:mini") == "OpenAI"
    assert provider_of("scripted") == "scripted"
