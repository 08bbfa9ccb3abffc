"""Known context windows, by model-name prefix, and the tokens kept back for the answer.

A window is the model's whole context in tokens (prompt and answer). The table is conservative where a
vendor states two figures (gpt-5 takes at most 272k input tokens of its 400k window); a model it does not
know gets `DEFAULT_CONTEXT_WINDOW_TOKENS`, and a provider's over-long-context error that states the real
window teaches it for later calls. `TOOLLOOP_CONTEXT_WINDOWS` names others.
"""

from __future__ import annotations

from collections.abc import Mapping

DEFAULT_CONTEXT_WINDOW_TOKENS = 32_768
# The scripted models (the demo, the tests, the bench) play a plan and read no context: nothing to fit,
# unless `TOOLLOOP_CONTEXT_WINDOWS` names a window for them (a test of trimming does).
UNBOUNDED_PROVIDERS = frozenset({"scripted"})
UNBOUNDED_WINDOW_TOKENS = 2**40

# Model-name prefix → window in tokens; the longest matching prefix wins. Names are matched lower-cased,
# after any `org/` path (`meta-llama/Llama-3.1-8B-Instruct`) and any dotted vendor or region prefix
# (`us.anthropic.claude-…` on Bedrock).
KNOWN_CONTEXT_WINDOWS: Mapping[str, int] = {
    # OpenAI
    "gpt-5": 272_000,
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "chatgpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4-32k": 32_768,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "gpt-oss": 131_072,
    "o1": 200_000,
    "o1-mini": 128_000,
    "o1-preview": 128_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    # Anthropic
    "claude-": 200_000,
    "claude-2": 100_000,
    "claude-instant": 100_000,
    # Google
    "gemini-": 1_048_576,
    "gemini-1.5-pro": 2_097_152,
    "gemini-1.0": 32_760,
    "gemini-pro": 32_760,
    "gemma-3": 131_072,
    "gemma3": 131_072,
    # Open-weight models as vLLM or Ollama serve them by default
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
    "mistral-large": 131_072,
    "mistral-medium": 131_072,
    "mistral-small": 32_768,
    "mistral-nemo": 131_072,
    "open-mistral-nemo": 131_072,
    "mistral": 32_768,
    "mixtral": 32_768,
    "codestral": 32_768,
    "qwen2.5": 32_768,
    "qwen3": 32_768,
    "qwen": 32_768,
    "deepseek": 65_536,
    "command-r": 128_000,
    "command-a": 256_000,
}

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


def build_context_window(model: str, overrides: Mapping[str, int] | None = None) -> int:
    """The context window of `model` (`provider:model` or a bare model name), in tokens.

    `overrides` (TOOLLOOP_CONTEXT_WINDOWS) are matched first, by the longest key that starts the full
    `provider:model` name or the model name alone; then the known table; then the default.
    """
    provider, sep, name = model.partition(":")
    bare = name if sep else provider
    if overrides:
        forms = [model.strip().lower(), *_name_forms(bare)]
        named = _longest_prefix(forms, overrides)
        if named is not None:
            return named
    if sep and provider.strip().lower() in UNBOUNDED_PROVIDERS:
        return UNBOUNDED_WINDOW_TOKENS
    known = _longest_prefix(_name_forms(bare), KNOWN_CONTEXT_WINDOWS)
    return known if known is not None else DEFAULT_CONTEXT_WINDOW_TOKENS


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
