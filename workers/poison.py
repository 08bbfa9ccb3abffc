"""Messages on a tool queue that cannot run as a tool call: refused at the worker's door, never fatal.

Why. Celery's consumer reads every message it receives in the worker's main process, in its event loop: kombu
parses the Redis list item as JSON and decodes its base64 body, Celery builds a `Request` from its headers and
unpacks the body as protocol 2's `[args, kwargs, embed]`. Whatever raises there — a list item that is not
JSON, bad base64, a body `{"a": 1}` ("not enough values to unpack") — escapes the event loop: "Unrecoverable
error", and the worker exits. With acks late a message that got as far as Celery is handed back, and every
worker that takes it next dies the same way; the tool's catalogue entries go stale and each call of it is
answered `not_found`. Celery's own hooks (`on_decode_error`, `on_invalid_task`, `on_unknown_message`) catch
only some of these, answer no call, and log the body whole, argument values included.

What. Each message is checked before kombu builds it (`inspect_envelope`, the list item) and before Celery
reads it (`inspect_task_message`); both are pure. A refused message is acknowledged (it is gone from the
broker), counted (`workers.metrics`), and:

- when it names a call that is still waited for (`find_named_call`: its `toolloop_call_id` header or the
  call id of its kwargs, a turn that exists, no outcome yet, no execution running), that call is answered
  `invalid_request` (first writer wins, fenced by its dispatch attempt like every answer);
- otherwise it is logged, one WARNING line with its queue and a redacted preview (`build_preview`: ids kept,
  every other value replaced by its type, bounded), and dropped.

A well-formed message for a task this worker does not serve goes on to Celery, whose unknown-task path
answers it `not_found` (`workers.unserved`); a message for a task of this app that is not a tool (a plain
Celery task sharing a tool queue) is checked as a Celery message only.

Design notes: docs/design/tool-calls.md, "Messages a worker cannot read".
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis
from celery.utils.time import maybe_iso8601
from pydantic import ValidationError

from workers import keys
from workers.call_store import CallStore, OutcomeWrite
from workers.contract import (
    TASK_NAME_PREFIX,
    FailureKind,
    ToolCallRequest,
    ToolOutcome,
    ToolSpec,
    build_failure,
)
from workers.metrics import record_refused_message
from workers.outcomes import describe_validation_error
from workers.parent import PARENT_RETRY_S
from workers.redis_retry import RedisRetry
from workers.scripts import Fence, WriteResult

logger = logging.getLogger(__name__)

# Celery's protocol 2 (the only one toolloop sends) carries the task name in the `task` header.
JSON_CONTENT_TYPE = "application/json"
JSON_ENCODINGS = frozenset({"utf-8", "utf8"})
# A body may hold a tool's arguments (kombu's JSON escapes non-ASCII: up to 3x their UTF-8 size) plus the
# call's ids, its turn's context (at most `contract.MAX_CONTEXT_BYTES`, refused at submit past it) and
# Celery's embed; past this, it is no call toolloop sent.
ESCAPED_ARGS_FACTOR = 3
BODY_ALLOWANCE_BYTES = 1024 * 1024
# The preview of a refused message in the log.
PREVIEW_MAX_CHARS = 600
_PREVIEW_MAX_ITEMS = 12
_PREVIEW_MAX_DEPTH = 4
_PREVIEW_KEY_CHARS = 40
_PREVIEW_ID_CHARS = 120
# Values shown as they are in a preview: ids and names, never an argument, a context value or a repr.
SAFE_PREVIEW_KEYS = frozenset(
    {
        "task",
        "id",
        "root_id",
        "parent_id",
        "group",
        "lang",
        "retries",
        "timelimit",
        "eta",
        "expires",
        "toolloop_call_id",
        "toolloop_turn_id",
        "call_id",
        "turn_id",
        "tool",
        "attempt",
        "deadline_at",
        "dispatched_at",
        "content-type",
        "content-encoding",
        "body_encoding",
        "delivery_tag",
        "routing_key",
        "exchange",
    }
)
_ID_HEADERS = ("root_id", "parent_id", "group", "shadow")


class RefusalReason(StrEnum):
    """Why a message was refused: the `reason` label of the metric, a small fixed set."""

    NOT_JSON = "not_json"  # the list item or the body is not JSON
    BAD_ENVELOPE = "bad_envelope"  # not kombu's envelope: no properties, no delivery tag, bad base64
    CONTENT_TYPE = "content_type"  # not JSON in UTF-8 (a pickle, say: JSON only crosses)
    PROTOCOL = "protocol"  # no `task` header: not Celery's protocol 2
    BAD_HEADERS = "bad_headers"  # a header Celery reads has the wrong type or value
    UNKNOWN_TASK = "unknown_task"  # a task name that is neither a tool's nor one of this app's tasks
    BAD_BODY = "bad_body"  # the body is not [args, kwargs, embed]
    BAD_REQUEST = "bad_request"  # kwargs that are not a tool call of the task's tool
    TOO_LARGE = "too_large"  # a body far larger than any call of its tool
    UNREADABLE = "unreadable"  # Celery could not take it for another reason (logged with its traceback)


@dataclass(frozen=True)
class NamedCall:
    """The call a refused message names, as far as it can be read."""

    call_id: str
    tool: str
    turn_id: str | None = None
    attempt: int = 1


@dataclass(frozen=True)
class Refusal:
    """Why a message cannot run: its reason, one line saying what is wrong (never a value it carries),
    and the call it names, if any."""

    reason: RefusalReason
    detail: str
    call: NamedCall | None = None


@dataclass(frozen=True)
class TaskMessage:
    """What `inspect_task_message` reads of a kombu message (a plain value, for tests)."""

    headers: Any
    body: bytes | str | None
    content_type: str | None
    content_encoding: str | None
    decode: Callable[[], Any]


# --- the list item, before kombu builds a message of it -----------------------------------------------------


def parse_envelope(raw: bytes | str) -> tuple[dict[str, Any] | None, Refusal | None]:
    """The kombu envelope a Redis list item holds, or why it is none (pure)."""
    try:
        payload = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None, Refusal(RefusalReason.NOT_JSON, f"the message ({_size(raw)}) is not JSON")
    refusal = inspect_envelope(payload)
    return (payload, None) if refusal is None else (None, refusal)


def inspect_envelope(payload: Any) -> Refusal | None:
    """Why kombu could not build a message of a parsed list item, or None (pure). kombu would raise on each
    of these in its event loop, after BRPOP took the item: nothing is left to requeue."""
    if not isinstance(payload, dict):
        what = _json_type(payload)
        return Refusal(RefusalReason.BAD_ENVELOPE, f"the message is a JSON {what}, not kombu's envelope")
    headers = payload.get("headers")
    call = find_named_call(headers, None)
    properties = payload.get("properties")
    if not isinstance(properties, dict) or not isinstance(properties.get("delivery_tag"), str):
        return Refusal(RefusalReason.BAD_ENVELOPE, "the envelope has no delivery tag", call)
    if not isinstance(properties.get("delivery_info", {}), dict):
        return Refusal(RefusalReason.BAD_ENVELOPE, "the envelope's delivery info is not an object", call)
    for name in ("content-type", "content-encoding"):
        if payload.get(name) is not None and not isinstance(payload[name], str):
            return Refusal(RefusalReason.BAD_ENVELOPE, f"the envelope's {name} is not a string", call)
    if headers is not None and not isinstance(headers, dict):
        return Refusal(RefusalReason.PROTOCOL, "the envelope's headers are not an object", call)
    body = payload.get("body")
    if body is not None and not isinstance(body, str):
        return Refusal(RefusalReason.BAD_ENVELOPE, "the body is not text", call)
    if body and properties.get("body_encoding") == "base64":
        try:
            base64.b64decode(body.encode("utf-8"), validate=True)
        except (binascii.Error, ValueError):
            return Refusal(RefusalReason.BAD_ENVELOPE, "the body is not valid base64", call)
    return None


# --- the message, before Celery reads it --------------------------------------------------------------------


def inspect_task_message(
    message: TaskMessage,
    *,
    is_registered: Callable[[str], bool],
    spec_of: Callable[[str], ToolSpec | None],
) -> Refusal | None:
    """Why Celery could not take `message` as a task (or our task could not take it as a tool call), or None
    (pure but for `message.decode`). `is_registered(name)`: the app has a task of that name; `spec_of(name)`:
    the spec of the tool behind task `name`, None when this worker serves no such tool."""
    headers = message.headers
    if not isinstance(headers, dict) or "task" not in headers:
        return Refusal(RefusalReason.PROTOCOL, "no 'task' header: not a Celery protocol 2 task message")
    name = headers["task"]
    problem = _header_problem(headers)
    if problem is not None:
        return Refusal(RefusalReason.BAD_HEADERS, problem, find_named_call(headers, None))
    is_tool = name.startswith(TASK_NAME_PREFIX)
    if not is_tool and not is_registered(name):
        return Refusal(
            RefusalReason.UNKNOWN_TASK,
            f"task '{_clip(name)}' is not a tool task nor a task of this worker",
            find_named_call(headers, None),
        )
    content_type, encoding = message.content_type, (message.content_encoding or "").lower()
    if content_type != JSON_CONTENT_TYPE or encoding not in JSON_ENCODINGS:
        return Refusal(
            RefusalReason.CONTENT_TYPE,
            f"content type {_clip(str(content_type))!r} in {_clip(encoding)!r}: only JSON in UTF-8 is read",
            find_named_call(headers, None),
        )
    spec = spec_of(name) if is_tool else None
    body_size = len(message.body or b"")
    if spec is not None and body_size > build_max_body_bytes(spec):
        return Refusal(
            RefusalReason.TOO_LARGE,
            f"the message body is {body_size} bytes, more than any call of '{spec.name}' "
            f"(max_args_bytes {spec.max_args_bytes}) could be",
            find_named_call(headers, None),
        )
    try:
        body = message.decode()
    except Exception:  # kombu raises its DecodeError, or whatever the JSON decoder raised
        return Refusal(RefusalReason.NOT_JSON, "the body is not JSON", find_named_call(headers, None))
    call = find_named_call(headers, body)
    problem = _body_problem(body, is_tool)
    if problem is not None:
        return Refusal(RefusalReason.BAD_BODY, problem, call)
    return _request_refusal(name, body[1], call) if is_tool else None


def _header_problem(headers: Mapping[str, Any]) -> str | None:
    """What in the headers Celery's `Request` would choke on, in words (no value shown)."""
    if not isinstance(headers.get("task"), str) or not headers["task"]:
        return "the 'task' header is not a task name"
    if not isinstance(headers.get("id"), str) or not headers["id"]:
        return "the 'id' header is not a task id"
    for name in _ID_HEADERS:
        if headers.get(name) is not None and not isinstance(headers[name], str):
            return f"the '{name}' header is not a string"
    retries = headers.get("retries")
    if retries is not None and (type(retries) is not int or retries < 0):
        return "the 'retries' header is not a count"
    timelimit = headers.get("timelimit")
    if timelimit is not None and not _is_timelimit(timelimit):
        return "the 'timelimit' header is not [hard, soft] seconds"
    for name in ("eta", "expires"):
        if headers.get(name) is not None and not _is_time(headers[name]):
            return f"the '{name}' header is not an ISO 8601 time"
    return None


