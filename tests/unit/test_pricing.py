"""The price table and the cost of one model call: genai-prices' list behind the deployment's own entries,
each provider's way of counting cached tokens, and None — never a guess — for a model with no price."""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Any

import pytest

from orchestrator import pricing
from orchestrator.errors import ModelConfigError
from orchestrator.machine.events import ModelResponded
from orchestrator.model import Turn, Usage
from orchestrator.pricing import (
    GENAI_PRICES_PROVIDER_IDS,
    ModelPrice,
    build_api_urls,
    build_price_table,
    cost_usd,
    find_listed_model,
    find_price,
)
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.deltas import DeltaSink
from orchestrator.runtime.perform import Performer, build_unknown_model_message
from orchestrator.settings import Settings
from tests.support.performer_fakes import FakePublisher, FakeStore, Serving, call_model, later

pytestmark = pytest.mark.timeout(60)

GROQ_URL = "https://api.groq.com/openai/v1"
GOOGLE_OPENAI_URL = "https://generativelanguage.googleapis.com/v1beta/openai"


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
    # gpt-4.1-mini: $0.40 in, $1.60 out per million tokens; claude-sonnet-4-5: $3 in, $15 out.
    assert cost_usd("openai:gpt-4.1-mini", usage(1_000_000, 500_000)) == pytest.approx(0.40 + 0.80)
    assert cost_usd("anthropic:claude-sonnet-4-5", usage(2000, 1000)) == pytest.approx(0.006 + 0.015)


@pytest.mark.parametrize(
    ("model", "rates"),
    [
        ("openai:gpt-5.1", (1.25, 10.00)),
        ("openai_responses:gpt-5.1", (1.25, 10.00)),
        ("gemini:gemini-2.5-flash", (0.30, 2.50)),
        ("vertex:gemini-2.5-flash", (0.30, 2.50)),
        ("cohere:command-r-plus", (2.50, 10.00)),
        ("bedrock:us.anthropic.claude-3-5-sonnet-20240620-v1:0", (3.00, 15.00)),
    ],
)
def test_models_the_old_hand_kept_table_lacked_are_priced(model: str, rates: tuple[float, float]) -> None:
    assert cost_usd(model, usage(1_000_000, 1_000_000)) == pytest.approx(sum(rates))


@pytest.mark.parametrize(
    ("model", "provider_id"),
    [
        ("openai:gpt-4o", "openai"),
        ("openai_responses:gpt-4o", "openai"),
        ("anthropic:claude-haiku-4-5", "anthropic"),
        ("gemini:gemini-2.5-flash", "google"),
        ("vertex:gemini-2.5-flash", "google"),
        ("bedrock:anthropic.claude-sonnet-4-5-20250929-v1:0", "aws"),
        ("cohere:command-a-03-2025", "cohere"),
    ],
)
def test_each_provider_is_looked_up_at_its_vendor_in_the_list(model: str, provider_id: str) -> None:
    listed = find_listed_model(model)
    assert listed is not None and listed.provider_id == provider_id
    assert GENAI_PRICES_PROVIDER_IDS[model.partition(":")[0]] == provider_id


def test_an_openai_compatible_url_the_list_knows_names_the_vendor() -> None:
    # Groq and Google's OpenAI-compatible endpoint, reached with the `openai` wire.
    table = build_price_table(api_urls={"openai": GROQ_URL})
    assert cost_usd("openai:llama-3.3-70b-versatile", usage(1_000_000, 1_000_000), table) == pytest.approx(
        0.59 + 0.79
    )
    google = build_price_table(api_urls={"openai": GOOGLE_OPENAI_URL})
    assert find_price("openai:gemini-2.5-flash", google) == find_price("gemini:gemini-2.5-flash")
    # Any other URL (a local server, a gateway) is OpenAI's list, and only OpenAI's: no guess at another
    # vendor's paid API for a local model that shares a name with it.
    local = build_price_table(api_urls={"openai": "http://127.0.0.1:8000/v1"})
    assert find_price("openai:gpt-4o", local) == find_price("gpt-4o")
    assert cost_usd("openai:deepseek-r1:8b", usage(100, 100), local) is None
    assert cost_usd("openai:gemini-2.5-flash", usage(100, 100), local) is None


def test_a_bare_name_is_matched_across_providers() -> None:
    listed = [find_listed_model(name) for name in ("gemini-2.5-flash", "claude-sonnet-4-5")]
    assert [model.provider_id if model else None for model in listed] == ["google", "anthropic"]
    assert find_price("gpt-4o") == ModelPrice(input=2.50, output=10.00, cache_read=1.25)


@pytest.mark.parametrize(
    ("model", "family"),
    [
        ("openai:gpt-4.1-mini-2025-04-14", "openai:gpt-4.1-mini"),
        ("openai_responses:gpt-5-2025-08-07", "openai:gpt-5"),
        ("anthropic:claude-sonnet-4-5-20250929", "anthropic:claude-sonnet-4-5"),
        ("anthropic:claude-3-5-haiku-latest", "anthropic:claude-3-5-haiku"),
    ],
)
def test_dated_names_match_their_family(model: str, family: str) -> None:
    assert find_price(model) is not None
    assert find_price(model) == find_price(family)


