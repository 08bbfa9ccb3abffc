"""What crosses the wire between the orchestrator and the workers.

The orchestrator never imports tool code: it knows tools through the catalogue of `ToolSpec`s that workers
publish to Redis, sends `ToolCallRequest`s as Celery task kwargs, and reads `ToolOutcome` envelopes back from
Redis. Everything here is plain JSON through pydantic; no pickled exception ever crosses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from workers import packing
from workers.records import STORED, is_stored, read_known

if TYPE_CHECKING:
    from workers.progress import ProgressReporter

TASK_NAME_PREFIX = "tool."
CONTEXT_PARAM_NAMES = ("ctx", "context")
# The tenant of a turn submitted without one, and of a call from an orchestrator that sends none.
DEFAULT_TENANT = "default"
# What a tenant may be called: a short identifier, safe in a metric label, a log line and a URL.
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# A turn's `context` goes with every one of its tool calls, in the task message, which a worker reads only up
# to the arguments' limit and an allowance for the rest (`workers.poison.build_max_body_bytes`): a context is
# held well inside that allowance, and refused at submit past it rather than failing each call later.
MAX_CONTEXT_BYTES = 256 * 1024


ApprovalTimeoutAction = Literal["deny", "approve"]
"""What a call that waited for a person and got no answer in time gets: denied (the model reads that no one
approved it; the call never runs), or run as if approved."""


class FailureKind(StrEnum):
    """Why a tool call did not succeed; stable, machine-readable (docs/design/tool-calls.md)."""

    VALIDATION = "validation"
    NOT_FOUND = "not_found"
    NOT_ALLOWED = "not_allowed"
    POLICY_DENIED = "policy_denied"
    CONFIRMATION_DENIED = "confirmation_denied"
    PAYLOAD_LIMIT = "payload_limit"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    EXECUTION_ERROR = "execution_error"
    TIMEOUT = "timeout"
    WORKER_LOST = "worker_lost"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    INVALID_RESULT = "invalid_result"
    # The call's task message could not be read (malformed, foreign, too large): the tool never ran.
    INVALID_REQUEST = "invalid_request"


# Failures that another attempt could fix; the others are final at once.
RETRYABLE_KINDS = frozenset({FailureKind.WORKER_LOST})
NEVER_RETRIED_KINDS = frozenset(
    {
        FailureKind.VALIDATION,
        FailureKind.PAYLOAD_LIMIT,
        FailureKind.IDEMPOTENCY_CONFLICT,
        FailureKind.NOT_FOUND,
        FailureKind.NOT_ALLOWED,
        FailureKind.POLICY_DENIED,
        FailureKind.CONFIRMATION_DENIED,
        FailureKind.INVALID_REQUEST,
    }
)


class ToolSpec(BaseModel):
    """Public metadata and guardrails of one tool, as published in the catalogue.

    `parameters` is the JSON Schema the model sees (the context parameter is never part of it).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    # Empty: the tool's own queue, `tool.<name>` (see `_own_queue_by_default`).
    queue: str = ""
    soft_time_limit_s: float = 30.0
    time_limit_s: float = 60.0
    retries: int = 0
    retry_backoff_s: float = 1.0
    retry_backoff_max_s: float = 30.0
    max_args_bytes: int = 64 * 1024
    max_result_bytes: int = 64 * 1024
    idempotency: str | None = None  # None | "args" | "key:<fixed key>"
    sensitive: bool = False
    requires_confirmation: bool = False
    # How long a call of a tool that requires confirmation waits for a person (seconds), and what it gets
    # when no one answered by then; None: the turn's limits say, else 24 hours and "deny".
    approval_timeout_s: float | None = None
    on_approval_timeout: ApprovalTimeoutAction | None = None
    # At most this many calls of the tool run at once across the fleet, and per tenant
    # (`workers.concurrency`); None: no limit. A catalogue entry of a release before them reads as None.
    max_concurrency: int | None = None
    max_concurrency_per_tenant: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _own_queue_by_default(cls, data: Any) -> Any:
        # A spec that names no queue is on its tool's own, as `@tool` puts it: a worker consumes exactly the
        # queues of the tools it serves, so no call lands on a worker that does not have its tool.
        if isinstance(data, dict) and not data.get("queue") and isinstance(data.get("name"), str):
            return {**data, "queue": build_task_name(data["name"])}
        return data

    @property
    def task_name(self) -> str:
        """The Celery task name of this tool (`tool.<name>`)."""
        return build_task_name(self.name)


