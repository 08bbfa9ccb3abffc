"""The HTTP clients: `HttpClient` and `AsyncHttpClient`, the methods of `Client` / `AsyncClient` over
`toolloop api`, for an app that reaches toolloop by its API (a token) rather than by Redis (a password).

    with HttpClient("http://toolloop:8000", token="…") as client:
        turn_id = client.submit(prompt="What is 2+3, times 4?", tools=["add", "multiply"])
        for event in client.stream(turn_id):
            ...
        outcome = client.wait(turn_id, timeout=60)

Same methods, signatures, return values and errors as the Redis clients (`submit`, `submit_request`, `fork`,
`get`, `outcome`, `wait`, `events`, `stream`, `cancel`, `approve`, `call_tool`, `schedule`, `unschedule`,
`schedules`, `register_agent`, `list_agents`, `ping`, `close` and the context managers;
`tests/unit/test_http_client_faces.py` keeps them so). They read no `TOOLLOOP_*` setting:
the base URL and the token are all they use. What HTTP itself sets apart: a `turn_id` of the caller's is 1–200
letters, digits, `_` or `-` (one path segment); `block_ms` has no effect (the API's keep-alives pace a
stream); a `call_tool` `timeout_s` is finite (JSON has no infinity; the API holds the request that long).

One core, two faces: every request is built, and every answer read, by the pure functions of this module
(`build_*_call` give an `HttpCall`: the request and the reader of its answer; `raise_for_answer` is the one
mapping of error answers; `SseDecoder` and `EventFollow` read the events stream and say where to resume;
`ApiOutage` is the retry policy). `HttpClient` performs them on `httpx.Client`, `AsyncHttpClient` on
`httpx.AsyncClient`; the I/O is all that differs.

Errors map into toolloop's tree (`orchestrator.errors`), as the Redis clients raise them: 404
`UnknownTurnError` (but `outcome`, None for an unknown turn as from the Redis clients); a refused submit
(422) `UnknownToolError` (its `unknown` and `available` from the answer), `ModelConfigError` for the model,
else a `ValueError` naming each field, as for a refused approval, a body over the API's limit (413) or one it
could not parse (400); `cancel` and `approve` answer False for a turn that has ended (409 `turn_ended`),
`approve` raises `CallNotWaitingError` for a call that waits for no answer. A schedule is its key's tenant's:
`schedules` lists those, `unschedule` of another tenant's is False as of none, `schedule` of a name another
tenant holds a `ValueError`; the requests they show are redacted, as a turn's are. `call_tool` returns the
call's `ToolOutcome`, a failure one too (an unknown tool, refused arguments, no answer in time), as the Redis
clients do. A wrong or missing token (401, 403) raises `ApiAuthError`, a `PermissionError`; only an answer
the API does not document raises httpx's `HTTPStatusError`. `ping` is True, or `ApiUnavailableError` at once,
as `Client.ping` is True or Redis's `ConnectionError`.

Riding out an API restart (or its Redis's, which the API answers with 503), as the Redis clients ride out
Redis's (the same `store.runner.Patience`): a request that found no API (a connection error, a dropped
connection, 502/503/504) is sent again with capped backoff — `wait` until its own `timeout`, `events` and
`stream` for as long as it takes, every other call for `retry_s` (`DEFAULT_RETRY_S`; `ping` never). When that
time runs out, `ApiUnavailableError` (a `TimeoutError`, as `RedisUnavailableError` is) names the base URL and
the last failure. `events` and `stream` reconnect with `Last-Event-ID`, the id of the last event they
yielded: nothing lost, nothing repeated. A retried `submit` stores its turn once: its id is chosen before the
first try and sent with it (a repeated id is a no-op). A `call_tool` is sent again only when it never reached
the API (it could not connect): a direct call has no id that would make a second one a no-op, so once the
API may have dispatched it, a dropped connection or a 5xx raises `ApiUnavailableError` at once, as the Redis
clients' `call_tool` lets a Redis error through.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from orchestrator.client.direct import DirectCall, build_direct_call
from orchestrator.client.submission import Submission, build_submission, takes_arguments_of
from orchestrator.errors import (
    ApiAuthError,
    ApiUnavailableError,
    CallNotWaitingError,
    ModelConfigError,
    UnknownToolError,
    UnknownTurnError,
)
from orchestrator.model import Message, TurnOutcome, TurnRequest
from orchestrator.schedules import calls as schedule_calls
from orchestrator.schedules.schedule import Schedule, ScheduleView
from orchestrator.store import codec
from orchestrator.store.codec import TurnEvent
from orchestrator.store.forks import parse_replacement
from orchestrator.store.runner import DEFAULT_RETRY_S, Patience
from orchestrator.store.turn_stream import StreamEvent, TurnFinishedEvent, parse_stream_event
from orchestrator.store.turn_view import TurnView
from orchestrator.tracing import attach_trace_context
from workers.agents import AgentSpec
from workers.contract import DEFAULT_TENANT, ToolOutcome
from workers.tracing import build_carrier

__all__ = [
    "DEFAULT_RETRY_S",
    "ApiAuthError",
    "ApiOutage",
    "ApiUnavailableError",
    "AsyncHttpClient",
    "EventFollow",
    "HttpCall",
    "HttpClient",
    "SseDecoder",
    "SseMessage",
]

T = TypeVar("T")

# A request's timeouts: the API itself waits up to `api_redis_retry_s` (10 s) for Redis before its 503.
REQUEST_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
# How long an events stream may say nothing, keep-alive comments included (the API sends one every
# `api_sse_keepalive_s`, 10 s by default), before the connection is taken for dead and opened again.
STREAM_READ_TIMEOUT_S = 45.0
# Answers that say "the API is not there right now": a proxy without a backend, the API without Redis.
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
# Failures of the connection itself: an API stopped, restarting, or cut off mid-answer.
RETRIED_ERRORS: tuple[type[Exception], ...] = (
    httpx.NetworkError,
    httpx.TimeoutException,
    httpx.RemoteProtocolError,
)
# Failures of a try that never reached the API: sending it again cannot make a second call.
UNSENT_ERRORS: tuple[type[Exception], ...] = (httpx.ConnectError, httpx.ConnectTimeout)
# What a try may fail with and be looked at by `ApiOutage.failed`: the above, and an answer whose status
# says the API is away (`raise_if_away`), as httpx's `HTTPStatusError`.
RETRIED: tuple[type[Exception], ...] = (httpx.HTTPStatusError, *RETRIED_ERRORS)
# How much longer than its own `timeout_s` a `call_tool` request may take: the API's own patience with its
# Redis (`api_redis_retry_s`, 10 s) and the publish on top of the call.
CALL_MARGIN_S = 30.0
# Where a 422 names the model: a turn's, or a schedule's request's.
MODEL_LOCATIONS = (["body", "model"], ["body", "request", "model"])


# --- the core (pure) -------------------------------------------------------------------------------------


def is_api_away(exc: BaseException) -> bool:
    """True when `exc` says the API is not there right now (stopped, restarting, cut off, a proxy without a
    backend, or the API without Redis): a failure to retry."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code in UNAVAILABLE_STATUSES
    return isinstance(exc, RETRIED_ERRORS)


