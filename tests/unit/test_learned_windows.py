"""The orchestrator remembers a model's context window a provider stated, for later turns."""

from __future__ import annotations

import httpx
import pytest

from orchestrator.context.windows import (
    DEFAULT_CONTEXT_WINDOW_TOKENS,
    UNBOUNDED_WINDOW_TOKENS,
    build_context_window,
    find_context_window,
)
from orchestrator.machine.events import ModelFailed
from orchestrator.providers.registry import ModelClients
from orchestrator.runtime.perform import Performer, build_context_budget
from orchestrator.settings import Settings
from tests.support.context_model import build_overflow_body
from tests.support.performer_fakes import FakePublisher, FakeStore, Serving, call_model, later

pytestmark = pytest.mark.timeout(30)


def small_window_http(window: int) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json=build_overflow_body(window, len(request.content)))

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


async def test_a_stated_window_is_remembered_for_the_model() -> None:
    http = small_window_http(15_000)
    settings = Settings(provider_env={"OPENAI_BASE_URL": "http://model.test/v1", "OPENAI_API_KEY": "sk-test"})
    performer = Performer(
        store=FakeStore(),  # type: ignore[arg-type]
        publisher=FakePublisher(),  # type: ignore[arg-type]
        models=ModelClients(settings, http, max_retries=0),
        catalogue=Serving(),
    )
    (event,) = await later(await performer.perform("t1", None, call_model("openai:small")))  # type: ignore[arg-type]
    assert isinstance(event, ModelFailed)
    assert event.error.code == "context_length_exceeded"
    assert performer.learned_windows == {"openai:small": 15_000}
    await http.aclose()


@pytest.mark.parametrize(
    ("model", "windows", "learned", "expected"),
    [
        ("openai:small", {}, {"openai:small": 15_000}, 15_000),
        ("openai:small", {"small": 8_000}, {"openai:small": 15_000}, 8_000),
        ("openai:gpt-4o", {}, {}, 128_000),
        ("openai:gpt-4o", {}, {"openai:gpt-4o-mini": 1_000}, 128_000),
        ("openai:unknown", {"openai:unknown": 64_000}, {}, 64_000),
    ],
)
def test_a_new_turn_starts_from_the_smaller_of_the_named_and_the_learned_window(
    model: str, windows: dict[str, int], learned: dict[str, int], expected: int
) -> None:
    settings = Settings(context_windows=windows, compaction=True)
    budget = build_context_budget(model, settings, learned)
    assert (budget.window_tokens, budget.compaction) == (expected, True)


def test_the_settings_read_the_windows_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLLOOP_CONTEXT_WINDOWS", '{"openai:my-model": 16000, "llama-local": 8192}')
    monkeypatch.setenv("TOOLLOOP_CONTEXT_OUTPUT_RESERVE_TOKENS", "1000")
    monkeypatch.setenv("TOOLLOOP_COMPACTION", "true")
    settings = Settings()
    assert settings.context_windows == {"openai:my-model": 16_000, "llama-local": 8_192}
    assert (settings.context_output_reserve_tokens, settings.compaction) == (1_000, True)


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("openai:gpt-5.1", 272_000),  # the list's 400k window, held to gpt-5's 272k of input
        ("openai:gpt-4o-mini", 128_000),
        ("openai:o3", 200_000),
        ("anthropic:claude-haiku-4-5", 200_000),
        ("gemini:gemini-2.5-flash", 1_048_576),
        ("bedrock:us.anthropic.claude-3-5-sonnet-20240620-v1:0", 200_000),
        ("gemini:gemini-2.5-pro", 1_048_576),  # listed without a window: the fallback table's
        ("cohere:command-a-03-2025", 256_000),
        ("openai:llama3.1:8b", 131_072),  # open-weight, as Ollama serves it
        ("openai:gpt-oss:20b", 131_072),
        ("anthropic:claude-future-9", 200_000),  # a Claude newer than the locked list
    ],
)
def test_windows_come_from_the_price_list_then_the_fallback_table(model: str, window: int) -> None:
    assert find_context_window(model) == window


def test_a_model_nothing_knows_has_no_window_and_is_fitted_to_the_default() -> None:
    assert find_context_window("openai:my-finetune") is None
    assert build_context_window("openai:my-finetune") == DEFAULT_CONTEXT_WINDOW_TOKENS
    assert find_context_window("openai:my-finetune", {"openai:my-finetune": 9_000}) == 9_000
    assert find_context_window("scripted:plan") == UNBOUNDED_WINDOW_TOKENS
