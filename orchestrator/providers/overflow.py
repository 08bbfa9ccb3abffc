"""Over-long-context errors, normalised: one `ProviderError` code whatever the provider.

Each provider says "the prompt does not fit" its own way; `mark_context_overflow` gives all of them
`code="context_length_exceeded"` and, where the message states them, the model's window and the prompt's
size in tokens in `details` (`context_window_tokens`, `prompt_tokens`), which the state machine reads to
shrink the view and call again, and the runtime to remember the window for later turns:

    OpenAI (and Groq, xAI, DeepSeek…)  code "context_length_exceeded": "This model's maximum context length
                                     is M tokens. However, your messages resulted in N tokens…", or
                                     "Input tokens exceed the configured limit of M tokens. Your messages
                                     resulted in N tokens…"
    vLLM, OpenAI-compatible servers  400 "This model's maximum context length is M tokens. However, you
                                     requested N tokens…" (or "…your request has N input tokens")
    Anthropic (and Bedrock)          400 invalid_request_error "prompt is too long: N tokens > M maximum";
                                     Bedrock's "Input is too long for requested model"
    Gemini                           400 INVALID_ARGUMENT "The input token count (N) exceeds the maximum
                                     number of tokens allowed (M)."
    Mistral                          "Prompt contains N tokens … too large for model with M maximum context
                                     length"
    Cohere                           "too many tokens: … cannot exceed M - received N"
"""

from __future__ import annotations

import re

from orchestrator.context.windows import CONTEXT_LENGTH_EXCEEDED, PROMPT_DETAIL, WINDOW_DETAIL
from orchestrator.model import ProviderError

_N = r"([\d,]+)"
# (pattern, group of the window, group of the prompt's tokens); 0: not stated.
_PATTERNS: tuple[tuple[re.Pattern[str], int, int], ...] = (
    (re.compile(rf"maximum context length is {_N} tokens", re.I), 1, 0),
    (re.compile(rf"configured limit of {_N} tokens", re.I), 1, 0),
    (re.compile(rf"prompt is too long: {_N} tokens > {_N} maximum", re.I), 2, 1),
    (
        re.compile(
            rf"input token count \(?{_N}\)? exceeds the maximum number of tokens allowed \(?{_N}\)?", re.I
        ),
        2,
        1,
    ),
    (re.compile(rf"prompt contains {_N} tokens.*too large for model with {_N} maximum context", re.I), 2, 1),
    (re.compile(rf"too many tokens:.*exceed {_N}\D+received {_N}", re.I), 1, 2),
    (
        re.compile(
            r"input is too long for requested model|prompt is too long|exceeds the context (?:length|window)",
            re.I,
        ),
        0,
        0,
    ),
)
# How the prompt's size is said when the pattern that matched does not say it.
_PROMPT = re.compile(
    rf"(?:resulted in|you requested|your request has|prompt contains) {_N}(?: input)? tokens", re.I
)


def mark_context_overflow(error: ProviderError) -> ProviderError:
    """`error` with code `context_length_exceeded` and the stated sizes, when it says the prompt is too
    long for the model; else `error` unchanged."""
    coded = error.code == CONTEXT_LENGTH_EXCEEDED
    window = prompt = None
    matched = False
    for pattern, window_group, prompt_group in _PATTERNS:
        found = pattern.search(error.message)
        if found is None:
            continue
        matched = True
        window = _number(found.group(window_group)) if window_group else None
        prompt = _number(found.group(prompt_group)) if prompt_group else None
        break
    if not (coded or matched):
        return error
    if prompt is None and (said := _PROMPT.search(error.message)) is not None:
        prompt = _number(said.group(1))
    details = dict(error.details or {})
    if error.code and not coded:
        details["provider_code"] = error.code
    if window is not None:
        details[WINDOW_DETAIL] = window
    if prompt is not None:
        details[PROMPT_DETAIL] = prompt
    return error.model_copy(
        update={"code": CONTEXT_LENGTH_EXCEEDED, "retryable": False, "details": details or None}
    )


def _number(text: str) -> int | None:
    digits = text.replace(",", "")
    return int(digits) if digits.isdigit() and int(digits) > 0 else None