def raise_if_away(answer: httpx.Response) -> None:
    """httpx's `HTTPStatusError` for an answer that says the API is away (502, 503, 504), to be retried."""
    if answer.status_code in UNAVAILABLE_STATUSES:
        answer.raise_for_status()


def build_segment(value: str) -> str:
    """One path segment percent-encoded, dots too (`.` and `..` are dot segments an HTTP client would
    remove, reaching another route)."""
    return quote(value, safe="").replace(".", "%2E")


def build_turn_path(turn_id: str, *rest: str) -> str:
    """`/v1/turns/<id>/…`, each segment percent-encoded (`build_segment`)."""
    return "/v1/turns/" + "/".join(build_segment(s) for s in (turn_id, *rest))


def build_refusal(detail: Any) -> ValueError:
    """The error of a 422's `detail`: `UnknownToolError` for unknown tools, `ModelConfigError` for the
    model, else a `ValueError` naming each field and its problem."""
    items = [item for item in detail if isinstance(item, Mapping)] if isinstance(detail, list) else []
    unknown = [item for item in items if item.get("type") == "unknown_tool"]
    if unknown:
        tools = [str(item.get("ctx", {}).get("tool")) for item in unknown]
        return UnknownToolError(tools, unknown[0].get("ctx", {}).get("available", []))
    model = [item for item in items if list(item.get("loc", [])) in MODEL_LOCATIONS]
    if model and model[0].get("type") == "value_error":
        return ModelConfigError(str(model[0].get("msg")))
    if not items:
        return ValueError(str(detail))
    lines = []
    for item in items:
        where = ".".join(str(part) for part in list(item.get("loc", []))[1:])
        lines.append(f"{where}: {item.get('msg')}" if where else str(item.get("msg")))
    return ValueError("; ".join(lines))


def raise_for_answer(answer: httpx.Response, turn_id: str | None = None) -> None:
    """Nothing for a 2xx; else the error of the tree the answer means (httpx's `HTTPStatusError` for 502,
    503 and 504, which `ApiOutage` retries, and for an answer the API does not document)."""
    if answer.is_success:
        return
    raise_if_away(answer)
    if answer.status_code in {401, 403}:
        url = answer.request.url.copy_with(query=None)
        raise ApiAuthError(f"{answer.request.method} {url}", answer.status_code, build_detail(answer))
    if answer.status_code == 404 and turn_id is not None:
        raise UnknownTurnError(turn_id)
    if answer.status_code == 422:
        raise build_refusal(build_body(answer).get("detail"))
    if answer.status_code in {400, 413}:  # a body the API could not parse, or over its limit
        raise ValueError(build_detail(answer))
    answer.raise_for_status()


def build_body(answer: httpx.Response) -> dict[str, Any]:
    """An error answer's JSON object (`ErrorBody`), or {} when it has none."""
    try:
        body = answer.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def build_detail(answer: httpx.Response) -> str:
    """An error answer's one-line `detail`, else its status text."""
    detail = build_body(answer).get("detail")
    return detail if isinstance(detail, str) else answer.reason_phrase


@dataclass(frozen=True)
class HttpCall(Generic[T]):
    """One request of the API, and how its answer becomes a value (or an error of the tree).

    `body` goes as JSON (httpx's: NaN and infinities refused), `content` as it is; `timeout` replaces the
    client's own (`REQUEST_TIMEOUT`) for a request the API holds open longer; `resend` False marks a request
    that must not be sent again once it may have reached the API."""

    method: str
    path: str
    read: Callable[[httpx.Response], T]
    body: Any = None
    content: bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, str] = field(default_factory=dict)
    timeout: httpx.Timeout | None = None
    resend: bool = True