def _is_timelimit(value: Any) -> bool:
    return (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(limit is None or _is_seconds(limit) for limit in value)
    )


def _is_seconds(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    )


def _is_time(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        maybe_iso8601(value)
    except (ValueError, TypeError, AttributeError, OverflowError):
        return False
    return True


def _body_problem(body: Any, is_tool: bool) -> str | None:
    """What in a decoded body is not protocol 2's `[args, kwargs, embed]`, in words."""
    if not isinstance(body, list | tuple):
        return f"the body is a JSON {_json_type(body)}, not [args, kwargs, embed]"
    if len(body) != 3:
        return f"the body is a list of {len(body)}, not [args, kwargs, embed]"
    args, kwargs, embed = body
    if not isinstance(args, list | tuple):
        return f"the body's args are a JSON {_json_type(args)}, not a list"
    if not isinstance(kwargs, dict):
        return f"the body's kwargs are a JSON {_json_type(kwargs)}, not an object"
    if not isinstance(embed, dict):
        return f"the body's embed is a JSON {_json_type(embed)}, not an object"
    if is_tool and args:
        return "a tool task takes keyword arguments only, and this one has positional ones"
    return None


def _request_refusal(name: str, kwargs: dict[str, Any], call: NamedCall | None) -> Refusal | None:
    """Why the kwargs of tool task `name` are not a call of its tool (None: they are one)."""
    try:
        request = ToolCallRequest.model_validate(kwargs)
    except ValidationError as exc:
        fields = sorted({str(error["loc"][0]) for error in exc.errors() if error["loc"]})
        what = f"fields {', '.join(_clip(f) for f in fields)}" if fields else describe_validation_error(exc)
        return Refusal(RefusalReason.BAD_REQUEST, f"the kwargs are not a tool call ({_clip(what)})", call)
    tool = name.removeprefix(TASK_NAME_PREFIX)
    if request.tool != tool:
        return Refusal(
            RefusalReason.BAD_REQUEST,
            f"task '{_clip(name)}' carries a call of another tool, '{_clip(request.tool)}'",
            call,
        )
    return None


def build_max_body_bytes(spec: ToolSpec) -> int:
    """The largest body a call of `spec`'s tool can have: its arguments, JSON-escaped, and an allowance."""
    return ESCAPED_ARGS_FACTOR * spec.max_args_bytes + BODY_ALLOWANCE_BYTES


# --- the call a message names -------------------------------------------------------------------------------


def find_named_call(headers: Any, body: Any) -> NamedCall | None:
    """The call a message names: its `toolloop_call_id` / `toolloop_turn_id` headers (set on every call
    toolloop sends), else the call id of its kwargs; None when it names none (pure)."""
    heads = headers if isinstance(headers, dict) else {}
    kwargs = body[1] if isinstance(body, list | tuple) and len(body) == 3 else None
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    call_id = _text(heads.get("toolloop_call_id")) or _text(kwargs.get("call_id"))
    if call_id is None:
        return None
    turn_id = _text(heads.get("toolloop_turn_id")) or _text(kwargs.get("turn_id"))
    task = _text(heads.get("task")) or ""
    tool = _text(kwargs.get("tool")) or (task.removeprefix(TASK_NAME_PREFIX) if task else "") or "?"
    attempt = kwargs.get("attempt")
    return NamedCall(
        call_id=call_id,
        tool=tool,
        turn_id=turn_id,
        attempt=attempt if type(attempt) is int and attempt >= 1 else 1,
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value and len(value) <= 512 else None


# --- the preview -------------------------------------------------------------------------------------------


def build_preview(headers: Any, body: Any, max_chars: int = PREVIEW_MAX_CHARS) -> str:
    """A one-line preview of a message for the log (pure): its headers and body with every value replaced by
    its type — `<str 12>`, `<int>` — except ids and names (`SAFE_PREVIEW_KEYS`), at most `max_chars`.

    `body` is the decoded body, or the raw bytes/text when it is not JSON: then only its size and kind show.
    No argument value, context value or repr is ever printed."""
    text = f"headers={_masked_json(headers)} body={_masked_body(body)}"
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def _masked_body(body: Any) -> str:
    if isinstance(body, bytes | str):
        try:
            decoded = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return f"<{_size(body)}, not JSON>"
        return _masked_json(decoded)
    return _masked_json(body)


def _masked_json(value: Any) -> str:
    return json.dumps(_mask(value, safe=False, depth=0), ensure_ascii=False, separators=(",", ":"))


def _mask(value: Any, *, safe: bool, depth: int) -> Any:
    if isinstance(value, dict):
        if depth >= _PREVIEW_MAX_DEPTH:
            return f"<object {len(value)}>"
        items = list(value.items())
        shown: dict[str, Any] = {}
        for key, item in items[:_PREVIEW_MAX_ITEMS]:
            name = _clip(str(key), _PREVIEW_KEY_CHARS)
            shown[name] = _mask(item, safe=str(key) in SAFE_PREVIEW_KEYS, depth=depth + 1)
        if len(items) > _PREVIEW_MAX_ITEMS:
            shown["…"] = f"<{len(items) - _PREVIEW_MAX_ITEMS} more>"
        return shown
    if isinstance(value, list | tuple):
        if depth >= _PREVIEW_MAX_DEPTH:
            return f"<list {len(value)}>"
        masked = [_mask(item, safe=safe, depth=depth + 1) for item in value[:_PREVIEW_MAX_ITEMS]]
        if len(value) > _PREVIEW_MAX_ITEMS:
            masked.append(f"<{len(value) - _PREVIEW_MAX_ITEMS} more>")
        return masked
    if value is None or isinstance(value, bool):
        return value
    if safe and isinstance(value, int | float):
        return value
    if safe and isinstance(value, str):
        return _clip(value, _PREVIEW_ID_CHARS)
    if isinstance(value, str):
        return f"<str {len(value)}>"
    return f"<{_json_type(value)}>"


def _json_type(value: Any) -> str:
    match value:
        case dict():
            return "object"
        case list() | tuple():
            return "list"
        case str():
            return "string"
        case bool():
            return "boolean"
        case int() | float():
            return "number"
        case None:
            return "null"
        case _:
            return type(value).__name__


def _size(raw: bytes | str) -> str:
    return f"{len(raw)} {'bytes' if isinstance(raw, bytes) else 'characters'}"


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --- answering ----------------------------------------------------------------------------------------------


def build_invalid_request_outcome(call: NamedCall, detail: str, *, worker: str, now: float) -> ToolOutcome:
    """The `invalid_request` outcome of a call whose message could not be read (pure)."""
    message = (
        f"the task message of this call could not be read ({detail}); the tool '{call.tool}' was not run. "
        "Calling it again sends a new message"
    )
    return build_failure(
        (call.call_id, call.tool, call.turn_id),
        FailureKind.INVALID_REQUEST,
        message,
        attempts=0,
        worker=worker,
        finished_at=now,
    )


def is_waited_for(store: CallStore, call: NamedCall) -> bool:
    """Whether someone still waits for `call`: no outcome yet, no execution of it running, and its turn
    exists (a call without a turn — a direct call — is waited for on its reply list)."""
    pipe = store.client.pipeline(transaction=False)
    pipe.exists(keys.outcome(call.call_id, call.turn_id))
    pipe.exists(keys.running(call.call_id, call.turn_id))
    if call.turn_id is not None:
        pipe.exists(keys.turn_request(call.turn_id))
    found = pipe.execute()
    has_outcome, running = found[0], found[1]
    turn_exists = found[2] if call.turn_id is not None else True
    return not has_outcome and not running and bool(turn_exists)


def answer_invalid_request(store: CallStore, call: NamedCall, detail: str, *, worker: str) -> str:
    """Answer `call` `invalid_request` if it is still waited for; returns what happened, in words for the
    log line. In the worker's main process: Redis is retried for `PARENT_RETRY_S` at most."""
    retry = RedisRetry(time.time() + PARENT_RETRY_S, time.time, time.sleep)
    try:
        if not retry.call(lambda _failures: is_waited_for(store, call), f"the state of {call.call_id}"):
            return f"dropped: call {call.call_id} is not waited for (answered, running, or its turn is gone)"
        outcome = build_invalid_request_outcome(call, detail, worker=worker, now=time.time())
        reply_key = keys.reply(call.call_id, None) if call.turn_id is None else None
        write = OutcomeWrite.of(outcome, Fence(call.attempt, ""), reply_key=reply_key)
        result = store.finish(write, retry=retry)
    except redis.RedisError as exc:
        # The worker's main process: no Redis error may escape into Celery's consumer.
        return f"dropped: call {call.call_id} could not be answered, Redis refused: {exc!r}"
    if result is WriteResult.WON:
        return f"answered call {call.call_id} invalid_request"
    return f"dropped: call {call.call_id} already has its answer ({result.name})"


class MessageGuard:
    """What a worker does with a refused message: answer the call it names, or log it; count it.

    One per consumer, in the worker's main process. `queues` are the queues the worker consumes: the
    metric's `queue` label is one of them, or `other`, whatever a message claims."""

    def __init__(
        self, store: Callable[[], CallStore], *, worker: str, queues: Callable[[], set[str]]
    ) -> None:
        self._store = store
        self._worker = worker
        self._queues = queues

    def refuse(self, refusal: Refusal, *, queue: str | None, preview: str) -> None:
        """Answer or log `refusal` (the message itself is already acked or gone), and count it."""
        shown_queue = queue if queue in self._queues() else "other"
        record_refused_message(shown_queue, refusal.reason.value)
        if refusal.call is None:
            done = "dropped: it names no call"
        else:
            done = answer_invalid_request(self._store(), refusal.call, refusal.detail, worker=self._worker)
        logger.warning(
            "refused a message on queue %s (%s: %s); %s; preview: %s",
            _clip(str(queue)),
            refusal.reason.value,
            refusal.detail,
            done,
            preview,
        )
