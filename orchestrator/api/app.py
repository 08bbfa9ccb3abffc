"""The HTTP API (`toolloop api`): turns in, state and events out, over the async client.

Routes: `POST /v1/turns` (202 `{"id"}`), `GET /v1/turns` (the recent turns), `GET /v1/turns/{id}`,
`GET /v1/turns/{id}/events` (SSE, ends after `turn_finished`), `POST /v1/turns/{id}/cancel`,
`POST /v1/turns/{id}/approvals/{call_id}`, `POST /v1/turns/{id}/calls/{call_id}/result` (a client-side
tool's answer), `POST /v1/turns/{id}/fork` (a new turn from one's messages: 202 `{"id"}`), `GET /v1/tools`,
`POST /v1/tools/{name}/calls` (a tool called
without a model: its `ToolOutcome`, a failure one included), `GET /v1/agents`, `PUT /v1/agents/{name}`,
`PUT /v1/schedules/{name}`, `DELETE /v1/schedules/{name}`, `GET /v1/schedules` (turns on a schedule, a
tenant's own: `Client.schedule`'s), `GET /healthz`, `GET /metrics`, and the turn pages `/ui`,
`/ui/turns/{id}` (`orchestrator.api.pages`). With `TOOLLOOP_API_KEYS` or `TOOLLOOP_API_TOKEN`
set, every route but `/healthz` needs `Authorization: Bearer <key>` (401 otherwise), or for reads the pages'
session cookie (and for an approval, the cookie with its CSRF token: the turn page's buttons); a key
without the route's scope gets 403, and sees only its tenant's turns: another tenant's turn is a 404 as an
unknown turn is (`api.access`, which states every rule).
Bodies over `max_body_bytes` get 413, malformed ones 422 with pydantic's messages (never echoing the body: it
may hold what JSON cannot render, such as NaN or an unpaired surrogate, or secrets); a turn naming tools no
live worker serves, or a model name that is neither `provider:model` nor a tier, a model setting its provider
cannot honour or an `output_schema` that is not a JSON Schema (`loc` names the field), edited approval
arguments that fail the tool's schema, 422 too, in the same shape (`loc`, `msg`, `type`; for tools,
`ctx.available` lists the public tools); unknown turns 404; requests for a turn that has already ended 409.
What `GET /v1/turns/{id}` shows is redacted (`store.turn_view`).

The contract is the app's `/openapi.json`: every route declares its answer's model and its error answers
(`ErrorBody`: `detail`, and for a 409 a `code` saying which refusal it is), a tag and a stable
`operation_id` (`submitTurn`, `getTurn`, …, what generated clients name their methods after); the events
route its `text/event-stream` messages, one schema per event type (`api.sse.EVENT_TYPES`); a key (or the
token) is the HTTP bearer scheme `bearerToken`. A submit may carry its own `turn_id`, so a client that
retries after a lost answer stores its turn once (`client.http_client`).

Redis (`api_redis`): requests share a bounded pool, every SSE stream one events reader (`api_fanout`,
`api_sse`), `/healthz` its own connection — 200 when Redis answers PING, 503 when it does not, whatever the
pool. Any Redis failure (unreachable, out of memory, read-only, no connection free in time) answers 503
with `Retry-After` and a one-line reason, never a 500.

A direct tool call (`POST /v1/tools/{name}/calls`) is `AsyncClient.call_tool`'s: the request stays open
for the call's own `timeout_s`, and the call waits on a Redis connection of its own (as the Redis client's
does), not on the request pool — so calls in flight never starve other requests; at most
`api_redis_max_connections` of them at a time (`RedisGate`: 503 past `SLOT_WAIT_S`).

Design notes: docs/design/http-api.md.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator import metrics
from orchestrator.api.access import (
    Access,
    Caller,
    authenticate,
    build_default_tools,
    build_key_listing,
    build_tenant,
    find_tool_refusals,
    require,
    require_turn,
)
from orchestrator.api.connections import ApiRedis, RedisGate, build_failure_reason, build_unavailable_reply
from orchestrator.api.pages.routes import build_listing_router, build_pages_router
from orchestrator.api.sse import EVENTS_DESCRIPTION, build_events_content, turn_events
from orchestrator.client.direct import DEFAULT_CALL_TIMEOUT_S
from orchestrator.client.redis_client import AsyncClient
from orchestrator.errors import CallNotWaitingError, ModelConfigError, UnknownToolError, UnknownTurnError
from orchestrator.model import Message as ChatMessage
from orchestrator.model import TurnRequest
from orchestrator.schedules import calls as schedule_calls
from orchestrator.schedules import storage as schedule_storage
from orchestrator.schedules.schedule import (
    MIN_EVERY_S,
    NAME_PATTERN,
    Overlap,
    Schedule,
    ScheduleView,
    build_schedule,
    parse_cron,
)
from orchestrator.settings import Settings, get_settings
from orchestrator.store import codec
from orchestrator.store.backlog import Backlog, BacklogReader
from orchestrator.store.catalogue import aread_catalogue, get_tool_catalogue
from orchestrator.store.connection import build_shown_url
from orchestrator.store.runner import AsyncRunner, Patience
from orchestrator.store.turn_view import TurnView, build_shown_request
from orchestrator.submit_checks import ModelNames, Refusal, find_refusals
from orchestrator.tracing import continue_http_trace
from workers.agents import AgentSpec
from workers.contract import TENANT_PATTERN, FailureKind, ToolOutcome, ToolSpec, build_failure
from workers.redis_errors import REDIS_ERRORS
from workers.tracing import setup_tracing, shutdown_tracing

log = logging.getLogger("toolloop.api")

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# A turn id a caller may choose over HTTP: one path segment, never a dot segment, nothing to percent-encode.
TURN_ID_PATTERN = r"^[A-Za-z0-9_-]{1,200}$"
# The tags of the API's operations, in the order the documentation shows them.
OPENAPI_TAGS = [
    {
        "name": "turns",
        "description": "Submit a turn, read it, follow its events, cancel it, answer approvals.",
    },
    {"name": "tools", "description": "The tools the live workers serve, and a call of one without a model."},
    {"name": "agents", "description": "The named agents turns may run as: listed, registered by the admin."},
    {
        "name": "schedules",
        "description": "Turns on a cron expression or an interval, run by `toolloop beat`.",
    },
    {"name": "operations", "description": "Health and metrics, for load balancers and Prometheus."},
]


class TurnBody(TurnRequest):
    """The body of `POST /v1/turns`: a `TurnRequest` (unknown fields refused) that has something to answer.

    `turn_id` is the caller's own id for the turn (None: the API chooses one): a submit repeated with it, as a
    client retrying after a lost answer does, stores the turn once and answers the same id."""

    turn_id: str | None = Field(default=None, pattern=TURN_ID_PATTERN)

    @model_validator(mode="after")
    def _needs_prompt_or_messages(self) -> TurnBody:
        codec.check_turn_request(self)
        return self


class ApprovalBody(BaseModel):
    """The body of `POST /v1/turns/{id}/approvals/{call_id}`: approve (with `arguments` a person edited, run
    instead of the model's once validated against the tool's schema) or deny (with a `reason` the model sees
    in the call's result). `decided_by` says who answered; it is kept, with the reason, in the turn's
    `approvals` (its events, its view, its outcome and its archive record)."""

    model_config = ConfigDict(extra="forbid")

    approved: bool
    arguments: dict[str, Any] | None = None
    reason: str | None = None
    decided_by: str | None = Field(default=None, max_length=200)


class ToolResultBody(BaseModel):
    """The body of `POST /v1/turns/{id}/calls/{call_id}/result`: a client-side tool's `result` (any JSON,
    which the model reads as the tool's output) or an `error` (a message, which it reads as the tool's
    failure); exactly one of them."""

    model_config = ConfigDict(extra="forbid")

    result: Any = None
    error: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_answer(self) -> ToolResultBody:
        if ("result" in self.model_fields_set) == ("error" in self.model_fields_set):
            raise ValueError("send either 'result' or 'error'")
        return self


class ForkBody(BaseModel):
    """The body of `POST /v1/turns/{id}/fork`: `Client.fork`'s arguments. `at` is an index in the turn's
    `messages`; `replace` the message put in its place (none: message `at` itself, re-run from there);
    `model` and `instructions` replace the original's; `fork_id` is the caller's id for the fork (None: the
    API chooses one), a fork repeated with it stored once."""

    model_config = ConfigDict(extra="forbid")

    at: int = Field(ge=0)
    replace: ChatMessage | None = None
    model: str | list[str] | None = None
    instructions: str | None = None
    fork_id: str | None = Field(default=None, pattern=TURN_ID_PATTERN)


class ScheduleBody(BaseModel):
    """The body of `PUT /v1/schedules/{name}`: a `Schedule` as `Client.schedule` builds it, less what the API
    sets itself (its creation time, the anchor of an interval's runs, and its layout version).

    `name`, when given, is the path's; exactly one of `cron` (five fields, UTC) and `every_s` (seconds, at
    least `MIN_EVERY_S`); `overlap` what a run does while the previous one runs; `request` what each run
    submits (a `POST /v1/turns` body without `turn_id`: a run's id is the beat's), checked as a submit is."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, pattern=NAME_PATTERN)
    cron: str | None = None
    every_s: float | None = Field(default=None, ge=MIN_EVERY_S, allow_inf_nan=False)
    overlap: Overlap = "skip"
    request: TurnRequest

    @field_validator("cron")
    @classmethod
    def _readable_cron(cls, value: str | None) -> str | None:
        return None if value is None else parse_cron(value)

    @model_validator(mode="after")
    def _one_timing(self) -> ScheduleBody:
        if (self.cron is None) == (self.every_s is None):
            raise ValueError(
                "a schedule runs on a cron expression or an interval: give exactly one of cron, every_s"
            )
        return self


