"""A model's context window, and the tokens kept back for the answer.

A window is the model's whole context in tokens (prompt and answer). It is found, first match wins:

1. `TOOLLOOP_CONTEXT_WINDOWS` (`overrides`), by the longest key that starts the model's name — the name as
   called, then, for an alias (TOOLLOOP_MODEL_ALIASES), the model it stands for;
2. genai-prices' list (`pricing.find_listed_model`, the list that prices the model), held to
   `INPUT_LIMIT_TOKENS` where the provider takes less input than the window it states;
3. `FALLBACK_CONTEXT_WINDOWS`, by name prefix: only what the list lacks — open-weight models as vLLM or
   Ollama serve them, and families it lists without a window;
4. `DEFAULT_CONTEXT_WINDOW_TOKENS`: the window is unknown (`find_context_window` says None).

A provider's over-long-context error that states the real window teaches it for later calls
(`runtime.perform`). Scripted models read no context: their window is unbounded unless named.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.pricing import find_listed_model, resolve_model_alias, split_model_name
from orchestrator.providers.profiles import PROFILES

DEFAULT_CONTEXT_WINDOW_TOKENS = 32_768
# The scripted models (the demo, the tests, the bench) play a plan and read no context: nothing to fit,
# unless `TOOLLOOP_CONTEXT_WINDOWS` names a window for them (a test of trimming does).
UNBOUNDED_PROVIDERS = frozenset(name for name, profile in PROFILES.items() if profile.unbounded_context)
UNBOUNDED_WINDOW_TOKENS = 2**40

# Names are matched by prefix, lower-cased, after any `org/` path (`meta-llama/Llama-3.1-8B-Instruct`) and
# any dotted vendor or region prefix (`us.anthropic.claude-…` on Bedrock); the longest matching prefix wins.

INPUT_LIMIT_TOKENS: Mapping[str, int] = {
    # OpenAI's gpt-5 family states a 400k window of which at most 272k input: conservative, the smaller.
    "gpt-5": 272_000,
}
"""Input limits below the window the list states, by model-name prefix: the window is taken as the smaller."""

FALLBACK_CONTEXT_WINDOWS: Mapping[str, int] = {
    # Families the list prices without a window (Gemini 2.5 Pro and the previews, Gemma 3, Cohere Command,
    # Mistral's), or not yet (a Claude model newer than the locked list).
    "claude-": 200_000,
    "gemini-": 1_048_576,
    "gemma-3": 131_072,
    "gemma3": 131_072,
    "command-r": 128_000,
    "command-a": 256_000,
    "mistral-large": 131_072,
    "mistral-medium": 131_072,
    "mistral-small": 32_768,
    "mistral-nemo": 131_072,
    "open-mistral-nemo": 131_072,
    "mistral": 32_768,
    "mixtral": 32_768,
    "codestral": 32_768,
    # Open-weight models as vLLM or Ollama serve them by default
    "gpt-oss": 131_072,
    "llama-3.1": 131_072,
    "llama-3.2": 131_072,
    "llama-3.3": 131_072,
    "llama3.1": 131_072,
    "llama3.2": 131_072,
    "llama3.3": 131_072,
    "llama-4": 131_072,
    "llama4": 131_072,
    "llama-3": 8_192,
    "llama3": 8_192,
    "qwen2.5": 32_768,
    "qwen3": 32_768,
    "qwen": 32_768,
    "deepseek": 65_536,
}
"""Windows of what genai-prices' list lacks, by model-name prefix, in tokens."""

# The answer's share of the window when the request names no maximum output: an eighth, within bounds.
_RESERVE_SHARE = 8
_RESERVE_MIN_TOKENS = 256
_RESERVE_MAX_TOKENS = 32_000


def _name_forms(model: str) -> list[str]:
    """`model` lower-cased without its `org/` path, then without each dotted prefix in turn."""
    base = model.strip().lower().rsplit("/", 1)[-1]
    return [base, *(base[i + 1 :] for i, char in enumerate(base) if char == ".")]


def _longest_prefix(names: list[str], table: Mapping[str, int]) -> int | None:
    best: tuple[int, int] | None = None
    for prefix, tokens in table.items():
        key = prefix.lower()
        if any(name.startswith(key) for name in names) and (best is None or len(key) > best[0]):
            best = (len(key), tokens)
    return None if best is None else best[1]


def find_context_window(
    model: str, overrides: Mapping[str, int] | None = None, aliases: Mapping[str, str] | None = None
) -> int | None:
    """The context window of `model` (`provider:model` or a bare model name) in tokens, or None when nothing
    knows it: `overrides` (TOOLLOOP_CONTEXT_WINDOWS), then the list, then the fallback table. An alias
    (`aliases`, TOOLLOOP_MODEL_ALIASES) is fitted as the model it stands for."""
    target = resolve_model_alias(model, aliases)
    if overrides:
        for name in dict.fromkeys((model, target)):
            forms = [name.strip().lower(), *_name_forms(split_model_name(name)[1])]
            named = _longest_prefix(forms, overrides)
            if named is not None:
                return named
    if split_model_name(model)[0] in UNBOUNDED_PROVIDERS:
        return UNBOUNDED_WINDOW_TOKENS
    forms = _name_forms(split_model_name(target)[1])
    listed = find_listed_model(target)
    if listed is not None and listed.context_window:
        limit = _longest_prefix(forms, INPUT_LIMIT_TOKENS)
        return listed.context_window if limit is None else min(listed.context_window, limit)
    return _longest_prefix(forms, FALLBACK_CONTEXT_WINDOWS)


def build_context_window(
    model: str, overrides: Mapping[str, int] | None = None, aliases: Mapping[str, str] | None = None
) -> int:
    """The context window of `model` in tokens (`find_context_window`), `DEFAULT_CONTEXT_WINDOW_TOKENS` when
    nothing knows it."""
    window = find_context_window(model, overrides, aliases)
    return DEFAULT_CONTEXT_WINDOW_TOKENS if window is None else window


def build_output_reserve(window_tokens: int, max_output_tokens: int | None = None) -> int:
    """Tokens of the window kept for the answer: the request's maximum output, else a default share."""
    if max_output_tokens is not None:
        return min(max_output_tokens, window_tokens // 2)
    return max(_RESERVE_MIN_TOKENS, min(window_tokens // _RESERVE_SHARE, _RESERVE_MAX_TOKENS))


# How a provider's over-long-context error reads once normalised (`orchestrator.providers.overflow`): this
# code, and in `details` the window and the prompt's size in tokens where the provider states them.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
WINDOW_DETAIL = "context_window_tokens"
PROMPT_DETAIL = "prompt_tokens"
