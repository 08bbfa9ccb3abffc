"""Anthropic Messages: extended thinking, prompt caching, and an answer tool for an output schema."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from orchestrator.model import ModelSettings, ReasoningEffort
from orchestrator.providers.profile import Endpoint, ProviderProfile

API_VERSION = "2023-06-01"
# Extended thinking's budget per effort; Anthropic's least budget is 1024 tokens.
THINKING_BUDGET_TOKENS: Mapping[ReasoningEffort, int] = MappingProxyType(
    {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384}
)
MIN_THINKING_BUDGET_TOKENS = 1024
MAX_TEMPERATURE = 1.0
THINKING_MIN_TOP_P = 0.95


def build_thinking_budget(effort: ReasoningEffort, max_tokens: int | None) -> int:
    """The thinking budget for `effort`, left at least 1024 tokens short of `max_tokens` when that is set
    (Anthropic wants the budget below max_tokens) and never under Anthropic's least budget."""
    budget = THINKING_BUDGET_TOKENS[effort]
    if max_tokens is not None:
        budget = min(budget, max_tokens - MIN_THINKING_BUDGET_TOKENS)
    return max(budget, MIN_THINKING_BUDGET_TOKENS)


def check_controls(settings: ModelSettings, tool_choice: str | None) -> list[str]:
    """What Anthropic refuses in combination: a temperature above 1, and beside extended thinking a
    temperature, a narrow top_p, too small a max_output_tokens or a forced tool."""
    refusals: list[str] = []
    if settings.temperature is not None and settings.temperature > MAX_TEMPERATURE:
        refusals.append(
            f"temperature above {MAX_TEMPERATURE:g} is not supported by anthropic "
            f"(got {settings.temperature:g})"
        )
    if settings.reasoning_effort is None:
        return refusals
    if settings.temperature is not None:
        refusals.append(
            "temperature cannot be combined with reasoning_effort on anthropic (extended thinking)"
        )
    if settings.top_p is not None and settings.top_p < THINKING_MIN_TOP_P:
        refusals.append(
            f"top_p below {THINKING_MIN_TOP_P} cannot be combined with reasoning_effort on "
            "anthropic (extended thinking)"
        )
    if settings.max_output_tokens is not None and settings.max_output_tokens <= MIN_THINKING_BUDGET_TOKENS:
        refusals.append(
            f"max_output_tokens must be above {MIN_THINKING_BUDGET_TOKENS} with reasoning_effort on "
            "anthropic (the least thinking budget)"
        )
    if tool_choice is not None and tool_choice not in ("auto", "none"):
        refusals.append(
            f"tool_choice {tool_choice!r} cannot be combined with reasoning_effort on anthropic "
            "(extended thinking cannot force a tool)"
        )
    return refusals


PROFILE = ProviderProfile(
    name="anthropic",
    wire="orchestrator.providers.anthropic",
    summary="Anthropic Messages at ANTHROPIC_BASE_URL (without /v1, as in Anthropic's SDK)",
    wire_family="anthropic",
    endpoint=Endpoint(
        default_base_url="https://api.anthropic.com",
        base_url_variable="ANTHROPIC_BASE_URL",
        key_variable="ANTHROPIC_API_KEY",
        auth="header",
        key_header="x-api-key",
        headers=MappingProxyType({"anthropic-version": API_VERSION}),
    ),
    # Anthropic rejects ids outside ^[a-zA-Z0-9_-]+$.
    tool_call_id_max_chars=64,
    unsupported_settings=("seed",),
    owned_fields=("model", "messages", "stream"),
    check_controls=check_controls,
    structured_output="answer_tool",
    genai_name="anthropic",
    prices_provider="anthropic",
    # Anthropic's input_tokens leave out the cache reads and writes it reports beside them.
    cache_apart=True,
    detect_rank=40,
    unmistakable=True,
    aliases=("claude",),
)
