"""Reading untrusted provider bodies: JSON decoding, typed accessors, error envelopes.

A provider body is data from the network: any field can be missing, null, or of the wrong type. The
accessors here return the value when it has the expected type, treat null as absent, and raise
`MalformedBody` (naming where) for anything else. Every provider's `from_wire` catches `MalformedBody`
at its boundary and returns `invalid_response(...)`, so no other exception ever leaves a normaliser.

Error tree of this layer::

    MalformedBody(ValueError)   internal only: a body of the wrong shape; never leaves a provider module
    ProviderError (a value)     what callers get: an error body, a transport failure, or a malformed body
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from orchestrator.errors import MalformedBody
from orchestrator.model import ProviderError
from orchestrator.providers.common import is_retryable_status, parse_retry_after
from orchestrator.providers.overflow import mark_context_overflow

INVALID_RESPONSE = "invalid_response"
_MESSAGE_LIMIT_CHARS = 2000

# Error types and codes that say "try again later" when no HTTP status is known (an error event inside
# a 200 stream, or an error body handed to `toolloop normalize` without --status).
_TRANSIENT_MARKERS = (
    "rate_limit",
    "overloaded",
    "server_error",
    "api_error",
    "timeout",
    "unavailable",
    "resource_exhausted",
    "internal",
    "throttl",
    "too_many_requests",
    "model_not_ready",
    "deadline_exceeded",
)


# Fields of an error object worth keeping as `ProviderError.details`, by name: Groq's `failed_generation` is
# the model's raw output that failed tool-call parsing (what to look at when a model keeps failing). Strings
# are cut at `_DETAIL_LIMIT_CHARS`: an error must stay small enough to store with the turn.
_DETAIL_KEYS = ("failed_generation",)
_DETAIL_LIMIT_CHARS = 16_000

# Keys only a successful response has: their presence means "error" is a field of a response, not an envelope.
_RESPONSE_KEYS = frozenset({"choices", "candidates", "output", "message", "content", "object"})


def invalid_response(provider: str, message: str, *, retryable: bool = False) -> ProviderError:
    """The ProviderError for a body that cannot be read as a response of `provider`."""
    return ProviderError(
        provider=provider, type=INVALID_RESPONSE, message=message[:_MESSAGE_LIMIT_CHARS], retryable=retryable
    )


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def req_map(value: object, where: str) -> dict[str, Any]:
    """`value` as a JSON object, which must be present."""
    if not isinstance(value, dict):
        raise MalformedBody(where, f"expected an object, got {_type_name(value)}")
    return value


def opt_map(value: object, where: str) -> dict[str, Any]:
    """`value` as a JSON object; null or absent gives {}."""
    return {} if value is None else req_map(value, where)


def opt_list(value: object, where: str) -> list[Any]:
    """`value` as a JSON array; null or absent gives []."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedBody(where, f"expected an array, got {_type_name(value)}")
    return value


def opt_str(value: object, where: str) -> str | None:
    """`value` as a string; null or absent gives None."""
    if value is None or isinstance(value, str):
        return value
    raise MalformedBody(where, f"expected a string, got {_type_name(value)}")


def opt_bool(value: object, where: str) -> bool:
    """`value` as a boolean; null or absent gives False."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise MalformedBody(where, f"expected a boolean, got {_type_name(value)}")
    return value


def decode_text(body: str | bytes, provider: str) -> str | ProviderError:
    """A body as text: bytes are UTF-8 (a BOM is dropped); undecodable bytes give a ProviderError."""
    if isinstance(body, str):
        return body.removeprefix("\ufeff")
    try:
        return body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return invalid_response(provider, f"response body is not UTF-8 ({exc.reason} at byte {exc.start})")


def decode_json(text: str, provider: str) -> object:
    """Parsed JSON of `text`, or a ProviderError saying why it is not JSON.

    A body cut off at its end (the usual sign of a dropped connection) is reported as retryable: asking
    again is the right answer to a transient truncation, and the turn's retry limit bounds the cost if
    the server keeps sending the same broken body. Any other syntax error is not retryable.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        truncated = exc.pos >= len(text.rstrip())
        what = "truncated" if truncated else "not valid JSON"
        return invalid_response(
            provider, f"response body is {what} ({exc.msg} at position {exc.pos})", retryable=truncated
        )
    except RecursionError:
        return invalid_response(provider, "response body is nested too deeply to read")