def build_submit_call(request: TurnRequest, turn_id: str) -> HttpCall[str]:
    """`POST /v1/turns` of `request` under `turn_id` (chosen by the caller: a retry stores the turn once);
    its trace context goes as the `traceparent` header, the only one the API takes. The tenant goes only when
    it is not the default, so a client still submits to an API that predates tenants; so does the priority."""
    body = request.model_dump(mode="json", exclude={"trace_context"})
    if request.tenant == DEFAULT_TENANT:
        del body["tenant"]
    if request.priority == "normal":
        del body["priority"]

    def read(answer: httpx.Response) -> str:
        raise_for_answer(answer)
        submitted: str = answer.json()["id"]
        return submitted

    headers = request.trace_context or {}
    return HttpCall("POST", "/v1/turns", read, {**body, "turn_id": turn_id}, headers=headers)


def build_fork_call(
    turn_id: str,
    at: int,
    *,
    replace: Message | Mapping[str, Any] | None,
    model: str | Sequence[str] | None,
    instructions: str | None,
    fork_id: str,
    trace: Mapping[str, str] | None = None,
) -> HttpCall[str]:
    """`POST /v1/turns/{id}/fork` under `fork_id` (chosen by the caller: a retry stores the fork once); a
    `replace` that is not a message is refused before anything is sent, as the Redis clients refuse it.
    Fields left at their defaults are not sent."""
    body: dict[str, Any] = {"at": at, "fork_id": fork_id}
    replacement = parse_replacement(replace)
    if replacement is not None:
        body["replace"] = replacement.model_dump(mode="json")
    if model is not None:
        body["model"] = model if isinstance(model, str) else list(model)
    if instructions is not None:
        body["instructions"] = instructions

    def read(answer: httpx.Response) -> str:
        raise_for_answer(answer, turn_id)
        forked: str = answer.json()["id"]
        return forked

    return HttpCall("POST", build_turn_path(turn_id, "fork"), read, body, headers=trace or {})


def build_view_call(turn_id: str) -> HttpCall[TurnView]:
    """`GET /v1/turns/{id}`: the turn's view."""

    def read(answer: httpx.Response) -> TurnView:
        raise_for_answer(answer, turn_id)
        return TurnView.model_validate_json(answer.content)

    return HttpCall("GET", build_turn_path(turn_id), read)


def build_health_call() -> HttpCall[bool]:
    """`GET /healthz`: True once it answers 200 (a 503, the API without Redis, is retried or raised as any
    is; the caller says how patient to be)."""

    def read(answer: httpx.Response) -> bool:
        raise_for_answer(answer)
        return True

    return HttpCall("GET", "/healthz", read)


def build_agents_call() -> HttpCall[list[AgentSpec]]:
    """`GET /v1/agents`: every named agent, by name."""

    def read(answer: httpx.Response) -> list[AgentSpec]:
        raise_for_answer(answer)
        return [AgentSpec.model_validate(item) for item in answer.json()]

    return HttpCall("GET", "/v1/agents", read)


def build_register_agent_call(spec: AgentSpec) -> HttpCall[None]:
    """`PUT /v1/agents/{name}` of `spec` (the admin's scope)."""

    def read(answer: httpx.Response) -> None:
        raise_for_answer(answer)

    body = spec.model_dump(mode="json", exclude_defaults=True)
    return HttpCall("PUT", f"/v1/agents/{quote(spec.name, safe='')}", read, body=body)


def build_schedule_path(name: str) -> str:
    """`/v1/schedules/<name>`, percent-encoded (`build_segment`)."""
    return "/v1/schedules/" + build_segment(name)


def build_put_schedule_call(schedule: Schedule) -> HttpCall[ScheduleView]:
    """`PUT /v1/schedules/{name}` of `schedule` (built and checked by `schedules.calls.build_schedule_call`,
    as the Redis clients build it): its timing, overlap policy and request, the request's fields at their
    defaults left out as when it is stored (`codec.dump_request`; the tenant: the key's own). Its creation
    time is the API's, which anchors an interval's runs. Another tenant's name (409 `schedule_taken`) is a
    `ValueError`."""
    body: dict[str, Any] = {
        "name": schedule.name,
        "overlap": schedule.overlap,
        "request": json.loads(codec.dump_request(schedule.request)),
    }
    if schedule.cron is not None:
        body["cron"] = schedule.cron
    if schedule.every_s is not None:
        body["every_s"] = schedule.every_s

    def read(answer: httpx.Response) -> ScheduleView:
        if answer.status_code == 409 and build_body(answer).get("code") == "schedule_taken":
            raise ValueError(build_detail(answer))
        raise_for_answer(answer)
        return ScheduleView.model_validate_json(answer.content)

    return HttpCall("PUT", build_schedule_path(schedule.name), read, body)


def build_delete_schedule_call(name: str) -> HttpCall[bool]:
    """`DELETE /v1/schedules/{name}`: True once removed, False when there was none (404)."""

    def read(answer: httpx.Response) -> bool:
        if answer.status_code == 404:
            return False
        raise_for_answer(answer)
        return True

    return HttpCall("DELETE", build_schedule_path(name), read)


def build_schedules_call() -> HttpCall[list[ScheduleView]]:
    """`GET /v1/schedules`: the key's tenant's schedules, by name, with their state and next run."""

    def read(answer: httpx.Response) -> list[ScheduleView]:
        raise_for_answer(answer)
        return [ScheduleView.model_validate(item) for item in answer.json()]

    return HttpCall("GET", "/v1/schedules", read)


