"""Performing the state machine's I/O commands: a command in, the events it produces out.

`Performer.perform(turn_id, state, command)` never calls back into the driver or the process. It returns
either the events the command produces at once, or a coroutine for slow work, which the driver runs as one
of the turn's tasks and whose result are the events to step when it ends — so one turn never holds up
another:

    WriteOutcomes   at once: first-writer-wins writes → ToolFinished(the winner) for each outcome
    Emit            at once: the turn event appended → nothing
    AwaitApproval   at once: a log line → nothing
    CallModel       later: the model's answer → ModelResponded, its usage priced (`orchestrator.pricing`),
                    or ModelFailed (errors are values); or, when the fleet's rate limits hold the call
                    (`store.rate_limits`), ModelThrottled, and the call is not sent
    DispatchTools   later: routed by the live catalogue (`route_call`), published through the `Publisher`
                    → ToolWaitingForWorker of each call sent while no live worker serves its tool (one did
                    within TOOLLOOP_TOOL_GONE_AFTER_S: it waits in its queue), and ToolFinished of each call
                    that was not sent: `not_found` when no worker has served its tool for longer,
                    `worker_lost` when publishing failed (synthetic, as written: the winner)
    Revoke          later: one batched revoke broadcast → nothing
    CheckWorker     later: the worker's heartbeat read → WorkerChecked (when it last reported in; None when
                    it is not there or Redis does not answer: either way the call waits for it)

Timers and `Finish` are not performed here: they are the turn's own bookkeeping, kept by the driver.

A Redis write that fails (Redis unreachable, out of memory, read-only) is retried with capped backoff
(`RedisRetry`) until it lands or the process stops; a publish that fails for want of Redis is retried by the
`Publisher` until it goes out. Neither answers a call for the want of Redis.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, assert_never

import redis

from orchestrator import metrics
from orchestrator.agents import build_child_request
from orchestrator.context.budget import ContextBudget
from orchestrator.context.tokens import count_request_tokens
from orchestrator.context.windows import (
    CONTEXT_LENGTH_EXCEEDED,
    DEFAULT_CONTEXT_WINDOW_TOKENS,
    WINDOW_DETAIL,
    build_context_window,
    find_context_window,
)
from orchestrator.errors import UnknownTurnError
from orchestrator.machine.events import (
    AwaitApproval,
    CallModel,
    CancelChildTurns,
    CheckWorker,
    ChildTurnFinished,
    Dispatch,
    DispatchTools,
    Emit,
    Event,
    ModelFailed,
    ModelResponded,
    ModelThrottled,
    QuotaExceeded,
    Revoke,
    StartChildTurn,
    ToolFinished,
    ToolWaitingForWorker,
    WorkerChecked,
    WriteOutcomes,
)
from orchestrator.machine.state import TurnState
from orchestrator.machine.validation import ToolAvailability
from orchestrator.model import ProviderError, Turn, Usage
from orchestrator.model_limits import Granted, build_reserved_tokens, build_settlement
from orchestrator.outage import RedisOutage, RedisRetry
from orchestrator.pricing import (
    FREE_PROVIDERS,
    REMEMBERED_MODELS,
    PriceTable,
    build_price_table,
    cost_usd,
    split_model_name,
)
from orchestrator.providers.base import ModelRequest, parse_model_ref
from orchestrator.providers.deltas import DeltaSink
from orchestrator.providers.rate_limits import RateLimitSignal, RateLimitSink
from orchestrator.providers.registry import ModelClients
from orchestrator.publishing.publisher import Publisher, Send
from orchestrator.runtime.inbox import build_wire_call_id, to_local_outcome, to_wire_outcome
from orchestrator.runtime.streaming import CallStream
from orchestrator.runtime.turn_spans import TurnSpans
from orchestrator.settings import Settings
from orchestrator.store.catalogue import LiveCatalogue, ToolCatalogue
from orchestrator.store.rate_limits import ModelLimiter
from orchestrator.store.turns import TurnStore
from orchestrator.tracing import trace_model_call
from workers import keys
from workers.agents import AgentSpec
from workers.contract import FailureKind, ToolCallRequest, ToolOutcome, ToolSpec, build_failure, redact
from workers.keys import TOOL_GONE_AFTER_S

log = logging.getLogger("toolloop.orchestrator")

IoCommand = (
    WriteOutcomes
    | Emit
    | AwaitApproval
    | CallModel
    | DispatchTools
    | Revoke
    | CheckWorker
    | StartChildTurn
    | CancelChildTurns
)
"""The commands a `Performer` performs (every other one is the driver's)."""

Later = Coroutine[Any, Any, Sequence[Event]]
"""Slow work of one command: run it as a task; it returns the events to step when it ends."""


class CatalogueView(Protocol):
    """The live tool catalogue as the dispatcher reads it (`store.catalogue.LiveCatalogue`)."""

    async def read(self, *, newer_than: float | None = None) -> ToolCatalogue:
        """The tools live workers serve and when each tool was last served; with `newer_than` (epoch
        seconds), as read by a read that started then or later. May raise `redis.RedisError`."""
        ...


Unsent = tuple[FailureKind, str]
"""Why a call is answered without being sent: the failure kind and its message."""


class Route(NamedTuple):
    """How a call is sent: with `spec` (its queue, its limits); `last_served_at` set when no live worker
    serves its tool right now, and the call waits in its queue for the next one."""

    spec: ToolSpec
    last_served_at: float | None = None


_NOTHING: tuple[Event, ...] = ()


def route_call(
    tool: str,
    offered: Mapping[str, ToolSpec],
    catalogue: ToolCatalogue | None,
    now: float,
    gone_after_s: float = TOOL_GONE_AFTER_S,
) -> Route | Unsent:
    """How a call of `tool` is published, or why it is not sent (pure).

    Sorted by `ToolCatalogue.availability`: a tool a live worker serves is sent; one a worker served within
    `gone_after_s` (its only worker restarting, a deploy) is sent too, to wait in its queue for the next
    worker — Celery keeps it there, its limits count once it starts, and it `expires` at the turn's deadline;
    a tool no worker has served for longer fails now as `not_found` rather than at the turn's deadline. The
    queue is the one served — a rolling deploy may have moved the tool to another queue since the turn
    started — and the limits stay those the turn was offered, which its timers count with. `catalogue` None
    (it could not be read): published as offered, the publisher's retries and the turn's timers still stand.
    """
    spec = offered.get(tool)
    if spec is None:
        message = f"could not send '{tool}' to the workers: tool not in the turn catalogue"
        return FailureKind.WORKER_LOST, message
    if catalogue is None:
        return Route(spec)
    availability = catalogue.availability(tool, now, gone_after_s)
    if availability is ToolAvailability.GONE:
        message = (
            f"tool '{tool}' is not served by any live worker, nor was it in the last {gone_after_s:g} s; "
            "the call was not sent"
        )
        return FailureKind.NOT_FOUND, message
    if availability is ToolAvailability.SERVED:
        queue, last_served_at = catalogue.live[tool].queue, None
    else:
        last_served_at, served = catalogue.served[tool]
        queue = served.queue
    return Route(spec if queue == spec.queue else spec.model_copy(update={"queue": queue}), last_served_at)


def build_context_budget(
    model: str | Sequence[str], settings: Settings, learned: Mapping[str, int]
) -> ContextBudget:
    """The context budget a new turn on `model` starts with; for a fallback order (a list), the
    window of its first model, and that of each of the others for when one takes over.

    A window is the smaller of the configured one (TOOLLOOP_CONTEXT_WINDOWS, else the price list's or the
    fallback table's, an alias's by TOOLLOOP_MODEL_ALIASES as its model's: `context.windows`) and one this
    process learned from a provider's over-long-context error (`learned`, by model).
    """

    def window_of(name: str) -> int:
        window = build_context_window(name, settings.context_windows, settings.model_aliases)
        return min(window, learned[name]) if name in learned else window

    first, *fallbacks = [model] if isinstance(model, str) else model
    return ContextBudget(
        window_tokens=window_of(first),
        output_reserve_tokens=settings.context_output_reserve_tokens,
        compaction=settings.compaction,
        model_windows={name: window_of(name) for name in fallbacks},
    )


def build_unknown_model_message(model: str, *, priced: bool, window_known: bool) -> str | None:
    """The one line an orchestrator logs of a model it has no price or no known window for (None: it has
    both), naming the setting that gives it."""
    missing = []
    if not priced:
        missing.append(
            "no price: its calls' cost_usd stays null, and a turn on it with limits.max_cost_usd fails at "
            "its start; give it in TOOLLOOP_MODEL_PRICES (USD per million tokens), or name the model a "
            "gateway's alias stands for in TOOLLOOP_MODEL_ALIASES"
        )
    if not window_known:
        missing.append(
            f"no known context window: its requests are fitted to {DEFAULT_CONTEXT_WINDOW_TOKENS:,} tokens "
            "until a provider's error states the window; give it in TOOLLOOP_CONTEXT_WINDOWS"
        )
    return f"model {model}: {'; '.join(missing)}" if missing else None


class _Answers:
    """The rate-limit signals of one model call's HTTP answers as they come, and when the last one came
    (monotonic): the provider had counted the call by then."""

    def __init__(self) -> None:
        self.signals: list[RateLimitSignal] = []
        self.last_at: float | None = None

    def add(self, signal: RateLimitSignal) -> None:
        self.signals.append(signal)
        self.last_at = time.monotonic()


class Performer:
    """Performs I/O commands for every turn of one process; owns the publisher and the model clients."""

    def __init__(
        self,
        *,
        store: TurnStore,
        publisher: Publisher,
        models: ModelClients,
        clock: Callable[[], float] = time.time,
        catalogue: CatalogueView | None = None,
        retry: RedisRetry | None = None,
        stream_flush_s: float = 0.2,
        prompt_caching: bool = True,
        prices: PriceTable | None = None,
        spans: TurnSpans | None = None,
        tool_gone_after_s: float = TOOL_GONE_AFTER_S,
        limiter: ModelLimiter | None = None,
        context_windows: Mapping[str, int] | None = None,
        start_models: Sequence[str] = (),
    ) -> None:
        """`catalogue` reads the live catalogue at dispatch (default: a `LiveCatalogue` on the store's);
        `retry` retries the Redis writes (default: one of its own, telling of `store`'s Redis);
        `stream_flush_s` is how often a streaming model call's deltas are written (`runtime.streaming`);
        `prompt_caching` asks for cache breakpoints (TOOLLOOP_PROMPT_CACHING); `prices` prices each call
        (default: genai-prices' list alone; in a process `pricing.build_price_table` with
        TOOLLOOP_MODEL_PRICES and TOOLLOOP_MODEL_ALIASES);
        `spans` the turns' spans, parents of the model calls' (`runtime.turn_spans`; None: no turn spans);
        `tool_gone_after_s` how long after its last worker a tool's calls still wait for the next one
        (TOOLLOOP_TOOL_GONE_AFTER_S); `limiter` the fleet's model rate limits (None: calls go unmetered, and
        no provider's signal pauses them); `context_windows` the windows named (TOOLLOOP_CONTEXT_WINDOWS).

        A model with no price or no known window is told of once, in one log line (`check_model`): each
        of `start_models` (the configured default and tiers) now, any other at its first call."""
        self._store = store
        self._retry = retry or RedisRetry(RedisOutage("redis://"))
        self._publisher = publisher
        self._models = models
        self._clock = clock
        self._catalogue = catalogue or LiveCatalogue(store.redis)
        self._stream_flush_s = stream_flush_s
        self._prompt_caching = prompt_caching
        self.prices = prices if prices is not None else build_price_table()
        self.spans = spans
        self._tool_gone_after_s = tool_gone_after_s
        self._limiter = limiter
        # Context windows providers stated in over-long-context errors, by `provider:model`: read when a
        # turn starts (`build_context_budget`), so that its calls fit the first time.
        self.learned_windows: dict[str, int] = {}
        self._context_windows = dict(context_windows or {})
        self._checked_models: set[str] = set()
        for model in start_models:
            self.check_model(model)

    async def perform(self, turn_id: str, state: TurnState, command: IoCommand) -> list[Event] | Later:
        """Perform `command` of the turn in `state`: the events it produces now (a list), or its slow work."""
        match command:
            case WriteOutcomes():
                return [await self._write(outcome) for outcome in command.outcomes]
            case Emit():
                append = functools.partial(
                    self._store.append_event, turn_id, command.event_name, command.data
                )
                await self._retry.call("events", append)
            case AwaitApproval():
                log.info("turn %s waits for approval of %s", turn_id, ", ".join(command.call_ids))
                if state.parent is not None:
                    await self._tell_parent_of_waits(turn_id, state, command.call_ids)
            case CallModel():
                return self._call_model(turn_id, command)
            case DispatchTools():
                return self._dispatch(turn_id, state, command.calls)
            case Revoke():
                return self._revoke(command.task_ids)
            case CheckWorker():
                return self._check_worker(command)
            case StartChildTurn():
                return self._start_child(turn_id, state, command)
            case CancelChildTurns():
                return self._cancel_children(command)
            case _:
                assert_never(command)
        return []

    async def _tell_parent_of_waits(self, turn_id: str, state: TurnState, call_ids: Sequence[str]) -> None:
        # A sub-agent's call that waits for a person shows on its parent's stream (and so its pages); it is
        # approved through either turn (`store.flows.send_approval`).
        assert state.parent is not None
        calls = {call.call_id: call for call in state.current.calls} if state.current is not None else {}
        for call_id in call_ids:
            call = calls.get(call_id)
            data = {
                "child_turn_id": turn_id,
                "agent": state.agent,
                "call_id": call_id,
                "tool": call.tool if call is not None else None,
                "arguments": redact(call.arguments) if call is not None else {},
                "wait_deadline": call.wait.deadline_at
                if call is not None and call.wait is not None
                else None,
            }
            append = functools.partial(
                self._store.append_event, state.parent.turn_id, "child_call_waiting", data
            )
            await self._retry.call("events", append)

    async def read_agents(self) -> dict[str, AgentSpec]:
        """Every named agent, read for a turn that starts as one (retried through a Redis outage)."""
        return await self._retry.call("agents", self._store.read_agents)

    async def _start_child(self, turn_id: str, state: TurnState, command: StartChildTurn) -> Sequence[Event]:
        # Submitted under the id the call derives: asked again (a new owner), it is a no-op, never a second
        # child. The child's orchestrator resolves its agent; one it cannot run reports why to this turn.
        request = build_child_request(command, turn_id, state.max_agent_depth, state.stream, self._clock())
        submit = functools.partial(self._store.submit, request, turn_id=command.turn_id)
        try:
            await self._retry.call("children", submit)
        except ValueError as exc:
            log.warning("turn %s: child turn %s could not be started: %s", turn_id, command.turn_id, exc)
            return [
                ChildTurnFinished(
                    call_id=command.call_id,
                    at=self._clock(),
                    turn_id=command.turn_id,
                    status="failed",
                    error=f"the sub-agent '{command.agent}' could not be started: {exc}",
                )
            ]
        log.info("turn %s: started child turn %s (%s)", turn_id, command.turn_id, command.agent)
        return []

    async def _cancel_children(self, command: CancelChildTurns) -> Sequence[Event]:
        for child in command.turn_ids:
            cancel = functools.partial(self._store.request_cancel, child)
            try:
                await self._retry.call("children", cancel)
            except UnknownTurnError:
                continue  # never started, or expired: nothing to stop
            log.info("cancelled child turn %s: %s", child, command.reason)
        return []

    async def aclose(self) -> None:
        """Stop the publishing thread, then the in-process scripted model if one was started."""
        await self._publisher.aclose()
        await self._models.aclose()

    async def _write(self, outcome: ToolOutcome) -> ToolFinished:
        write = functools.partial(self._store.write_outcome, to_wire_outcome(outcome))
        # First writer wins: a try again after a lost reply gets the outcome stored, ours or an earlier one.
        winner = to_local_outcome(await self._retry.call("outcomes", write))
        if winner.synthetic and self.spans is not None:
            self.spans.record_synthetic(winner)
        return ToolFinished(outcome=winner, at=self._clock())

    async def _check_worker(self, command: CheckWorker) -> Sequence[Event]:
        # One read, never retried: a Redis that does not answer says nothing of the worker, and the machine
        # then waits for it as for one not heard from (the lost-call timer still ends the wait).
        try:
            raw = await self._store.redis.get(keys.worker_seen(command.worker))
            seen_at = float(raw) if raw is not None else None
        except (redis.RedisError, OSError, ValueError) as exc:
            log.warning("could not read the heartbeat of worker %s: %r", command.worker, exc)
            seen_at = None
        return (
            WorkerChecked(
                call_id=command.call_id,
                attempt=command.attempt,
                worker=command.worker,
                seen_at=seen_at,
                at=self._clock(),
            ),
        )

    # --- model calls -----------------------------------------------------------------------------------

    async def _call_model(self, turn_id: str, command: CallModel) -> Sequence[Event]:
        self.check_model(command.model)
        granted: Granted | None = None
        if self._limiter is not None:
            exceeded = await self._check_quota(command)
            if exceeded is not None:
                return (exceeded,)
            # The call's id is its place in line: the same each time it asks, on whichever orchestrator.
            call = f"{turn_id}:{command.llm_call_index}"
            tokens = self._reserved_tokens(command)
            admission = await self._limiter.admit(command.model, tokens, call, command.tenant)
            if not isinstance(admission, Granted):
                metrics.record_model_throttled(command.model, admission.limit, admission.wait_s)
                throttled = ModelThrottled(
                    limit=admission.limit,
                    wait_s=admission.wait_s,
                    at=self._clock(),
                    llm_call_index=command.llm_call_index,
                )
                return (throttled,)
            granted = admission
        answers = _Answers()
        started = time.monotonic()
        stream = CallStream(
            functools.partial(self._store.append_events, turn_id),
            command.llm_call_index,
            flush_s=self._stream_flush_s,
            id_prefix=command.id_prefix,
        )
        parent = self.spans.context(turn_id) if self.spans is not None else None
        with trace_model_call(parent, command) as traced:
            result = await self._complete(
                command, stream.on_delta if command.stream and command.shown else None, answers.add
            )
            traced.record(result)
        if granted is not None:
            await self._settle(granted, result, answers)
        if self._limiter is not None and isinstance(result, Turn):
            usage = result.usage
            used_tokens = usage.total_tokens or usage.input_tokens + usage.output_tokens
            await self._limiter.count_day_tokens(command.tenant, used_tokens, self._clock())
        # The stream's last events are written with the step that records the answer (`preview`).
        preview = tuple(await stream.finish(result)) if command.shown else ()
        duration_s = time.monotonic() - started
        at = self._clock()
        event: Event
        if isinstance(result, ProviderError):
            outcome = "retryable_error" if result.retryable else "error"
            metrics.record_model_call(result.provider, outcome, duration_s)
            self._learn_window(command.model, result)
            event = ModelFailed(
                error=result,
                duration_ms=duration_s * 1000,
                at=at,
                llm_call_index=command.llm_call_index,
                preview=preview,
            )
        else:
            result = self._price(command.model, result)
            metrics.record_model_call(
                result.provider or "unknown",
                "ok",
                duration_s,
                input_tokens=result.usage.input_tokens,
                output_tokens=result.usage.output_tokens,
            )
            event = ModelResponded(
                turn=result,
                duration_ms=duration_s * 1000,
                at=at,
                llm_call_index=command.llm_call_index,
                preview=preview,
            )
        return (event,)

    async def _check_quota(self, command: CallModel) -> QuotaExceeded | None:
        # A tenant past its tokens a day: the call is not made, and the turn ends (`quota_exceeded`).
        assert self._limiter is not None
        quota = self._limiter.day_quota(command.tenant)
        if quota is None:
            return None
        now = self._clock()
        used = await self._limiter.used_today(command.tenant, now)
        if used < quota:
            return None
        return QuotaExceeded(
            tenant=command.tenant, limit=quota, used=used, at=now, llm_call_index=command.llm_call_index
        )

    def _reserved_tokens(self, command: CallModel) -> int:
        # Estimated only for a tokens budget: the view's estimate came with the command, a summary's not.
        assert self._limiter is not None
        if not self._limiter.counts_tokens(command.model, command.tenant):
            return 0
        estimated = command.estimated_tokens
        if estimated is None:
            estimated = count_request_tokens(command.messages, command.tools)
        return build_reserved_tokens(estimated, command.settings.max_output_tokens)

    async def _settle(self, granted: Granted, result: Turn | ProviderError, answers: _Answers) -> None:
        assert self._limiter is not None
        answered_ago_s = None
        if isinstance(result, Turn):
            answered_ago_s = time.monotonic() - answers.last_at if answers.last_at is not None else 0.0
        # A provider that reports no usage leaves the reservation as it was.
        usage = result.usage if isinstance(result, Turn) else Usage()
        used = usage.total_tokens or usage.input_tokens + usage.output_tokens or None
        settlement = build_settlement(granted, answered_ago_s, used, answers.signals)
        if settlement is None:
            return
        if settlement.pause_s > 0:
            log.info("model %s rests %.1f s, as its provider asks", granted.model, settlement.pause_s)
        await self._limiter.settle(granted, settlement)

    def unpriced(self, models: Sequence[str]) -> list[str]:
        """The models of `models` the price table has no price for (a budget in dollars cannot be kept)."""
        probe = Usage(input_tokens=1, output_tokens=1, total_tokens=2)
        return [model for model in models if cost_usd(model, probe, self.prices) is None]

    def check_model(self, model: str) -> None:
        """Log once per model, the first time it is asked about, that it has no price or no known window.
        Scripted models are never told of."""
        if model in self._checked_models:
            return
        if len(self._checked_models) >= REMEMBERED_MODELS:  # names come from the turns: bounded
            self._checked_models.clear()
        self._checked_models.add(model)
        if split_model_name(model)[0] in FREE_PROVIDERS:
            return
        window = find_context_window(model, self._context_windows, self.prices.aliases)
        message = build_unknown_model_message(
            model, priced=not self.unpriced([model]), window_known=window is not None
        )
        if message is not None:
            log.warning("%s", message)

    def _price(self, model: str, turn: Turn) -> Turn:
        # Before the answer is stepped: the machine sums the costs and checks the budget in dollars. A cost
        # the provider reported stands when the table has no price; none at all stays None, never a guess.
        cost = cost_usd(model, turn.usage, self.prices)
        if cost is None:
            return turn
        return turn.model_copy(update={"usage": turn.usage.model_copy(update={"cost_usd": cost})})

    def _learn_window(self, model: str, error: ProviderError) -> None:
        window = (error.details or {}).get(WINDOW_DETAIL)
        if error.code != CONTEXT_LENGTH_EXCEEDED or not isinstance(window, int) or window <= 0:
            return
        if self.learned_windows.get(model) != window:
            log.info("model %s: context window of %d tokens, as the provider states", model, window)
            self.learned_windows[model] = window

    async def _complete(
        self, command: CallModel, on_delta: DeltaSink | None, on_rate_limits: RateLimitSink | None = None
    ) -> Turn | ProviderError:
        try:
            client = await self._models.get(command.model)
        except ValueError as exc:
            return ProviderError(
                provider=command.model.partition(":")[0], type="invalid_model", message=str(exc)
            )
        request = ModelRequest(
            model=parse_model_ref(command.model).model,
            messages=command.messages,
            tools=command.tools,
            tool_choice=command.tool_choice,
            id_prefix=command.id_prefix,
            stream=command.stream,
            max_output_tokens=command.settings.max_output_tokens,
            instructions=command.instructions,
            settings=command.settings,
            output_schema=command.output_schema,
            prompt_cache=self._prompt_caching,
            on_rate_limits=on_rate_limits,
        )
        try:
            return await client.complete(request, on_delta)
        except Exception as exc:
            # A client promises errors as values; a bug in one must still end as a model failure, not a
            # turn that waits forever for a response.
            log.exception("model client for %s raised", command.model)
            return ProviderError(provider=client.provider, type="client_error", message=repr(exc))

    # --- tools -----------------------------------------------------------------------------------------

    async def _dispatch(self, turn_id: str, state: TurnState, calls: list[Dispatch]) -> Sequence[Event]:
        live = await self._read_live()
        if live is not None and any(c.tool in state.offered and c.tool not in live.live for c in calls):
            # The cached view may predate the turn's own snapshot of the catalogue (a worker that started
            # since then): a tool is judged without a worker only by a read at least as recent as that.
            live = await self._read_live(newer_than=state.started_at)
        now = self._clock()
        routes = {
            call.task_id: route_call(call.tool, state.offered, live, now, self._tool_gone_after_s)
            for call in calls
        }
        sends = [
            Send(route.spec, self._build_request(turn_id, call), call.task_id, call.priority)
            for call in calls
            if isinstance(route := routes[call.task_id], Route)
        ]
        errors = await self._publisher.publish(sends)
        events: list[Event] = []
        for call in calls:
            route = routes[call.task_id]
            if isinstance(route, Route):
                if call.task_id not in errors:
                    if route.last_served_at is not None:
                        events.append(
                            ToolWaitingForWorker(
                                call_id=call.call_id,
                                attempt=call.attempt,
                                last_served_at=route.last_served_at,
                                at=self._clock(),
                            )
                        )
                    continue
                kind = FailureKind.WORKER_LOST
                message = f"could not send '{call.tool}' to the workers: {errors[call.task_id]}"
            else:
                kind, message = route
            # Built under the model's call id, like every outcome the machine asks for: `_write` puts it
            # under the wire id once (from the request it would be prefixed twice, and never answer).
            outcome = build_failure(
                (call.call_id, call.tool, turn_id),
                kind,
                message,
                # No worker could have run a tool none serves; a lost publish counts as the attempt it was.
                attempts=0 if kind is FailureKind.NOT_FOUND else call.attempt,
                synthetic=True,
            )
            events.append(await self._write(outcome))
        return events

    async def read_catalogue(self, names: Sequence[str] | None) -> Mapping[str, ToolSpec]:
        """The catalogue for a turn that starts, offering the tools `names` (None: all): the tools live
        workers serve and those a worker served within TOOLLOOP_TOOL_GONE_AFTER_S (its calls will wait for
        the next one), by the view read at most a second ago, unless it lacks one of them (a worker that
        just came up: read again)."""
        catalogue = (await self._catalogue.read()).known(self._clock(), self._tool_gone_after_s)
        if names is not None and not all(name in catalogue for name in names):
            fresh = await self._catalogue.read(newer_than=self._clock())
            catalogue = fresh.known(self._clock(), self._tool_gone_after_s)
        return catalogue

    async def _read_live(self, *, newer_than: float | None = None) -> ToolCatalogue | None:
        try:
            return await self._catalogue.read(newer_than=newer_than)
        except redis.RedisError as exc:
            log.warning("dispatching without the live catalogue (%s): tools are sent as offered", exc)
            return None

    def _build_request(self, turn_id: str, call: Dispatch) -> ToolCallRequest:
        return ToolCallRequest(
            call_id=build_wire_call_id(turn_id, call.call_id),
            tool=call.tool,
            arguments=call.arguments,
            turn_id=turn_id,
            context=call.context,
            tenant=call.tenant,
            attempt=call.attempt,
            deadline_at=call.deadline_at,
            dispatched_at=self._clock(),
        )

    async def _revoke(self, task_ids: list[str]) -> Sequence[Event]:
        await self._publisher.revoke(task_ids)
        return _NOTHING