class ScheduleRemoved(BaseModel):
    """What `DELETE /v1/schedules/{name}` answers: the schedule is gone (its runs' turns stay)."""

    name: str
    removed: bool


class SubmitReply(BaseModel):
    """What `POST /v1/turns` answers."""

    id: str


class ControlReply(BaseModel):
    """What the cancel and approval routes answer."""

    id: str
    accepted: bool


class ErrorItem(BaseModel):
    """One problem of a refused request, shaped as pydantic's validation errors: what kind, where, why."""

    type: str
    loc: list[str | int]
    msg: str
    # More about it: for an unknown tool, `tool` and the public tools `available`.
    ctx: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    """Every error's body: `detail` is one line (400, 401, 403, 404, 409, 413, 503), or the problems (422).

    `code` says which refusal a 409 is: `turn_ended` (the turn has already ended), `call_not_waiting` (no
    call with this id waits for an answer), `call_decided` (it was answered already: the first answer
    stands) or `schedule_taken` (another tenant has a schedule of that name)."""

    detail: str | list[ErrorItem]
    code: str | None = None


class HealthReply(BaseModel):
    """What `/healthz` answers: `ok` twice, or `unavailable` and why Redis did not answer (with a 503)."""

    status: str
    redis: str


class ToolCallBody(BaseModel):
    """The body of `POST /v1/tools/{name}/calls`: `Client.call_tool`'s arguments but the tool's name.

    `timeout_s` is how long the call may take (the request stays open for as long); `context` what the
    tool receives besides its arguments; `approve` confirms a `requires_confirmation` tool (the caller is the
    person approving; without it the outcome is `confirmation_denied` and nothing runs); `tenant` whose call
    it is, the tool's `ctx.tenant` (None: the key's own; another tenant's only for the admin, else 403)."""

    model_config = ConfigDict(extra="forbid")

    arguments: dict[str, Any]
    timeout_s: float = Field(default=DEFAULT_CALL_TIMEOUT_S, allow_inf_nan=False)
    context: dict[str, Any] | None = None
    approve: bool = False
    tenant: str | None = Field(default=None, pattern=TENANT_PATTERN)