class ToolCallRequest(BaseModel):
    """The kwargs of one tool task: everything a worker needs to run the call and report it."""

    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    turn_id: str | None = None
    context: dict[str, Any] = Field(default_factory=dict)
    attempt: int = 1
    # Epoch seconds after which the call must not start (the turn's deadline); None = no deadline.
    deadline_at: float | None = None
    dispatched_at: float | None = None
    # A Redis list the outcome id is pushed to, for waiters that are not an orchestrator (direct calls).
    reply_key: str | None = None
    # The turn's tenant (the direct call's); a message of an orchestrator that predates tenants has none.
    tenant: str = DEFAULT_TENANT


class ToolOutcome(BaseModel):
    """The one outcome of one tool call: a success with its result, or a failure with its kind."""

    call_id: str
    tool: str
    turn_id: str | None = None
    ok: bool
    result: Any = None
    # What the model is shown: a string result as is, others as JSON, errors as "Error: ...".
    content: str
    failure_kind: FailureKind | None = None
    error: str | None = None
    retryable: bool = False
    attempts: int = 1
    duration_ms: float = 0.0
    worker: str | None = None
    synthetic: bool = False
    idempotent_replay: bool = False
    truncated: bool = False
    result_bytes: int | None = None
    full_result_key: str | None = None
    finished_at: float | None = None

    @field_validator("failure_kind", mode="before")
    @classmethod
    def _read_newer_failure_kind(cls, value: object, info: ValidationInfo) -> object:
        # A kind a newer release added (`workers.records`): read as an execution error, its content kept.
        return read_known(value, set(FailureKind), FailureKind.EXECUTION_ERROR) if is_stored(info) else value

    @property
    def is_error(self) -> bool:
        return not self.ok


# --- the stored outcome: its result once -----------------------------------------------------------------
# An outcome key, the late list, an inbox notification and a spooled write hold `dump_tool_outcome`'s JSON:
# `content` is left out when it is what `result` gives (a string as is, anything else as JSON), and
# `parse_tool_outcome` derives it again. Once the turn's history holds the answer, the key keeps a stub
# (`build_consumed_stub`): the outcome without its result, marked `consumed`.
CONSUMED_FIELD = "consumed"