def _header(headers: Mapping[str, str] | None, *names: str) -> str | None:
    if not headers:
        return None
    lookup = httpx.Headers(dict(headers))
    for name in names:
        value: str | None = lookup.get(name)
        if value:
            return value
    return None


def _as_text(value: object) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def _as_name(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _retry_after_s(headers: Mapping[str, str] | None, error: Mapping[str, Any]) -> float | None:
    seconds = parse_retry_after(_header(headers, "retry-after"))
    if seconds is not None:
        return seconds
    millis = parse_retry_after(_header(headers, "retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    # Google puts the delay in a RetryInfo detail: {"@type": "...RetryInfo", "retryDelay": "26s"}.
    details = error.get("details")
    for detail in details if isinstance(details, list) else []:
        delay = detail.get("retryDelay") if isinstance(detail, dict) else None
        if isinstance(delay, str) and delay.endswith("s"):
            return parse_retry_after(delay[:-1])
    return None


def _looks_transient(*markers: str | None) -> bool:
    text = " ".join(m.lower() for m in markers if m)
    return any(marker in text for marker in _TRANSIENT_MARKERS)


def build_error_details(error: Mapping[str, Any]) -> dict[str, Any] | None:
    """The extras of an error object kept in `ProviderError.details` (see `_DETAIL_KEYS`); None if none."""
    details: dict[str, Any] = {}
    for key in _DETAIL_KEYS:
        value = error.get(key)
        if isinstance(value, str) and value:
            details[key] = value[:_DETAIL_LIMIT_CHARS]
    return details or None


def build_error(
    provider: str,
    status: int | None,
    body: object,
    headers: Mapping[str, str] | None = None,
) -> ProviderError:
    """A ProviderError from any provider's error body; never raises.

    Reads the common envelopes: `{"error": {"type"|"status", "code", "message"}}` (OpenAI, Groq, Gemini,
    Anthropic's `{"type": "error", "error": {...}}`), `{"error": "text"}` (Ollama), `{"message": ...,
    "__type"|"code"}` (Bedrock, Cohere), and plain text. With a status, retryable follows the status;
    without one (an error event in a stream), it follows the error's type and code. Extras such as Groq's
    `failed_generation` go to `details`.
    """
    if isinstance(body, str | bytes):
        text = decode_text(body, provider)
        parsed = decode_json(text, provider) if isinstance(text, str) else None
        if isinstance(parsed, dict):
            body = parsed
        else:
            body = {"message": text.strip()} if isinstance(text, str) and text.strip() else {}
    envelope: dict[str, Any] = body if isinstance(body, dict) else {}
    inner = envelope.get("error")
    error: dict[str, Any]
    if isinstance(inner, dict):
        error = inner
        error_type = _as_name(inner.get("type")) or _as_name(inner.get("status"))
    else:
        error = envelope
        error_type = _as_name(envelope.get("__type")) or _as_name(envelope.get("type"))
    error_type = error_type or _header(headers, "x-amzn-errortype")
    message = _as_text(error.get("message")) or _as_text(inner) or _as_text(envelope.get("message"))
    if error_type and ":" in error_type:
        error_type = error_type.split(":", 1)[0]  # Bedrock's "ThrottlingException:http://..."
    raw_code = error.get("code")
    code = raw_code if isinstance(raw_code, str) and raw_code else None
    if status is None and isinstance(raw_code, int) and not isinstance(raw_code, bool) and raw_code >= 400:
        status = raw_code  # Google repeats the HTTP status as error.code
    request_id = (
        _as_text(envelope.get("request_id"))
        or _as_text(error.get("request_id"))
        or _header(headers, "request-id", "x-request-id", "x-amzn-requestid", "x-goog-request-id")
    )
    retryable = is_retryable_status(status) if status is not None else _looks_transient(error_type, code)
    # Every provider's "the prompt is too long" as one code, with the window it states.
    return mark_context_overflow(
        ProviderError(
            provider=provider,
            status=status,
            type=error_type,
            code=code,
            message=(message or (f"HTTP {status}" if status is not None else "error response"))[
                :_MESSAGE_LIMIT_CHARS
            ],
            request_id=request_id,
            retryable=retryable,
            retry_after_s=_retry_after_s(headers, error),
            details=build_error_details(error),
        )
    )


def is_error_body(body: object) -> bool:
    """True for a body that is an error envelope rather than a response (used when no status is known)."""
    if not isinstance(body, dict):
        return False
    if body.get("type") == "error":
        return True
    return body.get("error") is not None and not body.keys() & _RESPONSE_KEYS