def build_conflict_reply(detail: str, code: str) -> JSONResponse:
    """A 409: the request came too late (`code` as `ErrorBody` lists them)."""
    return JSONResponse(ErrorBody(detail=detail, code=code).model_dump(), status_code=409)


def _error(description: str, **extra: Any) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description, **extra}


_RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before trying again.", "schema": {"type": "integer"}}
}
# The error answers of the routes, declared with each route that can give them.
Responses = dict[int | str, dict[str, Any]]
UNAUTHORIZED: Responses = {
    401: _error("No bearer token, or a wrong one, while the API has keys or a token."),
    403: _error("The API key lacks the scope this route needs, or names a tenant not its own."),
}
UNAVAILABLE: Responses = {
    503: _error("Redis did not answer (down, restarting, out of memory, read-only).", headers=_RETRY_AFTER)
}
UNKNOWN_TURN: Responses = {
    404: _error("No turn with this id (never submitted, or expired), or another tenant's.")
}
TOO_LARGE: Responses = {413: _error("The body is over the API's limit (`max_body_bytes`).")}
UNREADABLE: Responses = {400: _error("The body could not be parsed (not UTF-8, or nested too deep).")}
REFUSED: Responses = {
    422: _error("The request is malformed, or asks for what cannot be served; `loc` names the field.")
}
ENDED: Responses = {
    409: _error("The turn has already ended, or the call waits for no answer (`code` says which).")
}
UNKNOWN_SCHEDULE: Responses = {404: _error("No schedule of this name, or another tenant's.")}
SCHEDULE_TAKEN: Responses = {
    409: _error("Another tenant has a schedule of this name (`code` `schedule_taken`): names are shared.")
}
COMMON: Responses = {**UNAUTHORIZED, **UNAVAILABLE}


class ToolInfo(BaseModel):
    """The public metadata of one tool, as `GET /v1/tools` lists it."""

    name: str
    description: str
    parameters: dict[str, Any]
    sensitive: bool
    requires_confirmation: bool
    soft_time_limit_s: float
    time_limit_s: float


def build_tool_listing(
    specs: Iterable[ToolSpec], caller: Caller, *, include_sensitive: bool
) -> list[ToolInfo]:
    """The tools `caller` may use, sorted by name; sensitive ones only when asked for, or its key names them
    (`access.build_key_listing`)."""
    fields = set(ToolInfo.model_fields)
    visible = build_key_listing(caller, specs, include_sensitive=include_sensitive)
    return [ToolInfo.model_validate(spec.model_dump(include=fields)) for spec in visible]


class BodyLimitMiddleware:
    """Answers 413 to a body over `max_bytes`: by its Content-Length, or, for a chunked body, after reading at
    most `max_bytes` + 1 bytes of it (then replayed to the app, so the app sees the whole body as usual)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                await self._reject(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more and len(body) <= self.max_bytes:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, receive, send)  # a disconnect: let the app see it
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if len(body) > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"request body over {self.max_bytes} bytes"
        await JSONResponse({"detail": detail}, status_code=413)(scope, receive, send)


# How deep a validation error's context is rendered; pydantic's are one or two levels.
_MAX_DETAIL_DEPTH = 8


# What the server sets on the turns it makes (a trace from the `traceparent` header, a fork's link, a child's
# parent, a schedule's name): never taken from a caller's body.
SERVER_SET_FIELDS = ("trace_context", "forked_from", "parent", "schedule")


def build_caller_request(fields: dict[str, Any], tenant: str) -> TurnRequest:
    """A turn request from a caller's body fields, as `tenant`'s, without what only the server sets."""
    return TurnRequest.model_validate({**fields, **dict.fromkeys(SERVER_SET_FIELDS), "tenant": tenant})


def build_safe_json(value: Any, depth: int = 0) -> Any:
    """`value` as what `json.dumps(allow_nan=False)` renders and UTF-8 encodes, whatever it holds.

    Non-finite numbers become their names, unpaired surrogates `\\udXXX` escapes, anything else its text.
    """
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if depth >= _MAX_DETAIL_DEPTH:
        return "…"
    if isinstance(value, dict):
        return {str(build_safe_json(str(k))): build_safe_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [build_safe_json(v, depth + 1) for v in value]
    return build_safe_json(str(value))


def build_validation_detail(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """The `detail` of a 422: each error's type, location, message and context, without its input."""
    kept = ("type", "loc", "msg", "ctx")
    return [{k: build_safe_json(error[k]) for k in kept if k in error} for error in errors]