def build_outcome_call(turn_id: str) -> HttpCall[TurnOutcome | None]:
    """`GET /v1/turns/{id}`, read for its outcome: None while the turn runs, and for an unknown turn (404),
    as `Client.outcome` answers both (a turn that expired has no outcome any more)."""

    def read(answer: httpx.Response) -> TurnOutcome | None:
        if answer.status_code == 404:
            return None
        raise_for_answer(answer)
        return TurnView.model_validate_json(answer.content).outcome

    return HttpCall("GET", build_turn_path(turn_id), read)


def build_tool_call(call: DirectCall, trace: Mapping[str, str] | None = None) -> HttpCall[ToolOutcome]:
    """`POST /v1/tools/{name}/calls`: the call's outcome, held open for its `timeout_s` (plus the API's own
    margin), never sent again once it may have reached the API (`resend`); `trace` (the caller's trace
    context, `traceparent`) goes as headers, as a submit's does, so the tool's span continues it."""

    def read(answer: httpx.Response) -> ToolOutcome:
        raise_for_answer(answer)
        return ToolOutcome.model_validate_json(answer.content)

    body = {
        "arguments": call.arguments,
        "timeout_s": call.timeout_s,
        "context": call.context,
        "approve": call.approve,
    }
    if call.tenant != DEFAULT_TENANT:  # as a submit's: an API that predates tenants takes the call
        body["tenant"] = call.tenant
    # NaN and infinities go as JSON's common extension (the API reads them), so that arguments holding one
    # get the `validation` outcome the Redis clients give, not an error of the client's own.
    content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    read_s = max(call.timeout_s, 0.0) + CALL_MARGIN_S if math.isfinite(call.timeout_s) else None
    timeout = httpx.Timeout(REQUEST_TIMEOUT.write, connect=REQUEST_TIMEOUT.connect, read=read_s)
    path = f"/v1/tools/{build_segment(call.name)}/calls"
    headers = {**(trace or {}), "Content-Type": "application/json"}
    return HttpCall("POST", path, read, content=content, headers=headers, timeout=timeout, resend=False)


def build_tool_result_call(turn_id: str, call_id: str, result: Any, error: str | None) -> HttpCall[bool]:
    """`POST /v1/turns/{id}/calls/{call_id}/result`: `{"result": ...}` or `{"error": "..."}`. What the Redis
    clients refuse before sending is refused here too (`flows` checks the same)."""
    if not call_id:
        raise ValueError("call_id must not be empty")
    if error is not None:
        if result is not None:
            raise ValueError("send either 'result' or 'error', not both")
        if not error.strip():
            raise ValueError("'error' must not be blank")
        body: dict[str, Any] = {"error": error}
    else:
        codec.dump_client_result(result, codec.CLIENT_RESULT_MAX_BYTES)
        body = {"result": result}
    return HttpCall(
        "POST",
        build_turn_path(turn_id, "calls", call_id, "result"),
        lambda a: read_control(a, turn_id, call_id),
        body,
    )


def read_control(answer: httpx.Response, turn_id: str, call_id: str | None = None) -> bool:
    """A cancel's or an approval's answer: True when accepted, False when the turn had ended (409
    `turn_ended`); `CallNotWaitingError` for a call that waits for no answer."""
    if answer.status_code == 409:
        code = build_body(answer).get("code")
        if code == "turn_ended":
            return False
        if call_id is not None and code in {"call_not_waiting", "call_decided"}:
            raise CallNotWaitingError(turn_id, call_id, decided=code == "call_decided")
    raise_for_answer(answer, turn_id)
    return True


def build_cancel_call(turn_id: str) -> HttpCall[bool]:
    """`POST /v1/turns/{id}/cancel`."""
    return HttpCall("POST", build_turn_path(turn_id, "cancel"), lambda a: read_control(a, turn_id))


def build_approval_call(
    turn_id: str,
    call_id: str,
    approved: bool,
    arguments: Mapping[str, Any] | None,
    reason: str | None,
    *,
    decided_by: str | None = None,
) -> HttpCall[bool]:
    """`POST /v1/turns/{id}/approvals/{call_id}`. An empty `call_id` (a path with an empty segment would
    reach no route) and `arguments` JSON cannot carry are refused before anything is sent, as the Redis
    clients refuse them. `decided_by` goes only when given, so a client still answers through an API that
    predates it."""
    if not call_id:
        raise ValueError("call_id must not be empty")
    codec.dump_control_arguments(arguments)
    body: dict[str, Any] = {
        "approved": approved,
        "arguments": dict(arguments) if arguments is not None else None,
        "reason": reason,
    }
    if decided_by is not None:
        body["decided_by"] = decided_by
    return HttpCall(
        "POST",
        build_turn_path(turn_id, "approvals", call_id),
        lambda a: read_control(a, turn_id, call_id),
        body,
    )


def build_finished_event(event: TurnEvent, view: TurnView) -> TurnFinishedEvent:
    """The typed last event of a stream, with the outcome the turn's view shows (redacted)."""
    if view.outcome is None:
        raise UnknownTurnError(event.turn_id)  # as `turn_stream.stream_turn`: the outcome went with the turn
    return TurnFinishedEvent(id=event.id, turn_id=event.turn_id, at=event.at, outcome=view.outcome)


@dataclass(frozen=True)
class SseMessage:
    """One server-sent event: its `event` name, `data` (its lines joined) and `id` (None: none given)."""

    event: str
    data: str
    id: str | None