@pytest.mark.parametrize(
    "model",
    [
        "openai:qwen3:8b",
        "openai:my-local",
        "anthropic:claude-future-9",
        "openai:gpt-4.1-mega",
        "groq:llama-3.3-70b-versatile",  # not a toolloop provider: nothing of it is listed
        "openai:tts-1",  # listed, but priced per character: a chat call of it has no price
    ],
)
def test_a_model_with_no_price_costs_none_never_a_guess(model: str) -> None:
    assert cost_usd(model, usage(100, 100)) is None
    assert find_price(model) is None


def test_scripted_models_cost_nothing() -> None:
    assert cost_usd("scripted:demo", usage(10_000, 10_000)) == 0.0
    assert find_listed_model("scripted:demo") is None


def test_openai_cached_tokens_are_part_of_input_and_priced_at_the_cached_rate() -> None:
    # gpt-4.1: $2 in, $0.50 cached, $8 out; 1M prompt tokens of which 600k came from the cache.
    cost = cost_usd("openai:gpt-4.1", usage(1_000_000, 0, cache_read=600_000))
    assert cost == pytest.approx(0.4 * 2.00 + 0.6 * 0.50)
    # Gemini counts them in its prompt too: gemini-2.5-flash, $0.30 in, $0.03 cached.
    gemini = cost_usd("gemini:gemini-2.5-flash", usage(100_000, 0, cache_read=40_000))
    assert gemini == pytest.approx((60_000 * 0.30 + 40_000 * 0.03) / 1e6)
    # A count smaller than its cached share (a provider's slip) is taken as that share, never negative.
    assert cost_usd("openai:gpt-4.1", usage(100, 0, cache_read=1_000)) == pytest.approx(1_000 * 0.50 / 1e6)


def test_anthropic_and_bedrock_cache_reads_and_writes_are_apart_from_input() -> None:
    # claude-sonnet-4-5: $3 in, $0.30 cache hits, $3.75 cache writes, $15 out.
    cost = cost_usd(
        "anthropic:claude-sonnet-4-5", usage(10_000, 10_000, cache_read=10_000, cache_write=10_000)
    )
    assert cost == pytest.approx(10_000 * (3.00 + 0.30 + 3.75 + 15.00) / 1e6)
    assert cost_usd("claude-sonnet-4-5", usage(0, 0, cache_read=100_000)) == pytest.approx(0.03)
    # Bedrock's Converse reports them apart as well: Claude 3.5 Sonnet there, $3 in, $0.30 cache hits.
    bedrock = cost_usd(
        "bedrock:us.anthropic.claude-3-5-sonnet-20240620-v1:0", usage(10_000, 0, cache_read=10_000)
    )
    assert bedrock == pytest.approx(10_000 * (3.00 + 0.30) / 1e6)


def test_the_lists_long_prompt_tier_applies() -> None:
    # Claude Sonnet 4.5 above 200k input tokens: every token at $6 in and $22.50 out.
    assert cost_usd("anthropic:claude-sonnet-4-5", usage(300_000, 1_000)) == pytest.approx(
        (300_000 * 6.00 + 1_000 * 22.50) / 1e6
    )


def test_overrides_correct_a_listed_price_field_by_field_and_add_new_models() -> None:
    table = build_price_table(
        {
            "gpt-4.1": {"output": 6.0},
            "openai:qwen3:8b": {"input": 0.0, "output": 0.0},
            "openai:gpt-4o": {"input": 1.0, "output": 2.0},
            "my-model": {"input": 1.0, "output": 2.0, "cache_read": 0.1},
        }
    )
    assert table["gpt-4.1"] == ModelPrice(input=2.00, output=6.0, cache_read=0.50)
    assert cost_usd("openai:gpt-4.1", usage(0, 1_000_000), table) == pytest.approx(6.0)
    assert cost_usd("openai:qwen3:8b", usage(1000, 1000), table) == 0.0
    # `provider:model` is the longer match: it wins over the bare name, for that provider only.
    assert cost_usd("openai:gpt-4o-2024-08-06", usage(1_000_000, 0), table) == pytest.approx(1.0)
    assert cost_usd("openai_responses:gpt-4o", usage(1_000_000, 0), table) == pytest.approx(2.50)
    assert cost_usd("openai:my-model", usage(1_000_000, 0, cache_read=1_000_000), table) == pytest.approx(0.1)
    # No cache rate: cached tokens cost the input rate.
    plain = build_price_table({"plain": {"input": 1.0, "output": 1.0}})
    assert cost_usd("openai:plain", usage(1_000_000, 0, cache_read=500_000), plain) == pytest.approx(1.0)
    # An entry is flat rates: one over a tiered model keeps its first tier's rates whatever the length.
    flat = build_price_table({"anthropic:claude-sonnet-4-5": {"output": 10.0}})
    assert cost_usd("anthropic:claude-sonnet-4-5", usage(300_000, 0), flat) == pytest.approx(0.9)
    assert dict(build_price_table({})) == {}


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