async def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return JSONResponse({"detail": build_validation_detail(errors) or "invalid request"}, status_code=422)


def _redis(request: Request) -> ApiRedis:
    api: ApiRedis = request.app.state.redis
    return api


def _client(request: Request) -> AsyncClient:
    return _redis(request).client


async def hold_redis_slot(request: Request) -> AsyncIterator[None]:
    """A dependency holding one of the request pool's slots for the request (`api_redis.RedisGate`)."""
    async with _redis(request).gate.slot():
        yield


def _not_found(turn_id: str) -> HTTPException:
    return HTTPException(404, f"unknown turn {turn_id!r}")


turns_router = APIRouter(
    prefix="/v1/turns", tags=["turns"], dependencies=[Depends(hold_redis_slot)], responses=COMMON
)
# Its own router: a stream holds a pool slot only while it reads, not for its whole life (api_sse).
events_router = APIRouter(prefix="/v1/turns", tags=["turns"], responses=COMMON)
events_router.add_api_route(
    "/{turn_id}/events",
    turn_events,
    methods=["GET"],
    dependencies=[Depends(require_turn("read"))],
    operation_id="streamTurnEvents",
    summary="Follow a turn's events (SSE)",
    description=EVENTS_DESCRIPTION,
    response_class=Response,  # an EventSourceResponse; its content is declared by hand below
    responses={
        200: {"description": "The turn's events as server-sent events.", "content": build_events_content()},
        **UNKNOWN_TURN,
        **REFUSED,
    },
)


def build_refusal_detail(request: TurnRequest, exc: ValueError) -> list[dict[str, Any]]:
    """The `detail` of a 422 for a turn the submit checks refused, shaped as pydantic's errors are."""
    if isinstance(exc, UnknownToolError):
        names = request.tools or []
        return [
            {
                "type": "unknown_tool",
                "loc": ["body", "tools", names.index(name) if name in names else 0],
                "msg": exc.describe(name),
                "ctx": {"tool": name, "available": exc.available},
            }
            for name in exc.unknown
        ]
    loc = ["body", "model"] if isinstance(exc, ModelConfigError) else ["body"]
    return [{"type": "value_error", "loc": loc, "msg": str(exc)}]


def build_controls_detail(refusals: Sequence[Refusal]) -> list[dict[str, Any]]:
    """The `detail` of a 422 for model controls refused at submit: each names the field it is about."""
    return [
        {
            "type": "invalid_schema" if refusal.field == ("output_schema",) else "unsupported_setting",
            "loc": ["body", *refusal.field],
            "msg": refusal.message,
        }
        for refusal in refusals
    ]


@turns_router.post(
    "",
    status_code=202,
    response_model=SubmitReply,
    operation_id="submitTurn",
    summary="Submit a turn",
    responses={**UNREADABLE, **TOO_LARGE, **REFUSED},
)
async def submit_turn(
    body: TurnBody, request: Request, caller: Annotated[Caller, Depends(require("submit"))]
) -> SubmitReply:
    """Store and queue a turn; 202 with its id once it is durable in Redis, 422 when its tools, its model or
    its model controls cannot be served (`store.flows.submit`, `orchestrator.submit_checks`), or it names a
    tool its API key may not use; 403 for a tenant not the key's (`api.access`)."""
    # The trace comes from the `traceparent` header only (`build_caller_request`).
    tenant = build_tenant(caller, body.tenant if "tenant" in body.model_fields_set else None)
    turn_request = build_caller_request(body.model_dump(exclude={"turn_id"}), tenant)
    client = _client(request)
    refusals = find_refusals(turn_request, ModelNames.from_settings(client.settings))
    if refusals:
        raise HTTPException(422, build_safe_json(build_controls_detail(refusals)))
    if caller.tools is not None or not caller.every_tenant:
        catalogue = await _read_known_tools(client)
        refused = find_tool_refusals(caller, turn_request.tools or [], catalogue)
        if refused:
            raise HTTPException(422, build_safe_json(refused))
        if turn_request.tools is None:
            turn_request = turn_request.model_copy(update={"tools": build_default_tools(caller, catalogue)})
    with continue_http_trace(request.headers, "POST /v1/turns"):
        try:
            turn_id = await client.submit_request(turn_request, turn_id=body.turn_id)
        except ValueError as exc:
            raise HTTPException(422, build_safe_json(build_refusal_detail(turn_request, exc))) from None
    access: Access = request.app.state.access
    metrics.API_TURNS_SUBMITTED.labels(tenant=access.build_tenant_label(tenant)).inc()
    return SubmitReply(id=turn_id)