@dataclass
class SseDecoder:
    """Server-sent events from the lines of a `text/event-stream` body, as the HTML standard reads them
    (comments skipped, `data` lines joined, a message dispatched at a blank line).

    Hand-written rather than a dependency: id, event and data are all the API sends, and a line at a time is
    what `iter_lines` of both httpx clients gives."""

    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id: str | None = None

    def feed(self, line: str) -> SseMessage | None:
        """The message a blank line completes, else None."""
        if not line:
            message = SseMessage(self._event or "message", "\n".join(self._data), self._id)
            had_data = bool(self._data)
            self._event, self._data, self._id = "", [], None
            return message if had_data else None
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        return None


@dataclass
class EventFollow:
    """Where a follower of a turn's events stream is: the id of the last event it handed out (where a new
    connection resumes, as `Last-Event-ID`) and whether that was `turn_finished`."""

    turn_id: str
    cursor: str
    finished: bool = False
    decoder: SseDecoder = field(default_factory=SseDecoder)

    def build_path(self) -> str:
        """The stream's path."""
        return build_turn_path(self.turn_id, "events")

    def reconnect(self) -> dict[str, str]:
        """A new connection's headers (resume after the cursor); a fresh decoder for its body."""
        self.decoder = SseDecoder()
        return {"Accept": "text/event-stream", "Last-Event-ID": self.cursor}

    def feed(self, line: str) -> TurnEvent | None:
        """The event a line completes, else None; the cursor moves past it."""
        message = self.decoder.feed(line)
        if message is None:
            return None
        event = TurnEvent.model_validate_json(message.data)
        self.cursor = event.id
        self.finished = event.name == codec.TURN_FINISHED
        return event


class ApiOutage:
    """The failed tries of one call while the API is away: the pause before the next (capped backoff, the
    Redis clients' `Patience`), `ApiUnavailableError` once the patience has run out."""

    def __init__(self, patience: Patience, where: str) -> None:
        self.patience = patience
        self.where = where
        self.failures = 0
        self.since = patience.clock()

    def failed(self, exc: Exception, *, resend: bool = True, streaming: bool = False) -> float:
        """The pause before the next try after `exc`; raises when not to try again: `exc` itself when it
        does not say the API is away (`is_api_away`), `ApiUnavailableError` once the patience has run out or
        at once for a call that may have reached the API and must not be sent again (`resend` False), and
        `TimeoutError` for a stream whose read ran into the caller's deadline (`streaming`: the API was
        there, the turn said nothing)."""
        if not is_api_away(exc):
            raise exc
        if streaming and isinstance(exc, httpx.ReadTimeout) and self.failures == 0 and self.is_over():
            raise TimeoutError("the caller's time ran out while the stream was quiet") from exc
        self.failures += 1
        pause = self.patience.build_pause_s(self.failures)
        if pause is None or not (resend or isinstance(exc, UNSENT_ERRORS)):
            raise ApiUnavailableError(self.where, self.patience.clock() - self.since, exc) from exc
        return pause

    def answered(self) -> None:
        """The API answered: a later failure starts its backoff again."""
        self.failures = 0

    def is_over(self) -> bool:
        """True once the patience has run out."""
        return self.patience.until is not None and self.patience.clock() >= self.patience.until


