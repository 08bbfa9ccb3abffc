"""Any provider's response body or stream → a Turn or a ProviderError (docs/design/providers.md).

`from_response` takes raw bytes, text (JSON, SSE or NDJSON) or an already-decoded body, finds the wire
format (from the provider name the caller gives, else from the body's shape) and hands it to that
format's module. Every name a provider goes by (`groq`, `deepseek`, `vllm`, `ollama_openai_compat` …)
maps to the module that reads its wire format; most speak OpenAI Chat Completions.

The names come from the providers' profiles (`providers.profiles`: each one's name and aliases), and so
does the order in which wire modules are asked whether an unlabelled body is theirs (`detect_rank`): each
wire module answers for its own shape (`sniff_body`, `sniff_event`, `sniff_error`, and `sniff_ndjson` for
one that streams JSON lines). Modules are imported by name when first needed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

from orchestrator.model import ProviderError, Turn
from orchestrator.providers.body import (
    decode_json,
    decode_text,
    invalid_response,
    is_error_body,
)
from orchestrator.providers.common import IdSource, parse_sse
from orchestrator.providers.profile import ProviderProfile
from orchestrator.providers.profiles import PROFILES, all_aliases, canonical_name


class ProviderModule(Protocol):
    """What every wire-format module under `orchestrator.providers` exposes to detection."""

    PROVIDER: str

    def from_wire(self, body: object, *, ids: IdSource | None = None) -> Turn | ProviderError: ...

    def from_stream(self, text: str, *, ids: IdSource | None = None) -> Turn | ProviderError: ...

    def error_from_wire(
        self, status: int | None, body: object, headers: Mapping[str, str] | None = None
    ) -> ProviderError: ...

    def sniff_body(self, body: object) -> bool: ...

    def sniff_event(self, event_name: str | None, data: object) -> bool: ...

    def sniff_error(self, body: dict[str, Any]) -> bool: ...


def _wire_name(profile: ProviderProfile) -> str:
    return profile.wire.rsplit(".", 1)[1]


ALIASES: dict[str, str] = {alias: _wire_name(profile) for alias, profile in all_aliases().items()}
"""Every name a provider goes by (its profile's name and aliases) → the wire module that reads its bodies."""

_RANKED: tuple[str, ...] = tuple(
    dict.fromkeys(
        _wire_name(profile)
        for profile in sorted(PROFILES.values(), key=lambda p: (p.detect_rank or 0, p.name))
        if profile.detect_rank is not None
    )
)
# The format of a body no other format claims: the last one asked (a bare message or list of tool calls).
_LAST_RESORT = _RANKED[-1]
# Wire formats whose shape no other format shares: when the body has one, it decides over the name given
# ("openai" serves both Chat Completions and the Responses API; Gemini also serves Chat Completions).
_UNMISTAKABLE = frozenset(_wire_name(profile) for profile in PROFILES.values() if profile.unmistakable)


def resolve_provider(provider: str) -> str | None:
    """The module that reads `provider`'s wire format, or None for a name nobody uses."""
    return ALIASES.get(canonical_name(provider))


def load_module(name: str) -> ProviderModule:
    """The wire-format module `orchestrator.providers.<name>`."""
    return cast(ProviderModule, importlib.import_module(f"orchestrator.providers.{name}"))


def _first(question: Callable[[ProviderModule], bool], among: Sequence[str] = _RANKED) -> str | None:
    """The first wire module, in detection order, that answers yes."""
    return next((name for name in among if question(load_module(name))), None)


def from_response(
    body: str | bytes | object,
    *,
    provider: str | None = None,
    status: int | None = None,
    ids: IdSource | None = None,
    headers: Mapping[str, str] | None = None,
) -> Turn | ProviderError:
    """Normalise one response body or whole stream; never raises on a bad body.

    `provider` is any alias in `ALIASES` (None: detect from the body); `status` the HTTP status (>= 400
    makes it an error body); pass one `ids` through every response of a turn so synthetic tool-call
    ids stay unique across the turn.
    """
    hinted = None
    label = None
    if provider is not None:
        hinted = resolve_provider(provider)
        label = canonical_name(provider)
        if hinted is None:
            known = ", ".join(sorted(ALIASES))
            return ProviderError(
                provider=provider,
                type="unknown_provider",
                message=f"unknown provider {provider!r}; known: {known}",
            )
    source = ids or IdSource()
    if isinstance(body, str | bytes):
        text = decode_text(body, label or "unknown")
        if isinstance(text, ProviderError):
            return text
        result = _from_text(text, hinted, status, source, headers)
    else:
        result = _from_body(body, hinted, status, source, headers)
    if isinstance(result, ProviderError) and label and result.provider != label:
        return result.model_copy(update={"provider": label})
    return result


def _from_text(
    text: str, hinted: str | None, status: int | None, ids: IdSource, headers: Mapping[str, str] | None
) -> Turn | ProviderError:
    stripped = text.strip()
    if not stripped:
        if status is not None and status >= 400:
            return load_module(hinted or _LAST_RESORT).error_from_wire(status, "", headers)
        return invalid_response(hinted or "unknown", "empty response body", retryable=True)
    if status is not None and status >= 400:
        parsed = decode_json(stripped, hinted or "unknown")
        error_body = stripped if isinstance(parsed, ProviderError) else parsed
        return _error(error_body, hinted, status, headers)
    if _looks_like_sse(stripped):
        return _from_sse(text, hinted, ids)
    parsed = decode_json(stripped, hinted or "unknown")
    if isinstance(parsed, ProviderError):
        lines = [line for line in stripped.splitlines() if line.strip()]
        if len(lines) > 1 and all(line.lstrip().startswith("{") for line in lines):
            return _from_ndjson(stripped, lines, hinted, ids)
        return parsed
    return _from_body(parsed, hinted, status, ids, headers)


def _looks_like_sse(text: str) -> bool:
    first = text.lstrip().split("\n", 1)[0]
    return first.startswith(("data:", "event:", ":", "id:", "retry:"))


def _from_body(
    body: object, hinted: str | None, status: int | None, ids: IdSource, headers: Mapping[str, str] | None
) -> Turn | ProviderError:
    if (status is not None and status >= 400) or is_error_body(body) or _is_typed_error(body):
        return _error(body, hinted, status, headers)
    detected = detect_shape(body)
    module = _choose(hinted, detected)
    if module is None:
        return invalid_response(
            "unknown", "unrecognised response shape; name the provider (e.g. --provider openai)"
        )
    reader = load_module(module)
    from_chunks = getattr(reader, "from_chunks", None)
    if isinstance(body, list) and from_chunks is not None:
        # A JSON array of a stream's chunks or events, as an SDK yields them.
        turn: Turn | ProviderError = from_chunks(body, ids=ids)
        return turn
    return reader.from_wire(body, ids=ids)


def _choose(hinted: str | None, detected: str | None) -> str | None:
    if hinted is None:
        return detected
    if detected is not None and detected != hinted and (detected in _UNMISTAKABLE or hinted == _LAST_RESORT):
        # A clear shape beats the name: "openai" with a Responses body, "gemini" at its OpenAI endpoint.
        return detected
    return hinted


def _error(
    body: object, hinted: str | None, status: int | None, headers: Mapping[str, str] | None
) -> ProviderError:
    module = hinted or _error_family(body)
    return load_module(module).error_from_wire(status, body, headers)


def _error_family(body: object) -> str:
    if not isinstance(body, dict):
        return _LAST_RESORT
    return _first(lambda module: module.sniff_error(body)) or _LAST_RESORT


def _is_typed_error(body: object) -> bool:
    # An error whose shape says so without an `error` key (AWS's `__type`); a body with one is judged by
    # `is_error_body`, which lets a response carrying an `error` field through.
    if not isinstance(body, dict) or "error" in body:
        return False
    return any(load_module(name).sniff_error(body) for name in _UNMISTAKABLE)


def detect_shape(body: object) -> str | None:
    """The module whose wire format `body` has, from the keys only that format uses; None if unknown."""
    if not isinstance(body, dict | list):
        return None
    return _first(lambda module: module.sniff_body(body))


def _from_sse(text: str, hinted: str | None, ids: IdSource) -> Turn | ProviderError:
    detected = None
    first_error: object = None
    for event in parse_sse(text):
        data = decode_json(event.data, "unknown") if event.data.strip() not in ("", "[DONE]") else None
        if first_error is None and is_error_body(data):
            first_error = data
        detected = _stream_family(event.event, data)
        if detected is not None:
            break
    module = _choose(hinted, detected)
    if module is not None:
        return load_module(module).from_stream(text, ids=ids)
    if first_error is not None:
        # A stream of nothing but an error event says nothing of its format: the common reader takes it.
        return _error(first_error, None, None, None)
    return invalid_response(
        "unknown", "unrecognised event stream; name the provider (e.g. --provider gemini)"
    )


def _stream_family(event_name: str | None, data: object) -> str | None:
    return _first(lambda module: module.sniff_event(event_name, data))


def _sniff_ndjson(module: ProviderModule, first: object) -> bool:
    # Only the formats that stream JSON lines have this question (Bedrock's decoded events, Ollama).
    sniff: Callable[[object], bool] | None = getattr(module, "sniff_ndjson", None)
    return sniff is not None and sniff(first)


def _from_ndjson(text: str, lines: list[str], hinted: str | None, ids: IdSource) -> Turn | ProviderError:
    first = decode_json(lines[0], hinted or "unknown")
    readers = [name for name in _RANKED if getattr(load_module(name), "sniff_ndjson", None) is not None]
    if hinted in readers:
        return load_module(hinted).from_stream(text, ids=ids)
    detected = _first(lambda module: _sniff_ndjson(module, first), readers) or _LAST_RESORT
    return load_module(detected).from_stream(text, ids=ids)
