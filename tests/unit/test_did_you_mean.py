"""A refused name comes with the closest accepted one: tools, providers and tiers (`build_did_you_mean`)."""

from __future__ import annotations

import pytest

from orchestrator.errors import ModelConfigError, UnknownToolError, build_did_you_mean, find_close_name
from orchestrator.providers.base import check_model_name, parse_model_ref, resolve_model
from orchestrator.store.flows import check_tool_names
from workers.contract import ToolSpec

pytestmark = pytest.mark.timeout(10)

CATALOGUE = {
    "add": ToolSpec(name="add"),
    "echo": ToolSpec(name="echo"),
    "drop_tables": ToolSpec(name="drop_tables", sensitive=True),
}


@pytest.mark.parametrize(
    ("name", "known", "close"),
    [
        ("ad", ["add", "echo"], "add"),
        ("ecoh", ["add", "echo"], "echo"),
        ("weather", ["add", "echo"], None),
        ("smrt", ["fast", "default", "smart"], "smart"),
        ("antropic", ["openai", "anthropic"], "anthropic"),
        ("anything", [], None),
    ],
)
def test_the_closest_name_is_found_only_when_close(name: str, known: list[str], close: str | None) -> None:
    assert find_close_name(name, known) == close


def test_the_suggestion_reads_as_one_clause() -> None:
    assert build_did_you_mean("ad", ["add"]) == " (did you mean 'add'?)"
    assert build_did_you_mean("zzz", ["add"]) == ""


def test_an_unknown_tool_is_refused_with_the_closest_served_one() -> None:
    with pytest.raises(UnknownToolError) as refused:
        check_tool_names(["ad", "echo", "zzz"], CATALOGUE)
    assert str(refused.value) == (
        "unknown tools 'ad' (did you mean 'add'?), 'zzz' in 'tools'; available: add, echo"
    )
    assert refused.value.describe("ad") == "unknown tool 'ad' (did you mean 'add'?); available: add, echo"
    assert refused.value.describe("zzz") == "unknown tool 'zzz'; available: add, echo"


def test_a_sensitive_tool_is_never_suggested() -> None:
    # Only the public listing is suggested from: a misspelt sensitive name must not reveal the real one.
    with pytest.raises(UnknownToolError) as refused:
        check_tool_names(["drop_table"], CATALOGUE)
    assert "drop_tables" not in str(refused.value) and "did you mean" not in str(refused.value)


@pytest.mark.parametrize(
    ("model", "suggested"),
    [("smrt", "smart"), ("fats", "fast"), ("antropic:claude-sonnet-4", "anthropic"), ("opnai:gpt", "openai")],
)
def test_a_misspelt_tier_or_provider_is_refused_with_the_closest(model: str, suggested: str) -> None:
    with pytest.raises(ModelConfigError, match=f"did you mean '{suggested}'\\?"):
        check_model_name(model)


def test_names_with_nothing_close_are_refused_as_before() -> None:
    with pytest.raises(ModelConfigError) as refused:
        parse_model_ref("zzz:x")
    assert str(refused.value) == (
        "unknown provider 'zzz' in 'zzz:x' (providers: anthropic, bedrock, cohere, gemini, openai, "
        "openai_responses, scripted, vertex)"
    )


def test_an_unconfigured_tier_is_refused_with_the_closest_configured_one() -> None:
    with pytest.raises(ModelConfigError) as refused:
        resolve_model("smarter", default="scripted:demo", tiers={"smart": "openai:gpt-4.1"})
    assert str(refused.value) == (
        "unknown model tier 'smarter' (did you mean 'smart'?): use 'provider:model' or one of the tiers "
        "default, smart"
    )