class _HttpCore:
    """What both faces share: where the API is, how to authenticate, how patient to be."""

    def __init__(
        self, base_url: str, token: str | None, retry_s: float | None, clock: Callable[[], float]
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry_s = retry_s
        self._clock = clock
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _outage(self, seconds: float | None) -> ApiOutage:
        return ApiOutage(Patience.for_s(seconds, self._clock), self.base_url)

    def _patient(self) -> ApiOutage:
        return self._outage(self.retry_s)

    @staticmethod
    def _build_submit(submission: Submission) -> HttpCall[str]:
        request = attach_trace_context(submission.request)
        return build_submit_call(request, submission.turn_id or codec.new_turn_id(request.conversation_id))

    @staticmethod
    def _stream_timeout(outage: ApiOutage) -> httpx.Timeout:
        # A read never waits past the caller's deadline: a `wait` ends on time whatever the stream does.
        until = outage.patience.until
        left_s = STREAM_READ_TIMEOUT_S if until is None else max(until - outage.patience.clock(), 0.001)
        return httpx.Timeout(min(STREAM_READ_TIMEOUT_S, left_s), connect=REQUEST_TIMEOUT.connect)


def _timed_out(turn_id: str, timeout: float) -> TimeoutError:
    return TimeoutError(f"turn {turn_id!r} did not finish within {timeout:g} s")


# --- the sync face ---------------------------------------------------------------------------------------


class HttpClient(_HttpCore):
    """Synchronous client of the HTTP API: `HttpClient(base_url, token=None)`; `Client`'s methods.

    `retry_s`: how long a call without a timeout of its own waits through an API restart (None: forever).
    `transport`: an httpx transport of the caller's (a proxy's, or `httpx.MockTransport` in tests);
    `sleep` and `clock`: how the client waits between tries and reads the time (tests drive both)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        retry_s: float | None = DEFAULT_RETRY_S,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(base_url, token, retry_s, clock)
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=self.base_url, headers=self._headers, timeout=REQUEST_TIMEOUT, transport=transport
        )

    def _send(self, call: HttpCall[T], outage: ApiOutage | None = None) -> T:
        outage = outage or self._patient()
        while True:
            try:
                answer = self._http.request(
                    call.method,
                    call.path,
                    json=call.body,
                    content=call.content,
                    headers=call.headers,
                    params=call.params,
                    timeout=call.timeout or REQUEST_TIMEOUT,
                )
                raise_if_away(answer)
            except RETRIED as exc:
                self._sleep(outage.failed(exc, resend=call.resend))
                continue
            return call.read(answer)

    @takes_arguments_of(build_submission)
    def submit(self, submission: Submission) -> str:
        """Submit a turn; returns its id once the API has stored it. A repeated `turn_id` is a no-op (an id
        over HTTP: 1–200 letters, digits, `_` or `-`).

        `UnknownToolError` when it names tools no live worker serves (accepted while none has published)."""
        return self._send(self._build_submit(submission))

    def submit_request(self, request: TurnRequest, *, turn_id: str | None = None) -> str:
        """Submit an already built `TurnRequest`, with the caller's current trace context unless it carries
        one (sent as `traceparent`)."""
        return self._send(self._build_submit(Submission(request, turn_id)))

    def get(self, turn_id: str) -> TurnView:
        """Status, request, transcript so far, calls waiting for approval, and the outcome once terminal;
        sensitive values redacted."""
        return self._send(build_view_call(turn_id))

    def fork(
        self,
        turn_id: str,
        at: int,
        *,
        replace: Message | Mapping[str, Any] | None = None,
        model: str | Sequence[str] | None = None,
        instructions: str | None = None,
        fork_id: str | None = None,
    ) -> str:
        """A new turn from turn `turn_id`'s messages up to message `at`, `replace` in its place (or message
        `at` itself), run on from there; returns its id. As `Client.fork`; its id is chosen before the first
        try (a retry stores the fork once)."""
        fork_id = fork_id or codec.new_turn_id()
        call = build_fork_call(
            turn_id,
            at,
            replace=replace,
            model=model,
            instructions=instructions,
            fork_id=fork_id,
            trace=build_carrier(),
        )
        return self._send(call)

    def outcome(self, turn_id: str) -> TurnOutcome | None:
        """The terminal outcome (sensitive values redacted), or None while the turn runs (and for an unknown
        turn, as from `Client.outcome`)."""
        return self._send(build_outcome_call(turn_id))

    def wait(self, turn_id: str, timeout: float) -> TurnOutcome:
        """Block until the turn is terminal (woken by its events stream); `TimeoutError` after `timeout` s.

        The outcome comes redacted, as `get` shows it. An API restart is ridden out until `timeout`
        (`ApiUnavailableError`, a `TimeoutError` too, if the API is still away then)."""
        outage = self._outage(timeout)
        try:
            view = self._send(build_view_call(turn_id), outage)
            if view.outcome is None:
                for event in self._follow(turn_id, "0", outage):
                    if event.name == codec.TURN_FINISHED:
                        break
                view = self._send(build_view_call(turn_id), outage)
        except ApiUnavailableError:
            raise  # the API away when the caller's time ran out, as `RedisUnavailableError` from `Client`
        except TimeoutError as exc:
            raise _timed_out(turn_id, timeout) from exc
        if view.outcome is None:
            raise _timed_out(turn_id, timeout)
        return view.outcome

    def events(self, turn_id: str, after: str = "0", *, block_ms: int | None = None) -> Iterator[TurnEvent]:
        """The turn's events as they come, from `after` on, ending after `turn_finished`.

        `block_ms` is the Redis clients' and has no effect here: the API's keep-alives pace the stream.
        Quiet spells and API restarts are ridden out: the next connection starts after the last event
        yielded."""
        return self._follow(turn_id, after, self._outage(None))

    def stream(self, turn_id: str, after: str = "0", *, block_ms: int | None = None) -> Iterator[StreamEvent]:
        """The turn as it happens, typed (`store.turn_stream`), a `TurnFinishedEvent` with the outcome last;
        from `after` on, riding out restarts as `events` does."""
        for event in self._follow(turn_id, after, self._outage(None)):
            if event.name != codec.TURN_FINISHED:
                yield parse_stream_event(event)
            else:
                yield build_finished_event(event, self._send(build_view_call(turn_id)))

    def _follow(self, turn_id: str, after: str, outage: ApiOutage) -> Iterator[TurnEvent]:
        follow = EventFollow(turn_id, after)
        while not follow.finished:
            try:
                with self._http.stream(
                    "GET",
                    follow.build_path(),
                    headers=follow.reconnect(),
                    timeout=self._stream_timeout(outage),
                ) as answer:
                    if not answer.is_success:
                        answer.read()
                        raise_for_answer(answer, turn_id)
                    outage.answered()
                    for line in answer.iter_lines():
                        if (event := follow.feed(line)) is not None:
                            yield event
                        if outage.is_over():
                            raise TimeoutError(f"turn {turn_id!r}: the caller's time ran out")
            except RETRIED as exc:
                self._sleep(outage.failed(exc, streaming=True))
                continue
            if not follow.finished and self._has_ended(turn_id, outage):
                return

    def _has_ended(self, turn_id: str, outage: ApiOutage) -> bool:
        # A stream that ended without turn_finished: the turn is gone or its end was trimmed, or the API
        # stopped (a graceful restart ends streams too), and then the follower connects again.
        try:
            view = self._send(build_view_call(turn_id), outage)
        except UnknownTurnError:
            return True
        return view.status.terminal

    def cancel(self, turn_id: str) -> bool:
        """Ask for the turn to be cancelled; False when it had already ended."""
        return self._send(build_cancel_call(turn_id))

    def approve(
        self,
        turn_id: str,
        call_id: str,
        approved: bool,
        *,
        arguments: Mapping[str, Any] | None = None,
        reason: str | None = None,
        decided_by: str | None = None,
    ) -> bool:
        """Approve (True) or deny (False) a call waiting for confirmation; False when the turn had ended.

        Edited `arguments` that fail the tool's schema raise a `ValueError`; `CallNotWaitingError` when the
        turn waits for no answer about this call (unknown, or answered already: the first answer stands).
        `decided_by` (who answered) and `reason` are kept in the turn's `approvals`."""
        return self._send(
            build_approval_call(turn_id, call_id, approved, arguments, reason, decided_by=decided_by)
        )

    def submit_tool_result(
        self, turn_id: str, call_id: str, *, result: Any = None, error: str | None = None
    ) -> bool:
        """Answer a call of a client-side tool with its `result` (any JSON) or an `error` message; False when
        the turn had ended. A `ValueError` for a refused answer; `CallNotWaitingError` when the turn waits
        for no result of this call (unknown, or answered already: the first answer stands)."""
        return self._send(build_tool_result_call(turn_id, call_id, result, error))

    @takes_arguments_of(build_direct_call)
    def call_tool(self, call: DirectCall) -> ToolOutcome:
        """Run one tool call through the workers, no model involved; returns its outcome (a failure one for
        an unknown tool, arguments its schema refuses, or no answer within `timeout_s`).

        A `requires_confirmation` tool runs only with `approve=True` (the caller is the person approving);
        without it, the outcome is `confirmation_denied` and nothing is dispatched. Sent again only while
        the API cannot be reached at all; `ApiUnavailableError` once it may have dispatched the call."""
        return self._send(build_tool_call(call, build_carrier()))

    @takes_arguments_of(schedule_calls.build_schedule_call)
    def schedule(self, schedule: Schedule) -> ScheduleView:
        """Run a turn on a schedule: `schedule(name, cron=... or every_s=..., overlap="skip", **the arguments
        of submit)`; `toolloop beat` submits each run, a turn of the key's tenant. A schedule of that name is
        replaced. Checked as a submit is (`ValueError`: a bad cron expression, a name another tenant holds;
        `UnknownToolError`, `ModelConfigError`); returns it with its next run. As `Client.schedule`."""
        return self._send(build_put_schedule_call(schedule))

    def unschedule(self, name: str) -> bool:
        """Remove the schedule `name` (its runs' turns stay); False when there was none (or another
        tenant's)."""
        return self._send(build_delete_schedule_call(name))

    def schedules(self) -> list[ScheduleView]:
        """The key's tenant's schedules, by name, with their last runs (turn ids), skipped ticks, last error
        and next run; their requests redacted."""
        return self._send(build_schedules_call())

    def register_agent(self, spec: AgentSpec) -> None:
        """Register (or replace) a named agent: every orchestrator and the API know it at once."""
        self._send(build_register_agent_call(spec))

    def list_agents(self) -> list[AgentSpec]:
        """Every named agent, by name: those the workers' modules declare and those registered."""
        return self._send(build_agents_call())

    def ping(self) -> bool:
        """True when the API answers `/healthz` with 200 (it and its Redis are there); never retried:
        `ApiUnavailableError` at once when they are not, as `Client.ping` lets Redis's `ConnectionError`
        through."""
        return self._send(build_health_call(), self._outage(0.0))

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


