"""Which model settings each provider honours: refusals as plain messages, decided before a turn
is stored, so that a setting is never dropped silently.

    setting              openai / scripted (Chat)  openai_responses     anthropic
    temperature          temperature               temperature          temperature (0-1; not with thinking)
    top_p                top_p                     top_p                top_p (>= 0.95 with thinking)
    max_output_tokens    max_completion_tokens     max_output_tokens    max_tokens (always sent)
    stop                 stop (at most 4)          refused              stop_sequences
    seed                 seed                      refused              refused
    reasoning_effort     reasoning_effort          reasoning.effort     thinking.budget_tokens
    parallel_tool_calls  parallel_tool_calls       parallel_tool_calls  tool_choice.disable_parallel_tool_use
    extra                merged into the body last, replacing what toolloop built (model, messages / input
                         and stream are refused: toolloop owns them)

A provider outside this table (none today) refuses nothing here: `check_model_name` refuses its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema

from orchestrator.model import ModelSettings, ReasoningEffort
from orchestrator.providers.traits import provider_of

# OpenAI's published schema takes at most four stop sequences (`StopConfiguration`).
CHAT_MAX_STOP_SEQUENCES = 4
# Extended thinking's budget per effort; Anthropic's least budget is 1024 tokens.
THINKING_BUDGET_TOKENS: Mapping[ReasoningEffort, int] = {
    "minimal": 1024,
    "low": 2048,
    "medium": 8192,
    "high": 16384,
}
MIN_THINKING_BUDGET_TOKENS = 1024
ANTHROPIC_MAX_TEMPERATURE = 1.0
ANTHROPIC_THINKING_MIN_TOP_P = 0.95

_CHAT = "chat"
_FAMILIES = {
    "openai": _CHAT,
    "openai_chat": _CHAT,
    "scripted": _CHAT,
    "openai_responses": "responses",
    "anthropic": "anthropic",
}
_UNSUPPORTED: Mapping[str, tuple[str, ...]] = {
    _CHAT: (),
    "responses": ("stop", "seed"),
    "anthropic": ("seed",),
}
_OWNED_FIELDS: Mapping[str, tuple[str, ...]] = {
    _CHAT: ("model", "messages", "stream", "stream_options"),
    "responses": ("model", "input", "stream"),
    "anthropic": ("model", "messages", "stream"),
}


def refuse_controls(
    provider: str,
    settings: ModelSettings,
    *,
    output_schema: Mapping[str, Any] | None = None,
    tool_choice: str | None = None,
) -> list[str]:
    """One message per setting `provider` cannot honour (naming the setting and the provider); [] when it
    can honour them all. `tool_choice` is the turn's, which Anthropic's extended thinking restricts."""
    provider = provider.strip().lower()
    family = _FAMILIES.get(provider)
    if family is None:
        return []
    refusals = [
        f"{name} is not supported by {provider}"
        for name in _UNSUPPORTED[family]
        if getattr(settings, name) is not None
    ]
    refusals.extend(
        f"extra.{key} is not allowed: toolloop builds {key!r} itself"
        for key in _OWNED_FIELDS[family]
        if key in settings.extra
    )
    if family == _CHAT and settings.stop is not None and len(settings.stop) > CHAT_MAX_STOP_SEQUENCES:
        refusals.append(
            f"stop: {provider} takes at most {CHAT_MAX_STOP_SEQUENCES} sequences (got {len(settings.stop)})"
        )
    if family == "anthropic":
        refusals.extend(_refuse_anthropic(settings, tool_choice))
    if output_schema is not None:
        refusals.extend(refuse_output_schema(provider, output_schema))
    return refusals


def refuse_model_controls(
    model: str,
    settings: ModelSettings,
    *,
    output_schema: Mapping[str, Any] | None = None,
    tool_choice: str | None = None,
) -> list[str]:
    """`refuse_controls` for a model named `provider:model` (a tier must be resolved first: a name without a
    provider refuses nothing)."""
    if ":" not in model:
        return []
    return refuse_controls(provider_of(model), settings, output_schema=output_schema, tool_choice=tool_choice)


def refuse_output_schema(provider: str, schema: Mapping[str, Any]) -> list[str]:
    """An output schema must be a valid JSON Schema describing an object: the answer is a JSON object on
    every provider (OpenAI's formats and Anthropic's answer tool take nothing else)."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        return [f"output_schema is not a valid JSON Schema: {exc.message}"]
    kind = schema.get("type")
    if kind != "object" and not (kind is None and "properties" in schema):
        return [f"output_schema must describe a JSON object (type: object) for {provider}"]
    return []


def _refuse_anthropic(settings: ModelSettings, tool_choice: str | None) -> list[str]:
    refusals: list[str] = []
    if settings.temperature is not None and settings.temperature > ANTHROPIC_MAX_TEMPERATURE:
        refusals.append(
            f"temperature above {ANTHROPIC_MAX_TEMPERATURE:g} is not supported by anthropic "
            f"(got {settings.temperature:g})"
        )
    if settings.reasoning_effort is None:
        return refusals
    # Extended thinking: Anthropic refuses a temperature, a narrow top_p and a forced tool beside it.
    if settings.temperature is not None:
        refusals.append(
            "temperature cannot be combined with reasoning_effort on anthropic (extended thinking)"
        )
    if settings.top_p is not None and settings.top_p < ANTHROPIC_THINKING_MIN_TOP_P:
        refusals.append(
            f"top_p below {ANTHROPIC_THINKING_MIN_TOP_P} cannot be combined with reasoning_effort on "
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


def build_thinking_budget(effort: ReasoningEffort, max_tokens: int | None) -> int:
    """The thinking budget for `effort`, left at least 1024 tokens short of `max_tokens` when that is set
    (Anthropic wants the budget below max_tokens) and never under Anthropic's least budget."""
    budget = THINKING_BUDGET_TOKENS[effort]
    if max_tokens is not None:
        budget = min(budget, max_tokens - MIN_THINKING_BUDGET_TOKENS)
    return max(budget, MIN_THINKING_BUDGET_TOKENS)


def build_extra(body: dict[str, Any], settings: ModelSettings) -> dict[str, Any]:
    """`body` with `settings.extra` merged in last: a key there replaces what toolloop built (shallowly)."""
    return {**body, **settings.extra} if settings.extra else body
