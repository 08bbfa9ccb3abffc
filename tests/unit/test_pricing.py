"""The price table and the cost of one model call: list prices, overrides, cached tokens, and
None — never a guess — for a model with no price."""

from __future__ import annotations

import pytest

from orchestrator.errors import ModelConfigError
from orchestrator.model import Usage
from orchestrator.pricing import SHIPPED_PRICES, ModelPrice, build_price_table, cost_usd, find_price


def usage(
    input_tokens: int, output_tokens: int, cache_read: int | None = None, cache_write: int | None = None
) -> Usage:
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
    )


def test_a_call_costs_its_tokens_at_the_list_price() -> None:
    # gpt-4.1-mini: $0.40 in, $1.60 out per million tokens.
    assert cost_usd("openai:gpt-4.1-mini", usage(1_000_000, 500_000)) == pytest.approx(0.40 + 0.80)
    assert cost_usd("anthropic:claude-sonnet-4-5", usage(2000, 1000)) == pytest.approx(0.006 + 0.015)


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("openai:gpt-4.1-mini-2025-04-14", "gpt-4.1-mini"),
        ("openai_responses:gpt-5-2025-08-07", "gpt-5"),
        ("anthropic:claude-sonnet-4-5-20250929", "claude-sonnet-4-5"),
        ("anthropic:claude-3-5-haiku-latest", "claude-3-5-haiku"),
        ("gpt-4o", "gpt-4o"),
    ],
)
def test_dated_names_match_their_family(model: str, family: str) -> None:
    assert find_price(model, SHIPPED_PRICES) == SHIPPED_PRICES[family]


@pytest.mark.parametrize(
    "model",
    ["openai:gpt-4o-audio-preview", "openai:qwen3:8b", "anthropic:claude-future-9", "openai:gpt-4.1-mega"],
)
def test_a_model_with_no_price_costs_none_never_a_prefix_guess(model: str) -> None:
    assert cost_usd(model, usage(100, 100)) is None


def test_scripted_models_cost_nothing() -> None:
    assert cost_usd("scripted:demo", usage(10_000, 10_000)) == 0.0


def test_openai_cached_tokens_are_part_of_input_and_priced_at_the_cached_rate() -> None:
    # gpt-4.1: $2 in, $0.50 cached, $8 out; 1M prompt tokens of which 600k came from the cache.
    cost = cost_usd("openai:gpt-4.1", usage(1_000_000, 0, cache_read=600_000))
    assert cost == pytest.approx(0.4 * 2.00 + 0.6 * 0.50)


def test_anthropic_cache_reads_and_writes_are_apart_from_input_and_priced_at_cache_rates() -> None:
    # claude-sonnet-4-5: $3 in, $0.30 cache hits, $3.75 cache writes, $15 out.
    cost = cost_usd(
        "anthropic:claude-sonnet-4-5",
        usage(1_000_000, 1_000_000, cache_read=1_000_000, cache_write=1_000_000),
    )
    assert cost == pytest.approx(3.00 + 0.30 + 3.75 + 15.00)
    bare = cost_usd("claude-sonnet-4-5", usage(0, 0, cache_read=1_000_000))
    assert bare == pytest.approx(0.30)


def test_overrides_correct_a_shipped_price_field_by_field_and_add_new_models() -> None:
    table = build_price_table(
        {
            "gpt-4.1": {"output": 6.0},
            "openai:qwen3:8b": {"input": 0.0, "output": 0.0},
            "openai:gpt-4o": {"input": 1.0, "output": 2.0},
            "my-model": {"input": 1.0, "output": 2.0, "cache_read": 0.1},
        }
    )
    assert table["gpt-4.1"] == ModelPrice(input=2.00, output=6.0, cache_read=0.50)
    assert cost_usd("openai:qwen3:8b", usage(1000, 1000), table) == 0.0
    # `provider:model` is the longer match: it wins over the bare name, for that provider only.
    assert cost_usd("openai:gpt-4o-2024-08-06", usage(1_000_000, 0), table) == pytest.approx(1.0)
    assert cost_usd("openai_responses:gpt-4o", usage(1_000_000, 0), table) == pytest.approx(2.50)
    assert cost_usd("openai:my-model", usage(1_000_000, 0, cache_read=1_000_000), table) == pytest.approx(0.1)
    # No cache rate: cached tokens cost the input rate.
    plain = build_price_table({"plain": {"input": 1.0, "output": 1.0}})
    assert cost_usd("openai:plain", usage(1_000_000, 0, cache_read=500_000), plain) == pytest.approx(1.0)
    assert build_price_table({}) == SHIPPED_PRICES


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"new-model": {"input": 1.0}}, "needs both `input` and `output`"),
        ({"gpt-4.1": {"inptu": 1.0}}, "unknown field(s) inptu"),
        ({"gpt-4.1": {"input": -1.0}}, "cannot be negative"),
    ],
)
def test_bad_overrides_are_named(overrides: dict[str, dict[str, float]], message: str) -> None:
    with pytest.raises(ModelConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_price_table(overrides)
