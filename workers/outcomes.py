"""Building outcome envelopes (docs/design/tool-calls.md): pure functions, no Redis, no Celery.

What the model is shown (`content`), the truncation marker of oversized results, idempotency digests and
the retry schedule are all decided here, so that they can be tested as plain values.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from workers import keys
from workers.contract import ToolCallRequest, ToolOutcome, ToolSpec
from workers.errors import InvalidResultError


@dataclass(frozen=True)
class ShownResult:
    """A tool's result with the text the model is shown instead of the result's JSON (an MCP tool's
    structured content and its text): what `build_success` makes the outcome's `result` and `content`."""

    result: Any
    content: str


@dataclass(frozen=True)
class SuccessRecord:
    """A success outcome, plus the full result JSON to keep when the content was truncated."""

    outcome: ToolOutcome
    result: Any = None
    full_result_json: str | None = None


def format_seconds(seconds: float) -> str:
    """`5.0` → "5", `0.5` → "0.5": limits as a person writes them."""
    return f"{seconds:g}"


def build_result_json(result: Any) -> tuple[Any, str]:
    """The JSON-ready result and its text; pydantic models are dumped first.

    Raises InvalidResultError for values JSON cannot carry (objects, sets, NaN, bytes…).
    """
    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json")
    try:
        text = json.dumps(result, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidResultError(
            f"result of type {type(result).__name__} is not JSON-serialisable: {exc}"
        ) from exc
    return result, text


def build_content(result: Any, result_json: str) -> str:
    """What the model sees: a string as is, anything else as JSON."""
    return result if isinstance(result, str) else result_json


def build_truncation(content: str, max_result_bytes: int) -> tuple[str, int] | None:
    """The truncated content with its marker, and the original size in bytes; None when it fits.

    The marker tells the model how much it is not shown; where the rest is kept (`full_result_key`) is for
    the outcome's readers, not for the model, which cannot read Redis."""
    encoded = content.encode("utf-8")
    if len(encoded) <= max_result_bytes:
        return None
    # Cut on a character boundary: decoding with "ignore" drops a split multi-byte sequence at the end.
    shown = encoded[:max_result_bytes].decode("utf-8", errors="ignore")
    marker = f"\n[truncated: result was {len(encoded)} bytes, showing the first {len(shown.encode('utf-8'))}]"
    return shown + marker, len(encoded)


def build_success(
    request: ToolCallRequest,
    spec: ToolSpec,
    result: Any,
    *,
    attempts: int,
    duration_ms: float,
    worker: str | None,
    finished_at: float,
    replay: bool = False,
) -> SuccessRecord:
    """The success outcome of a call; raises InvalidResultError for a result JSON cannot carry.

    A `ShownResult` gives the content itself; its result is kept only while its JSON fits too."""
    shown = result.content if isinstance(result, ShownResult) else None
    value, result_json = build_result_json(result.result if isinstance(result, ShownResult) else result)
    content = shown if shown is not None else build_content(value, result_json)
    truncation = build_truncation(content, spec.max_result_bytes)
    full_key = keys.full_result(request.call_id, request.turn_id) if truncation is not None else None
    if truncation is None and shown is not None and len(result_json.encode("utf-8")) > spec.max_result_bytes:
        truncation = (content, len(content.encode("utf-8")))
    outcome = ToolOutcome(
        call_id=request.call_id,
        tool=request.tool,
        turn_id=request.turn_id,
        ok=True,
        # The envelope carries the result only when it fits; the full one lives under `full_result_key`.
        result=value if truncation is None else None,
        content=content if truncation is None else truncation[0],
        attempts=attempts,
        duration_ms=duration_ms,
        worker=worker,
        idempotent_replay=replay,
        truncated=truncation is not None,
        result_bytes=len(content.encode("utf-8")),
        full_result_key=full_key,
        finished_at=finished_at,
    )
    return SuccessRecord(outcome, value, result_json if truncation is not None else None)


def build_args_digest(arguments: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of the arguments (sorted keys, no spaces)."""
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def build_idempotency_key(spec: ToolSpec, arguments: Mapping[str, Any], tenant: str) -> str | None:
    """The Redis key of a call's stored success, the call's tenant's; None when the tool is not idempotent."""
    if spec.idempotency is None:
        return None
    if spec.idempotency == "args":
        return keys.idempotency(spec.name, build_args_digest(arguments), tenant)
    fixed = spec.idempotency.removeprefix("key:")
    return keys.idempotency(spec.name, hashlib.sha256(fixed.encode("utf-8")).hexdigest(), tenant)


def build_idempotency_record(arguments: Mapping[str, Any], result: Any) -> str:
    """What is stored under an idempotency key: the args digest (for conflicts) and the JSON result."""
    return json.dumps({"args_digest": build_args_digest(arguments), "result": result}, ensure_ascii=False)


def build_retry_delay(attempt: int, spec: ToolSpec, jitter: float) -> float:
    """Seconds before attempt `attempt + 1`: exponential from `retry_backoff_s`, capped, with jitter.

    `jitter` in [0, 1) spreads the delay over [half, full] of the exponential step ("equal jitter"), so
    that calls failing together do not all come back at once.
    """
    step = min(spec.retry_backoff_max_s, spec.retry_backoff_s * math.pow(2, max(attempt - 1, 0)))
    return step / 2 + step / 2 * jitter


def decide_retry(
    attempt: int, spec: ToolSpec, deadline_at: float | None, now: float, jitter: float
) -> float | None:
    """The delay before another attempt, or None when attempts are used up or it would pass the deadline."""
    if attempt >= spec.retries + 1:
        return None
    delay = build_retry_delay(attempt, spec, jitter)
    if deadline_at is not None and now + delay >= deadline_at:
        return None
    return delay


def describe_exception(exc: BaseException, attempt: int) -> str:
    """The error text of a tool's exception: "ValueError: disk on fire", with the attempts after a retry."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if attempt <= 1 else f"{text} (after {attempt} attempts)"


def describe_validation_error(exc: ValidationError) -> str:
    """pydantic's errors as one line: "times: Input should be a valid integer; text: Field required"."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"])
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(parts)
