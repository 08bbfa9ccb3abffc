"""What web apps import: submit a turn, read it, wait for it, follow its events, cancel it, answer approvals.

`Client` is synchronous, on the sync `redis` client, so a Django or Flask view can call it without an event
loop; `AsyncClient` has the same methods as coroutines. Both are thin faces over a store: `Client` over
`SyncTurnStore`, `AsyncClient` over the async `TurnStore`, which perform the same operations and flows
(`orchestrator.store.operations`, `flows`), so the storage layout and its scripts are written once. The long
parameter lists of `submit` and `call_tool` are written once too, as the builders `build_submission`
(`orchestrator.client.submission`) and `direct.build_direct_call`, whose signatures both clients' methods take
(`takes_arguments_of`).

A turn's model controls: `submit(..., instructions=, model_settings=, output_schema=)` and `model`
as a list (the fallback order); `output_schema` may be a pydantic model class, and `outcome.parse(Model)`
gives the answer back as that type.

Errors: bad input raises `ValueError` (pydantic's `ValidationError` is one) with a clear message — among
them `UnknownToolError` for a turn naming tools no live worker serves (`store.flows.check_tool_names`: when
no worker has published its catalogue yet, the turn is accepted), and `ModelConfigError` for a model name
that is neither `provider:model` nor a tier, and a plain `ValueError` naming each model setting the target
provider cannot honour (`orchestrator.submit_checks`) or an `output_schema` that is not a JSON Schema; an
unknown turn id raises `UnknownTurnError` (a `LookupError`); `wait` raises `TimeoutError`.

What the readers return is what a person may be shown: `get`, `outcome` and `wait` redact the values of
sensitive keys (context, tool-call arguments; `store.turn_view`). Tools still receive them whole.

A Redis restart or failover is ridden out, by both clients alike (the runners' one policy,
`store.runner.Patience`): a call Redis cannot answer is retried with capped backoff — `wait` until its own
`timeout`, `events` for as long as it takes, resuming after the last event it yielded (none lost, none
repeated), every other call for `retry_s` (default `DEFAULT_RETRY_S`; `ping` never). When that time runs out
Redis still away, `RedisUnavailableError` (a `redis.ConnectionError` and a `TimeoutError`) names the URL, its
password hidden. A retried `submit` stores its turn once: its id is chosen before the first try, and a turn
id already stored makes `submit.lua` a no-op.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any

import redis

from orchestrator import metrics
from orchestrator.client import direct
from orchestrator.client.direct import DEFAULT_CALL_TIMEOUT_S, DirectCall, build_direct_call
from orchestrator.client.submission import Submission, build_submission, takes_arguments_of
from orchestrator.errors import (
    CallNotWaitingError,
    ModelConfigError,
    RedisUnavailableError,
    UnknownToolError,
    UnknownTurnError,
)
from orchestrator.model import Message, ModelSettings, TurnOutcome, TurnRequest
from orchestrator.schedules import calls as schedule_calls
from orchestrator.schedules.schedule import Schedule, ScheduleView
from orchestrator.settings import Settings, get_settings
from orchestrator.store import codec, flows, forks, history, turn_stream
from orchestrator.store.agents import get_agents, put_agent
from orchestrator.store.catalogue import RecentCatalogue
from orchestrator.store.codec import TurnEvent
from orchestrator.store.connection import MAX_CONNECTIONS, build_shown_url
from orchestrator.store.effects import Flow
from orchestrator.store.runner import DEFAULT_RETRY_S, AsyncRunner, Patience, SyncRunner
from orchestrator.store.sync_turns import SyncTurnStore
from orchestrator.store.turn_stream import (
    CallWaitingEvent,
    ModelStreamResetEvent,
    OtherEvent,
    StreamEvent,
    TextDeltaEvent,
    ThinkingDeltaEvent,
    ToolCallStartedEvent,
    ToolFinishedEvent,
    ToolProgressEvent,
    ToolStartedEvent,
    TurnFinishedEvent,
)
from orchestrator.store.turn_view import PendingApproval, TurnView, build_shown_outcome
from orchestrator.store.turns import TurnStore
from orchestrator.submit_checks import ModelNames, check_submit
from orchestrator.tracing import attach_trace_context
from workers.agents import AgentSpec
from workers.contract import ToolOutcome

__all__ = [
    "DEFAULT_CALL_TIMEOUT_S",
    "DEFAULT_RETRY_S",
    "AsyncClient",
    "CallNotWaitingError",
    "CallWaitingEvent",
    "Client",
    "ModelConfigError",
    "ModelSettings",
    "ModelStreamResetEvent",
    "OtherEvent",
    "PendingApproval",
    "RedisUnavailableError",
    "ScheduleView",
    "StreamEvent",
    "Submission",
    "TextDeltaEvent",
    "ThinkingDeltaEvent",
    "ToolCallStartedEvent",
    "ToolFinishedEvent",
    "ToolProgressEvent",
    "ToolStartedEvent",
    "TurnEvent",
    "TurnFinishedEvent",
    "TurnOutcome",
    "TurnView",
    "UnknownToolError",
    "UnknownTurnError",
    "build_submission",
    "takes_arguments_of",
]


def _build_fork(  # noqa: PLR0917  # the arguments of `fork`, written once for both clients
    settings: Settings,
    turn_id: str,
    at: int,
    replace: Message | Mapping[str, Any] | None,
    model: str | Sequence[str] | None,
    instructions: str | None,
    fork_id: str | None,
    recent: RecentCatalogue | None = None,
) -> Flow[str]:
    return forks.fork(
        turn_id,
        at,
        replace,
        codec.now_s(),
        model=model,
        instructions=instructions,
        fork_id=fork_id,
        check=partial(check_submit, names=ModelNames.from_settings(settings)),
        prepare=attach_trace_context,
        recent=recent,
        tool_gone_after_s=settings.tool_gone_after_s,
        turn_ttl_s=settings.turn_ttl_s,
    )


class Client:
    """Synchronous client: `Client(redis_url=None)` uses `TOOLLOOP_REDIS_URL` (settings) by default.

    `retry_s`: how long a call without a timeout of its own waits for Redis through a restart (None: forever).
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: Settings | None = None,
        retry_s: float | None = DEFAULT_RETRY_S,
    ) -> None:
        self.settings = settings or get_settings()
        self.redis_url = redis_url or self.settings.redis_url
        self.store = SyncTurnStore.from_url(
            self.redis_url, ssl_cert_reqs=self.settings.redis_ssl_cert_reqs, retry_s=retry_s
        )
        # The flows the store has no method for (`fork`, `get` with its forks), on the store's client.
        self._runner = SyncRunner(self.store.redis, where=build_shown_url(self.redis_url))

    @property
    def redis(self) -> redis.Redis:
        """The sync Redis client (decoded replies) the client reads and writes with."""
        return self.store.redis

    @property
    def block_cap_ms(self) -> int:
        """How long one blocking read may block: reads block in steps well under the socket timeout."""
        return self.store.block_cap_ms

    @takes_arguments_of(build_submission)
    def submit(self, submission: Submission) -> str:
        """Store and queue a turn; returns its id once it is in Redis. A repeated `turn_id` is a no-op.

        `UnknownToolError` when it names tools no live worker serves (accepted while none has published)."""
        return self.submit_request(submission.request, turn_id=submission.turn_id)

    def submit_request(self, request: TurnRequest, *, turn_id: str | None = None) -> str:
        """Store and queue an already built `TurnRequest` (checked as by `submit`), with the caller's current
        trace context unless it carries one (`tracing.attach_trace_context`)."""
        request = attach_trace_context(request)
        turn_id = self.store.submit(
            request,
            turn_id=turn_id,
            check=partial(check_submit, names=ModelNames.from_settings(self.settings)),
            tool_gone_after_s=self.settings.tool_gone_after_s,
        )
        metrics.record_turn_submitted()
        return turn_id

    def get(self, turn_id: str) -> TurnView:
        """Status, request, transcript so far, calls waiting for approval, the outcome once terminal, and
        the forks made of it (`forks`; a fork's `request.forked_from` links back); sensitive values
        redacted."""
        return self._runner.run_flow(forks.read_view(turn_id), Patience.for_s(self.store.retry_s))

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
        """A new turn from turn `turn_id`'s messages up to message `at` (an index in `get(turn_id).messages`),
        with `replace` in its place (a message, as a model or a dict: an edited tool result, another user
        prompt) or, without it, message `at` itself, run on from there; returns the fork's id. The original
        is untouched; the two link to each other (`forked_from`, `forks`). The fork runs with the original's
        request (tools, limits, settings, tenant, output schema …), `model` and `instructions` replacing its
        own when given. A finished turn and a running one alike (what is stored of it).

        `ValueError` for an `at` out of range or a `replace` that is not a message or does not fit there (a
        tool result must answer a call of the round it goes in), and as `submit` for the fork's request;
        `UnknownTurnError` for an unknown turn. `fork_id` is the fork's own id (None: a new one), a retry
        with it storing the fork once (`orchestrator.store.forks`)."""
        flow = _build_fork(self.settings, turn_id, at, replace, model, instructions, fork_id)
        forked = self._runner.run_flow(flow, Patience.for_s(self.store.retry_s))
        metrics.record_turn_submitted()
        return forked

    def outcome(self, turn_id: str) -> TurnOutcome | None:
        """The terminal outcome (sensitive values redacted), or None while the turn runs."""
        outcome = self.store.get_outcome(turn_id)
        return None if outcome is None else build_shown_outcome(outcome)

    def wait(self, turn_id: str, timeout: float) -> TurnOutcome:
        """Block until the turn is terminal (woken by its events stream); `TimeoutError` after `timeout` s.

        The outcome comes redacted, as `get` shows it. A turn may stay silent for longer than the Redis
        socket timeout (a long tool, a wait for approval): each read blocks at most `block_cap_ms` and the
        wait goes on until `timeout`, through a Redis restart too (`RedisUnavailableError` if Redis is still
        away then)."""
        return build_shown_outcome(self.store.wait_outcome(turn_id, timeout))

    def events(self, turn_id: str, after: str = "0", *, block_ms: int | None = None) -> Iterator[TurnEvent]:
        """The turn's events as they come, from `after` on, ending after `turn_finished`.

        Each read blocks at most `block_ms` (default and cap: `block_cap_ms`); quiet spells are waited out,
        and so is a Redis restart: the next read starts after the last event yielded."""
        return self.store.iter_events(turn_id, after, block_ms=block_ms)

    def stream(self, turn_id: str, after: str = "0", *, block_ms: int | None = None) -> Iterator[StreamEvent]:
        """The turn as it happens, typed (`store.turn_stream`): the answer as the model writes it
        (`TextDeltaEvent`), tool calls and their progress, every other event as an `OtherEvent`, and last a
        `TurnFinishedEvent` with the outcome. From `after` on (a stream id: resume where you left off); rides
        out quiet spells and Redis restarts as `events` does."""
        return self.store.iter_stream(turn_id, after, block_ms=block_ms)

    def cancel(self, turn_id: str) -> bool:
        """Ask for the turn to be cancelled; False when it had already ended."""
        return self.store.request_cancel(turn_id)

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

        An approval may carry `arguments` a person edited, run instead of the model's (a `ValueError` when
        they fail the tool's schema); a denial a `reason`, which the model sees in the call's result.
        `decided_by` says who answered: kept with the reason in the turn's `approvals` (its events, its
        view, its outcome, its archive record). `CallNotWaitingError` when the running turn waits for no
        answer about this call (an unknown call, or one answered already: the first answer stands)."""
        return self.store.request_approval(
            turn_id, call_id, approved, arguments=arguments, reason=reason, decided_by=decided_by
        )

    def submit_tool_result(
        self, turn_id: str, call_id: str, *, result: Any = None, error: str | None = None
    ) -> bool:
        """Answer a call of one of the turn's client-side tools: its `result` (any JSON, which the model reads
        as the tool's output) or an `error` message (which it reads as the tool's failure); False when the
        turn had ended. A `ValueError` for both, a blank error, or a result JSON cannot carry or over the
        tool's size limit; `CallNotWaitingError` when the running turn waits for no result of this call (an
        unknown call, or one answered already: the first answer stands)."""
        return self.store.request_client_result(turn_id, call_id, result=result, error=error)

    @takes_arguments_of(build_direct_call)
    def call_tool(self, call: DirectCall) -> ToolOutcome:
        """Run one tool call through the workers, no model involved; returns its outcome.

        A `requires_confirmation` tool runs only with `approve=True` (the caller is the person approving);
        without it, the outcome is `confirmation_denied` and nothing is dispatched."""
        return direct.run_call(self.redis_url, call, self.settings)

    @takes_arguments_of(schedule_calls.build_schedule_call)
    def schedule(self, schedule: Schedule) -> ScheduleView:
        """Run a turn on a schedule: `schedule(name, cron=... or every_s=..., overlap="skip", **the arguments
        of submit)`; `toolloop beat` submits each run, a normal turn whose request's `schedule` is `name`.
        A schedule of that name is replaced. Checked as a submit is (`ValueError`: a bad cron expression,
        `UnknownToolError`, `ModelConfigError`); returns it with its next run (docs: guides/schedules.md)."""
        flow = schedule_calls.save(schedule, self.settings)
        return schedule_calls.run_sync(self.store.redis, self.redis_url, flow, self.store.retry_s)

    def unschedule(self, name: str) -> bool:
        """Remove the schedule `name` (its runs' turns stay); False when there was none."""
        flow = schedule_calls.remove(name)
        return schedule_calls.run_sync(self.store.redis, self.redis_url, flow, self.store.retry_s)

    def schedules(self) -> list[ScheduleView]:
        """Every schedule, by name, with its last runs (turn ids), skipped ticks, last error and next run."""
        flow = schedule_calls.list_all()
        return schedule_calls.run_sync(self.store.redis, self.redis_url, flow, self.store.retry_s)

    def register_agent(self, spec: AgentSpec) -> None:
        """Register (or replace) a named agent (`workers.AgentSpec`): every orchestrator and the API know it
        at once, as they know the agents the workers' modules declare (`from workers import agent`)."""
        self.store.register_agent(spec)

    def list_agents(self) -> list[AgentSpec]:
        """Every named agent, by name: those the workers' modules declare and those registered."""
        return list(self.store.read_agents().values())

    def ping(self) -> bool:
        """True when Redis answers."""
        return self.store.ping()

    def close(self) -> None:
        """Close the connection pool."""
        self.store.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClient:
    """Asynchronous client with the same methods as `Client`, for asyncio web apps (FastAPI, Starlette)."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: Settings | None = None,
        store: TurnStore | None = None,
        retry_s: float | None = DEFAULT_RETRY_S,
    ) -> None:
        self.settings = settings or get_settings()
        self.redis_url = redis_url or self.settings.redis_url
        # As many connections as a web app's tasks may block on at once (`MAX_CONNECTIONS`).
        self.store = store or TurnStore.from_url(
            self.redis_url, ssl_cert_reqs=self.settings.redis_ssl_cert_reqs, max_connections=MAX_CONNECTIONS
        )
        self.retry_s = retry_s
        # The store's operations and flows on the store's client, but patient (the runtime's store is not:
        # its loops do their own retrying).
        self._runner = AsyncRunner(self.store.redis, where=build_shown_url(self.redis_url))
        # The catalogue a submit read last: a burst of submits naming the same tools costs one read.
        self._recent_catalogue = RecentCatalogue()

    def _patience(self) -> Patience:
        return Patience.for_s(self.retry_s)

    @takes_arguments_of(build_submission)
    async def submit(self, submission: Submission) -> str:
        """Store and queue a turn; returns its id once it is in Redis. A repeated `turn_id` is a no-op.

        `UnknownToolError` when it names tools no live worker serves (accepted while none has published)."""
        return await self.submit_request(submission.request, turn_id=submission.turn_id)

    async def submit_request(self, request: TurnRequest, *, turn_id: str | None = None) -> str:
        """Store and queue an already built `TurnRequest` (checked as by `submit`), with the caller's current
        trace context unless it carries one (`tracing.attach_trace_context`)."""
        request = attach_trace_context(request)
        names = ModelNames.from_settings(self.settings)
        flow = flows.submit(
            request,
            turn_id,
            codec.now_s(),
            check=partial(check_submit, names=names),
            recent=self._recent_catalogue,
            tool_gone_after_s=self.settings.tool_gone_after_s,
        )
        turn_id = await self._runner.run_flow(flow, self._patience())
        metrics.record_turn_submitted()
        return turn_id

    async def get(self, turn_id: str) -> TurnView:
        """Status, request, transcript so far, calls waiting for approval, the outcome once terminal, and
        the forks made of it; sensitive values redacted."""
        return await self._runner.run_flow(forks.read_view(turn_id), self._patience())

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
        """A new turn from turn `turn_id`'s messages up to message `at`, `replace` in its place (or message
        `at` itself), run on from there; returns its id. As `Client.fork`."""
        flow = _build_fork(
            self.settings, turn_id, at, replace, model, instructions, fork_id, self._recent_catalogue
        )
        forked = await self._runner.run_flow(flow, self._patience())
        metrics.record_turn_submitted()
        return forked

    async def outcome(self, turn_id: str) -> TurnOutcome | None:
        """The terminal outcome (sensitive values redacted), or None while the turn runs."""
        outcome = await self._runner.run(history.get_outcome(turn_id), self._patience())
        return None if outcome is None else build_shown_outcome(outcome)

    # `timeout` rather than asyncio.timeout: the same signature as the sync `Client.wait` (the contract).
    async def wait(self, turn_id: str, timeout: float) -> TurnOutcome:  # noqa: ASYNC109
        """Block until the turn is terminal; `TimeoutError` after `timeout` s. Redacted, as by `get`."""
        flow = flows.wait_outcome(turn_id, timeout, cap_ms=self.store.block_cap_ms, clock=time.monotonic)
        return build_shown_outcome(await self._runner.run_flow(flow, Patience.for_s(timeout)))

    def events(
        self, turn_id: str, after: str = "0", *, block_ms: int | None = None
    ) -> AsyncIterator[TurnEvent]:
        """The turn's events as they come, from `after` on, ending after `turn_finished`; as `Client`'s."""
        flow = flows.follow_events(turn_id, after, block_ms=block_ms, cap_ms=self.store.block_cap_ms)
        return self._runner.iter_flow(flow, Patience.for_s(None))

    def stream(
        self, turn_id: str, after: str = "0", *, block_ms: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        """The turn as it happens, typed, `TurnFinishedEvent` last; as `Client`'s."""
        flow = turn_stream.stream_turn(turn_id, after, block_ms=block_ms, cap_ms=self.store.block_cap_ms)
        return self._runner.iter_flow(flow, Patience.for_s(None))

    async def cancel(self, turn_id: str) -> bool:
        """Ask for the turn to be cancelled; False when it had already ended."""
        flow = flows.send_control(turn_id, "cancel", None, None, codec.now_s())
        return await self._runner.run_flow(flow, self._patience())

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
        """Approve (with edited `arguments`) or deny (with a `reason`) a call waiting for confirmation, as
        `decided_by`; False when the turn had ended. As `Client.approve`."""
        flow = flows.send_approval(
            turn_id,
            call_id,
            approved,
            codec.now_s(),
            arguments=arguments,
            reason=reason,
            decided_by=decided_by,
        )
        return await self._runner.run_flow(flow, self._patience())

    async def submit_tool_result(
        self, turn_id: str, call_id: str, *, result: Any = None, error: str | None = None
    ) -> bool:
        """Answer a call of a client-side tool with its `result` or an `error`; False when the turn had
        ended. As `Client.submit_tool_result`."""
        flow = flows.send_client_result(turn_id, call_id, codec.now_s(), result=result, error=error)
        return await self._runner.run_flow(flow, self._patience())

    @takes_arguments_of(build_direct_call)
    async def call_tool(self, call: DirectCall) -> ToolOutcome:
        """Run one tool call through the workers; a confirmed tool only with `approve=True`."""
        return await direct.arun_call(self.redis_url, call, self.settings)

    @takes_arguments_of(schedule_calls.build_schedule_call)
    async def schedule(self, schedule: Schedule) -> ScheduleView:
        """Run a turn on a schedule; as `Client.schedule`."""
        flow = schedule_calls.save(schedule, self.settings, recent=self._recent_catalogue)
        return await self._runner.run_flow(flow, self._patience())

    async def unschedule(self, name: str) -> bool:
        """Remove the schedule `name`; False when there was none."""
        return await self._runner.run_flow(schedule_calls.remove(name), self._patience())

    async def schedules(self) -> list[ScheduleView]:
        """Every schedule, by name, with its state and next run; as `Client.schedules`."""
        return await self._runner.run_flow(schedule_calls.list_all(), self._patience())

    async def register_agent(self, spec: AgentSpec) -> None:
        """Register (or replace) a named agent (`workers.AgentSpec`): every orchestrator and the API know it
        at once."""
        await self._runner.run(put_agent(spec), self._patience())

    async def list_agents(self) -> list[AgentSpec]:
        """Every named agent, by name: those the workers' modules declare and those registered."""
        return list((await self._runner.run(get_agents(), self._patience())).values())

    async def ping(self) -> bool:
        """True when Redis answers."""
        return await self.store.ping()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.store.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
