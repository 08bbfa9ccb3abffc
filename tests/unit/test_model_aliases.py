"""TOOLLOOP_MODEL_ALIASES: a gateway's alias is priced and fitted as the model it stands for, while the
request still names the alias."""

from __future__ import annotations

import logging

import pytest

from orchestrator.context.windows import DEFAULT_CONTEXT_WINDOW_TOKENS, build_context_window
from orchestrator.machine.events import ModelResponded
from orchestrator.model import Turn, Usage
from orchestrator.pricing import build_price_table, cost_usd, find_price, resolve_model_alias
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.deltas import DeltaSink
from orchestrator.runtime.perform import Performer, build_context_budget
from orchestrator.settings import Settings
from tests.support.performer_fakes import FakePublisher, FakeStore, Serving, call_model, later

pytestmark = pytest.mark.timeout(30)

ALIASES = {"openai:gw-model": "openai:gpt-5-mini", "openai:gw-claude": "anthropic:claude-sonnet-4-5"}
USED = Usage(input_tokens=10_000, output_tokens=2_000, total_tokens=12_000)


@pytest.mark.parametrize(
    ("model", "resolved"),
    [
        ("openai:gw-model", "openai:gpt-5-mini"),
        (" openai:gw-model ", "openai:gpt-5-mini"),
        ("openai:gw-claude", "anthropic:claude-sonnet-4-5"),
        ("openai:gpt-5-mini", "openai:gpt-5-mini"),
        ("anthropic:gw-model", "anthropic:gw-model"),  # an alias is its full name, provider and all
        ("gw-model", "gw-model"),
    ],
)
def test_an_alias_resolves_to_its_model_and_nothing_else_does(model: str, resolved: str) -> None:
    assert resolve_model_alias(model, ALIASES) == resolved
    assert resolve_model_alias(model, {}) == model
    assert resolve_model_alias(model, None) == model


def test_an_alias_is_one_step() -> None:
    chained = {"openai:a": "openai:b", "openai:b": "openai:gpt-5-mini"}
    assert resolve_model_alias("openai:a", chained) == "openai:b"


def test_an_alias_is_priced_as_its_model() -> None:
    table = build_price_table(aliases=ALIASES)
    # gpt-5-mini: $0.25 in, $2 out per million tokens.
    assert cost_usd("openai:gw-model", USED, table) == pytest.approx((10_000 * 0.25 + 2_000 * 2.00) / 1e6)
    assert find_price("openai:gw-model", table) == find_price("openai:gpt-5-mini")
    # Without the alias the gateway's name has no price: the loss this setting mends.
    assert cost_usd("openai:gw-model", USED) is None


def test_the_deployments_own_entry_for_an_alias_comes_first() -> None:
    table = build_price_table({"openai:gw-model": {"input": 1.0, "output": 1.0}}, aliases=ALIASES)
    assert cost_usd("openai:gw-model", USED, table) == pytest.approx(12_000 / 1e6)
    # And an entry for the model it stands for prices the alias too.
    target = build_price_table({"openai:gpt-5-mini": {"input": 0.0, "output": 0.0}}, aliases=ALIASES)
    assert cost_usd("openai:gw-model", USED, target) == 0.0


def test_an_alias_to_an_unpriced_model_has_no_price() -> None:
    table = build_price_table(aliases={"openai:gw-x": "openai:not-listed"})
    assert cost_usd("openai:gw-x", USED, table) is None


def test_cached_tokens_are_counted_the_way_of_the_wire_the_alias_is_called_on() -> None:
    # A Claude model behind an OpenAI-compatible gateway reports usage the OpenAI way: cached tokens are part
    # of the input count. claude-sonnet-4-5: $3 in, $0.30 cache hits.
    table = build_price_table(aliases=ALIASES)
    cached = Usage(input_tokens=10_000, output_tokens=0, total_tokens=10_000, cache_read_tokens=4_000)
    assert cost_usd("openai:gw-claude", cached, table) == pytest.approx((6_000 * 3.00 + 4_000 * 0.30) / 1e6)


def test_an_alias_is_fitted_to_its_models_window() -> None:
    assert build_context_window("openai:gw-model") == DEFAULT_CONTEXT_WINDOW_TOKENS
    assert build_context_window("openai:gw-model", None, ALIASES) == build_context_window("openai:gpt-5-mini")
    assert build_context_window("openai:gw-claude", None, ALIASES) == 200_000
    # A window named for the alias comes first, then one named for its model.
    assert build_context_window("openai:gw-model", {"openai:gw-model": 50_000}, ALIASES) == 50_000
    assert build_context_window("openai:gw-model", {"gpt-5-mini": 60_000}, ALIASES) == 60_000


def test_a_new_turn_on_an_alias_starts_with_its_models_window() -> None:
    settings = Settings(model_aliases=ALIASES)
    budget = build_context_budget(["openai:gw-model", "openai:gw-claude"], settings, {})
    assert budget.window_tokens == build_context_window("openai:gpt-5-mini")
    assert budget.model_windows == {"openai:gw-claude": 200_000}


def test_the_settings_read_the_aliases_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLLOOP_MODEL_ALIASES", '{"openai:gw-model": "openai:gpt-5-mini"}')
    assert Settings().model_aliases == {"openai:gw-model": "openai:gpt-5-mini"}


class RecordingModels:
    """Model clients that keep each request and answer "ok" with `USED`."""

    provider = "openai"

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def get(self, model: str) -> RecordingModels:
        return self

    async def complete(self, request: ModelRequest, on_delta: DeltaSink | None = None) -> Turn:
        self.requests.append(request)
        return Turn(type="final_answer", text="ok", usage=USED)

    async def aclose(self) -> None:
        return None


async def test_a_call_on_an_alias_names_the_alias_and_costs_its_models_price(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="toolloop.orchestrator")
    models = RecordingModels()
    performer = Performer(
        store=FakeStore(),  # type: ignore[arg-type]
        publisher=FakePublisher(),  # type: ignore[arg-type]
        models=models,  # type: ignore[arg-type]
        catalogue=Serving(),
        prices=build_price_table(aliases=ALIASES),
    )
    (event,) = await later(await performer.perform("t1", None, call_model("openai:gw-model")))  # type: ignore[arg-type]
    assert isinstance(event, ModelResponded)
    assert event.turn.usage.cost_usd == pytest.approx(cost_usd("openai:gpt-5-mini", USED))
    assert [request.model for request in models.requests] == ["gw-model"]
    assert performer.unpriced(["openai:gw-model"]) == []
    assert not [
        r for r in caplog.records if "gw-model" in r.getMessage()
    ]  # priced and fitted: nothing to tell