async def _read_known_tools(client: AsyncClient) -> dict[str, ToolSpec]:
    # The tools live workers serve and those served within TOOLLOOP_TOOL_GONE_AFTER_S, as the submit checks
    # know them: a sensitive tool between workers is still sensitive.
    now = time.time()
    catalogue = await AsyncRunner(client.store.redis).run(get_tool_catalogue(now))
    return catalogue.known(now, client.settings.tool_gone_after_s)


@turns_router.post(
    "/{turn_id}/fork",
    status_code=202,
    response_model=SubmitReply,
    operation_id="forkTurn",
    summary="Fork a turn",
    responses={**UNREADABLE, **UNKNOWN_TURN, **TOO_LARGE, **REFUSED},
)
async def fork_turn(
    turn_id: str,
    body: ForkBody,
    request: Request,
    caller: Annotated[Caller, Depends(require_turn("submit"))],
) -> SubmitReply:
    """A new turn from this turn's messages up to message `at`, `replace` in its place (or message `at`
    itself), run on from there with the turn's request (`model` and `instructions` replaced when given); 202
    with the fork's id once it is stored. The turn is untouched; the fork's `request.forked_from` and the
    turn's `forks` link them (`store.forks`). A key forks only its tenant's turns, and only turns whose tools
    it may use. 422 for an `at` out of range, a `replace` that does not fit there, or a fork its model or
    tools cannot serve."""
    client = _client(request)
    stored = await client.store.load_request(turn_id)
    if stored is None:
        raise _not_found(turn_id)
    if caller.tools is not None or not caller.every_tenant:
        refused = find_tool_refusals(caller, stored.tools or [], await _read_known_tools(client))
        if refused:
            raise HTTPException(422, build_safe_json(refused))
    with continue_http_trace(request.headers, "POST /v1/turns/{id}/fork"):
        try:
            forked = await client.fork(
                turn_id,
                body.at,
                replace=body.replace,
                model=body.model,
                instructions=body.instructions,
                fork_id=body.fork_id,
            )
        except UnknownTurnError:
            raise _not_found(turn_id) from None
        except ValueError as exc:
            raise HTTPException(422, build_safe_json(build_refusal_detail(stored, exc))) from None
    access: Access = request.app.state.access
    metrics.API_TURNS_SUBMITTED.labels(tenant=access.build_tenant_label(stored.tenant)).inc()
    return SubmitReply(id=forked)


@turns_router.get(
    "/{turn_id}",
    response_model=TurnView,
    operation_id="getTurn",
    summary="Read a turn",
    responses={**UNKNOWN_TURN, **REFUSED},
    dependencies=[Depends(require_turn("read"))],
)
async def get_turn(turn_id: str, request: Request) -> Response:
    """The turn's status, request, transcript so far, the calls waiting for approval, and its outcome once
    terminal; sensitive values redacted."""
    # Sent as the view serialises itself: `response_model` declares it without validating it again.
    try:
        view = await _client(request).get(turn_id)
    except UnknownTurnError:
        raise _not_found(turn_id) from None
    return Response(view.model_dump_json(), media_type="application/json")


@turns_router.post(
    "/{turn_id}/cancel",
    status_code=202,
    response_model=ControlReply,
    operation_id="cancelTurn",
    summary="Cancel a turn",
    responses={**UNKNOWN_TURN, **ENDED, **REFUSED},
    dependencies=[Depends(require_turn("cancel"))],
)
async def cancel_turn(turn_id: str, request: Request) -> ControlReply | JSONResponse:
    """Ask the turn's orchestrator to cancel it; 409 (`turn_ended`) when it has already ended."""
    return await _control_reply(turn_id, _client(request).cancel(turn_id))


@turns_router.post(
    "/{turn_id}/approvals/{call_id}",
    status_code=202,
    response_model=ControlReply,
    operation_id="answerApproval",
    summary="Approve or deny a tool call",
    responses={**UNREADABLE, **UNKNOWN_TURN, **ENDED, **TOO_LARGE, **REFUSED},
)
async def approve_call(
    turn_id: str,
    call_id: str,
    body: ApprovalBody,
    request: Request,
    caller: Annotated[Caller, Depends(require_turn("approve", page_writes=True))],
) -> ControlReply | JSONResponse:
    """Approve (with edited arguments) or deny (with a reason) a call that waits for confirmation; 422 when
    edited arguments fail the tool's schema, 409 when the turn has ended or the call waits for no answer
    (an unknown call, or one answered already: the first answer stands). From a turn page (its session and
    CSRF token), `decided_by` is the key's `tenant/name` whatever the body says."""
    sending = _client(request).approve(
        turn_id,
        call_id,
        body.approved,
        arguments=body.arguments,
        reason=body.reason,
        decided_by=caller.label if caller.page_session else body.decided_by,
    )
    try:
        return await _control_reply(turn_id, sending)
    except CallNotWaitingError as exc:
        return build_conflict_reply(str(exc), "call_decided" if exc.decided else "call_not_waiting")
    except ValueError as exc:
        detail = [{"type": "value_error", "loc": ["body", "arguments"], "msg": str(exc)}]
        raise HTTPException(422, build_safe_json(detail)) from None