def derive_content(result: Any) -> str | None:
    """The content a result is shown as (`workers.outcomes.build_content`); None when JSON cannot carry it."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None


def dump_tool_outcome(outcome: ToolOutcome) -> str:
    """The stored JSON of an outcome: its result once (see above)."""
    if outcome.ok and outcome.content == derive_content(outcome.result):
        return outcome.model_dump_json(exclude={"content"})
    return outcome.model_dump_json()


def parse_tool_outcome(raw: str | bytes) -> ToolOutcome:
    """An outcome from `dump_tool_outcome`'s JSON as stored (`workers.packing`: compressed when large; or a
    full one, as written before; or a consumed stub, whose content and result are gone: read as empty)."""
    data = json.loads(packing.unpack(raw))
    if isinstance(data, dict) and "content" not in data:
        derived = None if data.get(CONSUMED_FIELD) else derive_content(data.get("result"))
        data["content"] = derived if derived is not None else ""
    return ToolOutcome.model_validate(data, context=STORED)


def check_context_size(context: Any) -> None:
    """Refuse (ValueError) a turn's `context` over `MAX_CONTEXT_BYTES` as a task message carries it (JSON,
    non-ASCII escaped, as kombu writes it)."""
    size = len(json.dumps(context, ensure_ascii=True, default=str))
    if size > MAX_CONTEXT_BYTES:
        raise ValueError(
            f"the context is {size} bytes of JSON, over the {MAX_CONTEXT_BYTES} allowed: every tool call of "
            "the turn carries it; keep large data where the tools can read it, and pass its id"
        )


def build_consumed_stub(outcome: ToolOutcome) -> str:
    """What an outcome key keeps once the turn's history holds the outcome's content: the outcome without
    its result and content, marked `consumed` (the key must stay: a redelivered call checks it exists)."""
    body = outcome.model_dump_json(exclude={"result", "content"}, exclude_defaults=True)
    return '{"' + CONSUMED_FIELD + '":true,' + body[1:]


def build_task_name(tool_name: str) -> str:
    """The Celery task name of a tool: what Flower lists."""
    return f"{TASK_NAME_PREFIX}{tool_name}"


def build_failure(
    request_or_ids: ToolCallRequest | tuple[str, str, str | None],
    kind: FailureKind,
    message: str,
    *,
    attempts: int = 1,
    retryable: bool = False,
    synthetic: bool = False,
    duration_ms: float = 0.0,
    worker: str | None = None,
    finished_at: float | None = None,
) -> ToolOutcome:
    """A failure outcome whose content a model can act on ("Error: timed out after 5 s")."""
    if isinstance(request_or_ids, ToolCallRequest):
        call_id, tool, turn_id = request_or_ids.call_id, request_or_ids.tool, request_or_ids.turn_id
    else:
        call_id, tool, turn_id = request_or_ids
    return ToolOutcome(
        call_id=call_id,
        tool=tool,
        turn_id=turn_id,
        ok=False,
        content=f"Error: {message}",
        failure_kind=kind,
        error=message,
        retryable=retryable,
        attempts=attempts,
        synthetic=synthetic,
        duration_ms=duration_ms,
        worker=worker,
        finished_at=finished_at,
    )


# --- redaction (docs/design/tools.md, "Redaction"): shared by Flower's argsrepr, events and logs --------

REDACTED = "***"
_SENSITIVE_KEY = re.compile(
    r"^(password|passwd|token|secret|api_key|apikey|authorization|cookie)$"
    r"|(_key|_token|_secret|_password)$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ToolContext:
    """What a tool receives through a parameter named `ctx` or `context` annotated with this class.

    `context` is the turn's context object from the web app (never shown to the model); `tenant` the turn's
    tenant (`"default"` when it was submitted without one; set by whoever submitted it, an API key's
    tenant over HTTP, so a tool may scope what it reads by it);
    `idempotency_key` is stable across retries and redeliveries of one call, to pass on to external APIs;
    `progress(...)` shows how the call is going on the turn's event stream.
    """

    call_id: str
    turn_id: str | None = None
    attempt: int = 1
    idempotency_key: str | None = None
    context: dict[str, Any] = field(default_factory=dict)
    tenant: str = DEFAULT_TENANT
    # Set by the worker for a call of a turn (`workers.progress`); None makes `progress` a no-op.
    _progress: ProgressReporter | None = field(default=None, repr=False, compare=False)

    def progress(self, message: object, fraction: float | None = None) -> None:
        """Emit a `tool_progress` event {call_id, tool, message, fraction} on the turn's stream.

        `message` is shown as text (at most 1,000 characters, the values of sensitive arguments replaced by
        `***`); `fraction` is how much is done, 0..1 (clamped; None, NaN or a non-number shows none). Reports
        are rate-limited per call (at most about four a second; the latest one always goes out, at the next
        allowed moment or when the tool returns) and never fail or stall the tool: when Redis cannot take
        one it is dropped and logged. Outside a turn (a direct call, a test) this does nothing.
        """
        if self._progress is not None:
            self._progress.report(message, fraction)


def build_listing(
    specs: Iterable[ToolSpec], *, include_sensitive: bool = False, allowlist: Iterable[str] | None = None
) -> list[ToolSpec]:
    """The tools anyone may see, sorted by name: THE sensitive-tool rule, written once (docs/design/tools.md).

    Sensitive tools only with `include_sensitive`; then the allowlist, applied after the sensitive filter
    so that it can never bring a sensitive tool back. A worker's listing, `GET /v1/tools`, `toolloop tools`
    and the tools a turn offers by default (`machine.validation.offered_tools`) all go through here.
    """
    visible = [spec for spec in specs if include_sensitive or not spec.sensitive]
    if allowlist is not None:
        allowed = set(allowlist)
        visible = [spec for spec in visible if spec.name in allowed]
    return sorted(visible, key=lambda spec: spec.name)


def is_sensitive_key(key: str) -> bool:
    """True for argument keys whose values are never shown (password, token, *_key, authorization…)."""
    return bool(_SENSITIVE_KEY.search(key))


def redact(value: Any) -> Any:
    """A copy of a JSON-like value with the values of sensitive keys replaced, at any depth."""
    if isinstance(value, dict):
        return {k: (REDACTED if is_sensitive_key(str(k)) else redact(v)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


TASK_REPR_MAX_CHARS = 2048


def build_task_reprs(request: ToolCallRequest) -> tuple[str, str]:
    """Flower's `argsrepr`/`kwargsrepr` of a tool task: `()`, and a JSON object with the turn id,
    the call id, the attempt, the arguments with sensitive values redacted, and the context's keys only.

    The context is the web app's (user ids, tenants, session data…) and never meant for eyes: its values are
    hidden whatever their keys, where arguments lose only the values of sensitive keys.
    """
    shown = {
        "turn_id": request.turn_id,
        "call_id": request.call_id,
        "attempt": request.attempt,
        "tenant": request.tenant,
        "arguments": redact(request.arguments),
        "context": dict.fromkeys(request.context, REDACTED),
    }
    text = json.dumps(shown, ensure_ascii=False, default=str)
    if len(text) > TASK_REPR_MAX_CHARS:
        text = text[: TASK_REPR_MAX_CHARS - 1] + "…"
    return "()", text


IdempotencyMode = Literal["args", "key"]