def test_a_model_is_looked_up_once_however_many_calls_it_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    looked: list[tuple[str, str | None]] = []
    find = pricing._find_in_list

    def counting(name: str, provider_id: str | None) -> pricing.ListedModel | None:
        looked.append((name, provider_id))
        return find(name, provider_id)

    monkeypatch.setattr(pricing, "_find_in_list", counting)
    find_listed_model.cache_clear()
    table = build_price_table()
    for _ in range(50):
        assert cost_usd("openai:gpt-5-mini", usage(1000, 100), table) is not None
        assert cost_usd("openai:not-a-listed-model", usage(1000, 100), table) is None
    assert looked == [("gpt-5-mini", "openai"), ("not-a-listed-model", "openai")]
    find_listed_model.cache_clear()


def test_importing_the_module_does_not_load_the_list() -> None:
    # A CLI command that prices nothing never pays for the list (about 0.5 s without bytecode).
    script = (
        "import sys, orchestrator.pricing, orchestrator.context.windows; print('genai_prices' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "False"


# --- the one line an orchestrator logs of a model it cannot price or fit -----------------------------------


class AnsweringModels:
    """Model clients that answer every call "ok", having used 10 tokens in and 5 out."""

    provider = "openai"

    async def get(self, model: str) -> AnsweringModels:
        return self

    async def complete(self, request: ModelRequest, on_delta: DeltaSink | None = None) -> Turn:
        return Turn(
            type="final_answer", text="ok", usage=Usage(input_tokens=10, output_tokens=5, total_tokens=15)
        )

    async def aclose(self) -> None:
        return None


def performer_with(**options: Any) -> Performer:
    return Performer(
        store=FakeStore(),  # type: ignore[arg-type]
        publisher=FakePublisher(),  # type: ignore[arg-type]
        models=AnsweringModels(),  # type: ignore[arg-type]
        catalogue=Serving(),
        **options,
    )


def told(caplog: pytest.LogCaptureFixture, model: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"model {model}:")]


async def test_a_model_without_price_or_window_is_told_of_once_at_its_first_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolloop.orchestrator")
    performer = performer_with()
    for _ in range(3):
        (event,) = await later(await performer.perform("t1", None, call_model("openai:my-local")))  # type: ignore[arg-type]
        assert isinstance(event, ModelResponded) and event.turn.usage.cost_usd is None
        await later(await performer.perform("t1", None, call_model("openai:gpt-5.1")))  # type: ignore[arg-type]
        await later(await performer.perform("t1", None, call_model("scripted:plan")))  # type: ignore[arg-type]
    (line,) = told(caplog, "openai:my-local")
    assert "TOOLLOOP_MODEL_PRICES" in line and "TOOLLOOP_CONTEXT_WINDOWS" in line and "32,768 tokens" in line
    assert told(caplog, "openai:gpt-5.1") == [] and told(caplog, "scripted:plan") == []


async def test_the_configured_models_are_told_of_at_start(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="toolloop.orchestrator")
    performer_with(
        start_models=["openai:gw-priced", "openai:gw-windowed", "scripted:demo", "openai:gpt-4o"],
        prices=build_price_table({"openai:gw-priced": {"input": 1.0, "output": 1.0}}),
        context_windows={"openai:gw-windowed": 64_000},
    )
    (priced,) = told(caplog, "openai:gw-priced")
    assert "TOOLLOOP_CONTEXT_WINDOWS" in priced and "TOOLLOOP_MODEL_PRICES" not in priced
    (windowed,) = told(caplog, "openai:gw-windowed")
    assert "TOOLLOOP_MODEL_PRICES" in windowed and "TOOLLOOP_CONTEXT_WINDOWS" not in windowed
    assert told(caplog, "scripted:demo") == [] and told(caplog, "openai:gpt-4o") == []


def test_the_message_names_what_is_missing() -> None:
    assert build_unknown_model_message("openai:x", priced=True, window_known=True) is None
    both = build_unknown_model_message("openai:x", priced=False, window_known=False)
    assert both is not None and both.startswith("model openai:x: no price")
    assert "limits.max_cost_usd" in both and "32,768" in both


def test_the_deployments_base_urls_reach_the_table() -> None:
    settings = Settings(provider_env={"OPENAI_BASE_URL": GROQ_URL})
    urls = build_api_urls(settings)
    assert urls["openai"] == GROQ_URL and urls["anthropic"] is None
    table = build_price_table(aliases=settings.model_aliases, api_urls=urls)
    assert find_price("openai:llama-3.3-70b-versatile", table) == ModelPrice(input=0.59, output=0.79)