@turns_router.post(
    "/{turn_id}/calls/{call_id}/result",
    status_code=202,
    response_model=ControlReply,
    operation_id="submitToolResult",
    summary="Answer a client-side tool's call",
    responses={**UNREADABLE, **UNKNOWN_TURN, **ENDED, **TOO_LARGE, **REFUSED},
    dependencies=[Depends(require_turn("submit"))],
)
async def submit_tool_result(
    turn_id: str, call_id: str, body: ToolResultBody, request: Request
) -> ControlReply | JSONResponse:
    """Answer a call of one of the turn's client-side tools with its result or an error; the turn goes on.
    422 for a result JSON cannot carry or over the tool's size limit, 409 when the turn has ended or the
    call waits for no result (an unknown call, or one answered already: the first answer stands)."""
    sending = _client(request).submit_tool_result(turn_id, call_id, result=body.result, error=body.error)
    try:
        return await _control_reply(turn_id, sending)
    except CallNotWaitingError as exc:
        return build_conflict_reply(str(exc), "call_decided" if exc.decided else "call_not_waiting")
    except ValueError as exc:
        detail = [{"type": "value_error", "loc": ["body", "result"], "msg": str(exc)}]
        raise HTTPException(422, build_safe_json(detail)) from None


async def _control_reply(turn_id: str, sending: Awaitable[bool]) -> ControlReply | JSONResponse:
    try:
        accepted = await sending
    except UnknownTurnError:
        raise _not_found(turn_id) from None
    if not accepted:
        return build_conflict_reply(f"turn {turn_id!r} has already ended", "turn_ended")
    return ControlReply(id=turn_id, accepted=True)


schedules_router = APIRouter(
    prefix="/v1/schedules", tags=["schedules"], dependencies=[Depends(hold_redis_slot)], responses=COMMON
)