# --- the async face --------------------------------------------------------------------------------------


class AsyncHttpClient(_HttpCore):
    """Asynchronous client of the HTTP API with the same methods as `HttpClient` (`AsyncClient`'s)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        retry_s: float | None = DEFAULT_RETRY_S,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Any] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(base_url, token, retry_s, clock)
        self._sleep = sleep
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=self._headers, timeout=REQUEST_TIMEOUT, transport=transport
        )

    async def _send(self, call: HttpCall[T], outage: ApiOutage | None = None) -> T:
        outage = outage or self._patient()
        while True:
            try:
                answer = await self._http.request(
                    call.method,
                    call.path,
                    json=call.body,
                    content=call.content,
                    headers=call.headers,
                    params=call.params,
                    timeout=call.timeout or REQUEST_TIMEOUT,
                )
                raise_if_away(answer)
            except RETRIED as exc:
                await self._sleep(outage.failed(exc, resend=call.resend))
                continue
            return call.read(answer)

    @takes_arguments_of(build_submission)
    async def submit(self, submission: Submission) -> str:
        """Submit a turn; returns its id once the API has stored it. As `HttpClient.submit`."""
        return await self._send(self._build_submit(submission))

    async def submit_request(self, request: TurnRequest, *, turn_id: str | None = None) -> str:
        """Submit an already built `TurnRequest`. As `HttpClient.submit_request`."""
        return await self._send(self._build_submit(Submission(request, turn_id)))

    async def get(self, turn_id: str) -> TurnView:
        """The turn's view, redacted. As `HttpClient.get`."""
        return await self._send(build_view_call(turn_id))

    async def fork(
        self,
        turn_id: str,
        at: int,
        *,
        replace: Message | Mapping[str, Any] | None = None,
        model: str | Sequence[str] | None = None,
        instructions: str | None = None,
        fork_id: str | None = None,
    ) -> str:
        """A new turn from turn `turn_id`'s messages up to message `at`, run on from there; returns its id.
        As `HttpClient.fork`."""
        fork_id = fork_id or codec.new_turn_id()
        call = build_fork_call(
            turn_id,
            at,
            replace=replace,
            model=model,
            instructions=instructions,
            fork_id=fork_id,
            trace=build_carrier(),
        )
        return await self._send(call)

    async def outcome(self, turn_id: str) -> TurnOutcome | None:
        """The terminal outcome (redacted), or None while the turn runs or is unknown. As `HttpClient`'s."""
        return await self._send(build_outcome_call(turn_id))

    # `timeout` rather than asyncio.timeout: the same signature as the sync `wait` (the contract).
    async def wait(self, turn_id: str, timeout: float) -> TurnOutcome:  # noqa: ASYNC109
        """Wait until the turn is terminal; `TimeoutError` after `timeout` s. As `HttpClient.wait`."""
        outage = self._outage(timeout)
        try:
            view = await self._send(build_view_call(turn_id), outage)
            if view.outcome is None:
                async for event in self._follow(turn_id, "0", outage):
                    if event.name == codec.TURN_FINISHED:
                        break
                view = await self._send(build_view_call(turn_id), outage)
        except ApiUnavailableError:
            raise  # the API away when the caller's time ran out, as `RedisUnavailableError` from `Client`
        except TimeoutError as exc:
            raise _timed_out(turn_id, timeout) from exc
        if view.outcome is None:
            raise _timed_out(turn_id, timeout)
        return view.outcome

    def events(
        self, turn_id: str, after: str = "0", *, block_ms: int | None = None
    ) -> AsyncIterator[TurnEvent]:
        """The turn's events as they come, from `after` on, ending after `turn_finished`; as `HttpClient`'s
        (`block_ms` has no effect)."""
        return self._follow(turn_id, after, self._outage(None))

    async def stream(
        self, turn_id: str, after: str = "0", *, block_ms: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        """The turn as it happens, typed, `TurnFinishedEvent` last; as `HttpClient`'s."""
        async for event in self._follow(turn_id, after, self._outage(None)):
            if event.name != codec.TURN_FINISHED:
                yield parse_stream_event(event)
            else:
                yield build_finished_event(event, await self._send(build_view_call(turn_id)))

    async def _follow(self, turn_id: str, after: str, outage: ApiOutage) -> AsyncIterator[TurnEvent]:
        follow = EventFollow(turn_id, after)
        while not follow.finished:
            try:
                async with self._http.stream(
                    "GET",
                    follow.build_path(),
                    headers=follow.reconnect(),
                    timeout=self._stream_timeout(outage),
                ) as answer:
                    if not answer.is_success:
                        await answer.aread()
                        raise_for_answer(answer, turn_id)
                    outage.answered()
                    async for line in answer.aiter_lines():
                        if (event := follow.feed(line)) is not None:
                            yield event
                        if outage.is_over():
                            raise TimeoutError(f"turn {turn_id!r}: the caller's time ran out")
            except RETRIED as exc:
                await self._sleep(outage.failed(exc, streaming=True))
                continue
            if not follow.finished and await self._has_ended(turn_id, outage):
                return

    async def _has_ended(self, turn_id: str, outage: ApiOutage) -> bool:
        try:
            view = await self._send(build_view_call(turn_id), outage)
        except UnknownTurnError:
            return True
        return view.status.terminal

    async def cancel(self, turn_id: str) -> bool:
        """Ask for the turn to be cancelled; False when it had already ended."""
        return await self._send(build_cancel_call(turn_id))

    async def approve(
        self,
        turn_id: str,
        call_id: str,
        approved: bool,
        *,
        arguments: Mapping[str, Any] | None = None,
        reason: str | None = None,
        decided_by: str | None = None,
    ) -> bool:
        """Approve (with edited `arguments`) or deny (with a `reason`) a waiting call, as `decided_by`; as
        `HttpClient`'s."""
        return await self._send(
            build_approval_call(turn_id, call_id, approved, arguments, reason, decided_by=decided_by)
        )

    async def submit_tool_result(
        self, turn_id: str, call_id: str, *, result: Any = None, error: str | None = None
    ) -> bool:
        """Answer a call of a client-side tool with its `result` or an `error`; as `HttpClient`'s."""
        return await self._send(build_tool_result_call(turn_id, call_id, result, error))

    @takes_arguments_of(build_direct_call)
    async def call_tool(self, call: DirectCall) -> ToolOutcome:
        """Run one tool call through the workers; a confirmed tool only with `approve=True`. As
        `HttpClient.call_tool`."""
        return await self._send(build_tool_call(call, build_carrier()))

    @takes_arguments_of(schedule_calls.build_schedule_call)
    async def schedule(self, schedule: Schedule) -> ScheduleView:
        """Run a turn on a schedule; as `HttpClient.schedule`."""
        return await self._send(build_put_schedule_call(schedule))

    async def unschedule(self, name: str) -> bool:
        """Remove the schedule `name`; False when there was none. As `HttpClient.unschedule`."""
        return await self._send(build_delete_schedule_call(name))

    async def schedules(self) -> list[ScheduleView]:
        """The key's tenant's schedules, by name, with their state and next run; as `HttpClient.schedules`."""
        return await self._send(build_schedules_call())

    async def register_agent(self, spec: AgentSpec) -> None:
        """Register (or replace) a named agent: every orchestrator and the API know it at once."""
        await self._send(build_register_agent_call(spec))

    async def list_agents(self) -> list[AgentSpec]:
        """Every named agent, by name: those the workers' modules declare and those registered."""
        return await self._send(build_agents_call())

    async def ping(self) -> bool:
        """True when the API and its Redis answer; `ApiUnavailableError` at once when not. As
        `HttpClient.ping`."""
        return await self._send(build_health_call(), self._outage(0.0))

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncHttpClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