def build_in_request(detail: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A submit's 422 `detail` as the schedule's: each `loc` moved from the body into its `request`."""
    return [
        {**item, "loc": ["body", "request", *item["loc"][1:]]} if item["loc"][:1] == ["body"] else item
        for item in detail
    ]


def _schedules_runner(client: AsyncClient) -> tuple[AsyncRunner, Patience]:
    # The flows `Client.schedule` runs, as patient with Redis as the API's client (`api_redis_retry_s`).
    runner = AsyncRunner(client.store.redis, where=build_shown_url(client.redis_url))
    return runner, Patience.for_s(client.retry_s)


def build_shown_schedule(view: ScheduleView) -> ScheduleView:
    """A schedule as the API shows it: its request redacted as a turn's (`turn_view.build_shown_request`)."""
    request = build_shown_request(view.schedule.request)
    return view.model_copy(update={"schedule": view.schedule.model_copy(update={"request": request})})


async def _read_schedule(client: AsyncClient, name: str) -> Schedule | None:
    runner, patience = _schedules_runner(client)
    schedules: dict[str, Schedule] = await runner.run(schedule_storage.get_schedules(), patience)
    return schedules.get(name)


@schedules_router.put(
    "/{name}",
    response_model=ScheduleView,
    operation_id="putSchedule",
    summary="Create or replace a schedule",
    responses={**UNREADABLE, **TOO_LARGE, **REFUSED, **SCHEDULE_TAKEN},
)
async def put_schedule(
    name: Annotated[str, Path(pattern=NAME_PATTERN)],
    body: ScheduleBody,
    request: Request,
    caller: Annotated[Caller, Depends(require("submit"))],
) -> ScheduleView | JSONResponse:
    """Run a turn on a schedule, as `Client.schedule` does: `toolloop beat` submits `request` on `cron` or
    every `every_s` seconds, each run a normal turn of the key's tenant whose `request.schedule` is `name`.
    A schedule of that name is replaced (its timing starts afresh). Checked as a submit is: 422 for a bad
    cron expression or interval, tools no live worker serves or the key may not use, a model that cannot
    serve it (`loc` names the field); 403 for a tenant not the key's; 409 (`schedule_taken`) when another
    tenant has a schedule of that name. Answers the schedule with its next run."""
    if body.name is not None and body.name != name:
        detail = [
            {
                "type": "value_error",
                "loc": ["body", "name"],
                "msg": f"the body names {body.name!r}, the path {name!r}",
            }
        ]
        raise HTTPException(422, build_safe_json(detail))
    given = body.request
    tenant = build_tenant(caller, given.tenant if "tenant" in given.model_fields_set else None)
    if given.schedule is not None:
        detail = [
            {
                "type": "value_error",
                "loc": ["body", "request", "schedule"],
                "msg": "set by the beat on each run",
            }
        ]
        raise HTTPException(422, detail)
    turn_request = build_caller_request(given.model_dump(), tenant)
    client = _client(request)
    refusals = find_refusals(turn_request, ModelNames.from_settings(client.settings))
    if refusals:
        raise HTTPException(422, build_safe_json(build_in_request(build_controls_detail(refusals))))
    if caller.tools is not None or not caller.every_tenant:
        catalogue = await _read_known_tools(client)
        refused = find_tool_refusals(caller, turn_request.tools or [], catalogue)
        if refused:
            raise HTTPException(422, build_safe_json(build_in_request(refused)))
        if turn_request.tools is None:
            turn_request = turn_request.model_copy(update={"tools": build_default_tools(caller, catalogue)})
    existing = await _read_schedule(client, name)
    if existing is not None and not caller.sees(existing.request.tenant):
        return build_conflict_reply(f"schedule {name!r} is another tenant's", "schedule_taken")
    try:
        schedule = build_schedule(
            name, turn_request, cron=body.cron, every_s=body.every_s, overlap=body.overlap, now=codec.now_s()
        )
        runner, patience = _schedules_runner(client)
        view = await runner.run_flow(schedule_calls.save(schedule, client.settings), patience)
    except ValueError as exc:
        detail = build_in_request(build_refusal_detail(turn_request, exc))
        raise HTTPException(422, build_safe_json(detail)) from None
    return build_shown_schedule(view)


@schedules_router.delete(
    "/{name}",
    response_model=ScheduleRemoved,
    operation_id="deleteSchedule",
    summary="Remove a schedule",
    responses={**UNKNOWN_SCHEDULE, **REFUSED},
)
async def delete_schedule(
    name: str, request: Request, caller: Annotated[Caller, Depends(require("submit"))]
) -> ScheduleRemoved:
    """Remove the schedule (its runs' turns stay; a run in progress goes on); 404 when there is none, or it
    is another tenant's."""
    client = _client(request)
    existing = await _read_schedule(client, name)
    if existing is None or not caller.sees(existing.request.tenant):
        raise HTTPException(404, f"unknown schedule {name!r}")
    runner, patience = _schedules_runner(client)
    if not await runner.run_flow(schedule_calls.remove(name), patience):
        raise HTTPException(404, f"unknown schedule {name!r}")
    return ScheduleRemoved(name=name, removed=True)


@schedules_router.get(
    "",
    response_model=list[ScheduleView],
    operation_id="listSchedules",
    summary="List the schedules",
    responses=REFUSED,
)
async def list_schedules(
    request: Request, caller: Annotated[Caller, Depends(require("read"))]
) -> list[ScheduleView]:
    """The key's tenant's schedules (every tenant's for the admin), by name, with their last runs (turn ids),
    skipped ticks, last error and next run; their requests redacted as a turn's are."""
    runner, patience = _schedules_runner(_client(request))
    views = await runner.run_flow(schedule_calls.list_all(), patience)
    return [build_shown_schedule(view) for view in views if caller.sees(view.schedule.request.tenant)]


def build_ops_router() -> APIRouter:
    """`/v1/tools`, `/v1/tools/{name}/calls` and `/metrics` (behind the token when one is set)."""
    router = APIRouter(responses=UNAUTHORIZED)

    @router.get(
        "/v1/tools",
        dependencies=[Depends(hold_redis_slot)],
        tags=["tools"],
        operation_id="listTools",
        summary="List the tools",
        responses={**UNAVAILABLE, **REFUSED},
    )
    async def list_tools(
        request: Request, caller: Annotated[Caller, Depends(require("read"))], include_sensitive: bool = False
    ) -> list[ToolInfo]:
        """The tools the live workers serve that the caller may use, sorted by name: a key's `tools` (the
        sensitive ones it names included); sensitive ones otherwise only for the admin, with
        `include_sensitive`."""
        catalogue = await aread_catalogue(_client(request).store.redis)
        return build_tool_listing(catalogue.values(), caller, include_sensitive=include_sensitive)

    @router.post(
        "/v1/tools/{name:path}/calls",
        tags=["tools"],
        operation_id="callTool",
        summary="Call a tool",
        response_model=ToolOutcome,
        responses={
            200: {"description": "The call's outcome: `ok` with its `result`, or a `failure_kind`."},
            **UNREADABLE,
            **TOO_LARGE,
            **REFUSED,
            **UNAVAILABLE,
        },
    )
    async def call_tool(
        name: str, body: ToolCallBody, request: Request, caller: Annotated[Caller, Depends(require("submit"))]
    ) -> ToolOutcome:
        """Run one call of tool `name` through the workers, no model involved, and answer its outcome once
        it has one (within `timeout_s`: the request stays open that long).

        A call that fails is an outcome too, with its `failure_kind`, as `Client.call_tool` returns it: an
        unknown tool `not_found`, arguments its schema refuses `validation`, no answer in time `timeout`
        (and the task revoked), a `requires_confirmation` tool without `approve` `confirmation_denied`, a tool
        the API key may not use `not_allowed` (a sensitive one, for a key without `tools`: `not_found`, as
        an unknown tool). 403 for a `tenant` not the key's."""
        tenant = build_tenant(caller, body.tenant)
        if caller.tools is not None or not caller.every_tenant:
            refused = find_tool_refusals(caller, [name], await _read_known_tools(_client(request)))
            if refused:
                allowed_elsewhere = refused[0]["type"] == "tool_not_allowed"
                kind = FailureKind.NOT_ALLOWED if allowed_elsewhere else FailureKind.NOT_FOUND
                ids = (f"direct-{uuid.uuid4().hex}", name, None)
                return build_failure(ids, kind, refused[0]["msg"], attempts=0)
        gate: RedisGate = request.app.state.direct_calls
        async with gate.slot():
            # The tool's task continues the caller's trace (`traceparent`), as a submitted turn does.
            with continue_http_trace(request.headers, "POST /v1/tools/{name}/calls"):
                return await _client(request).call_tool(
                    name, body.arguments, body.timeout_s, body.context, approve=body.approve, tenant=tenant
                )

    @router.get(
        "/v1/agents",
        dependencies=[Depends(hold_redis_slot)],
        tags=["agents"],
        operation_id="listAgents",
        summary="List the named agents",
        responses={**UNAVAILABLE, **REFUSED},
    )
    async def list_agents(
        request: Request, caller: Annotated[Caller, Depends(require("read"))]
    ) -> list[AgentSpec]:
        """Every named agent, by name: those the workers' modules declare (`from workers import agent`) and
        those registered (`PUT /v1/agents/{name}`)."""
        del caller  # any reader may see what agents a turn can run as
        return await _client(request).list_agents()

    @router.put(
        "/v1/agents/{name}",
        dependencies=[Depends(hold_redis_slot), Depends(require("admin"))],
        tags=["agents"],
        operation_id="registerAgent",
        summary="Register a named agent",
        response_model=AgentSpec,
        responses={**UNREADABLE, **TOO_LARGE, **UNAVAILABLE, **REFUSED},
    )
    async def register_agent(name: str, spec: AgentSpec, request: Request) -> AgentSpec:
        """Register (or replace) a named agent: every orchestrator knows it at once; answers it. The path's
        name must be the agent's (422 otherwise); the admin's scope."""
        if spec.name != name:
            msg = f"the agent is named {spec.name!r}, the path {name!r}"
            raise HTTPException(
                422, build_safe_json([{"type": "value_error", "loc": ["body", "name"], "msg": msg}])
            )
        await _client(request).register_agent(spec)
        return spec

    @router.get(
        "/metrics",
        tags=["operations"],
        operation_id="getMetrics",
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
        dependencies=[Depends(require("admin"))],
    )
    async def prometheus_metrics(request: Request) -> Response:
        """This process's metrics in Prometheus's text format, and the fleet's backlog (tool queues, turns
        by tenant and priority, model calls waiting: `store.backlog`), read from Redis at most every few
        seconds; without Redis, the process's metrics alone."""
        reader: BacklogReader = request.app.state.backlog
        try:
            backlog: Backlog | None = await reader.read(_client(request).store.redis)
        except REDIS_ERRORS as exc:
            log.warning("/metrics without the backlog gauges: Redis did not answer (%s)", exc)
            backlog = None
        body, content_type = metrics.render_latest(backlog)
        return Response(body, media_type=content_type)

    return router


def create_app(settings: Settings | None = None, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The FastAPI app; its Redis connections (`api_redis.ApiRedis`) for its lifetime."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Spans over OTLP when the OTEL_* variables ask for it; an app that has its own provider keeps it.
        traced = setup_tracing("toolloop-api", record_content=settings.trace_content)
        app.state.redis = ApiRedis.open(settings)
        app.state.direct_calls = RedisGate(settings.api_redis_max_connections)
        try:
            yield
        finally:
            await app.state.redis.aclose()
            if traced:
                shutdown_tracing()

    app = FastAPI(
        title="toolloop",
        version="0.1.0",
        summary="Tool-calling turns run by an orchestrator and Celery workers, over Redis.",
        openapi_tags=OPENAPI_TAGS,
        lifespan=lifespan,
    )
    # Who may call, from TOOLLOOP_API_KEYS and the token: a table it cannot use stops the app here.
    app.state.access = Access.from_settings(settings)
    # The backlog gauges of `/metrics`; the tool queues are lists of this Redis only when it is the broker.
    app.state.backlog = BacklogReader(
        app.state.access.tenants, settings.model_limits, tool_queues=settings.broker_url is None
    )
    auth = Depends(authenticate)
    app.include_router(turns_router, dependencies=[auth])
    app.include_router(events_router, dependencies=[auth])
    app.include_router(schedules_router, dependencies=[auth])
    app.include_router(build_ops_router(), dependencies=[auth])
    app.include_router(
        build_listing_router(),
        tags=["turns"],
        responses={**COMMON, **REFUSED},
        dependencies=[auth, Depends(hold_redis_slot)],
    )
    app.include_router(build_pages_router(settings))  # the pages check the token themselves (ui.routes)

    @app.get(
        "/healthz",
        tags=["operations"],
        operation_id="getHealth",
        summary="Health",
        response_model=HealthReply,
        responses={
            503: {"model": HealthReply, "description": "Redis does not answer.", "headers": _RETRY_AFTER}
        },
    )
    async def healthz(request: Request) -> JSONResponse:
        """200 when Redis answers PING on the health connection, 503 when it does not."""
        reason = await _redis(request).health.check()
        if reason is not None:
            return build_unavailable_reply({"status": "unavailable", "redis": reason})
        return JSONResponse({"status": "ok", "redis": "ok"})

    app.add_exception_handler(RequestValidationError, _invalid_request)

    async def redis_unavailable(request: Request, exc: Exception) -> JSONResponse:
        reason = build_failure_reason(exc)
        _redis(request).failures.failed(exc, reason)
        return build_unavailable_reply({"detail": reason})

    # Every Redis failure (`REDIS_ERRORS`: OSError too, a socket error redis-py did not wrap, and a cluster
    # client's own RedisClusterException, which is no RedisError); and kombu's OperationalError, the broker
    # (Redis) not taking a direct call's task.
    for failure in (*REDIS_ERRORS, OperationalError):
        app.add_exception_handler(failure, redis_unavailable)

    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    return app
