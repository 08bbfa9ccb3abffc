"""Performing the state machine's commands: the I/O half of the orchestrator runtime.

`CommandExecutor.execute(handle, commands)` runs under the turn's lock and returns the events that follow at
once (the winners of synthetic outcome writes). Slow work — model calls, publishing to Celery, revoking —
runs as tasks that feed their result back as an event later, so one turn never holds up another.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, assert_never

import httpx
from celery import Celery

from orchestrator import metrics
from orchestrator.machine.events import (
    ArmTimer,
    AwaitApproval,
    CallModel,
    CancelTimer,
    Command,
    Dispatch,
    DispatchTools,
    Emit,
    Event,
    Finish,
    ModelFailed,
    ModelResponded,
    Revoke,
    ToolFinished,
    WriteOutcomes,
)
from orchestrator.model import ProviderError, Turn
from orchestrator.providers.base import ModelClient, ModelRequest, parse_model_ref
from orchestrator.providers.registry import build_model_client
from orchestrator.providers.scripted_server import ScriptedServer
from orchestrator.runtime.inbox import build_wire_call_id, to_local_outcome, to_wire_outcome
from orchestrator.runtime.publish import build_send_options
from orchestrator.runtime.timers import TimerHeap
from orchestrator.settings import Settings
from orchestrator.store.turns import TurnStore
from workers.contract import FailureKind, ToolCallRequest, ToolOutcome, ToolSpec, build_failure

if TYPE_CHECKING:
    from orchestrator.runtime.handle import TurnHandle

log = logging.getLogger("toolloop.orchestrator")

# Publishing is retried a few times (Redis briefly unavailable) before the call is answered as lost.
PUBLISH_ATTEMPTS = 4
PUBLISH_BACKOFF_S = 0.5
# Revocations asked for within this window go out in one broadcast.
REVOKE_BATCH_S = 0.02

Spawn = Callable[[Awaitable[None], "TurnHandle"], None]
Feed = Callable[["TurnHandle", Iterable[Event]], Awaitable[None]]
Finished = Callable[["TurnHandle"], Awaitable[None]]


class Publisher:
    """Publishes tool calls from one dedicated thread, so that the event loop never blocks on the broker.

    kombu's publishing is blocking. One long-lived thread with a producer (and broker connection) from the
    app's pool serves every turn: the calls of one `DispatchTools` cost one hop to it and one pipelined
    round trip to the broker, not a thread hop and a round trip each, and no two publishing threads
    contend for the GIL with the event loop.
    """

    def __init__(self, app: Celery) -> None:
        self._app = app
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolloop-publish")
        # Task ids waiting for the next revoke broadcast, and the future that says it was sent.
        self._revokes: tuple[list[str], asyncio.Future[None]] | None = None

    async def publish(self, sends: Sequence[tuple[ToolSpec, ToolCallRequest, str]]) -> dict[str, Exception]:
        """Publish each (spec, request, task id); the errors of those that failed, by task id."""
        if not sends:
            return {}
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._publish_all, list(sends))

    def _publish_all(self, sends: list[tuple[ToolSpec, ToolCallRequest, str]]) -> dict[str, Exception]:
        errors: dict[str, Exception] = {}
        try:
            # One producer and one kombu publish batch: every message of the batch (and its `task-sent`
            # event) goes out in one pipelined round trip when the batch closes.
            with self._app.producer_or_acquire() as producer, producer.batch():
                for spec, request, task_id in sends:
                    try:
                        options = build_send_options(spec, request, time.time(), task_id=task_id)
                        self._app.send_task(**options, producer=producer)
                    except Exception as exc:
                        errors[task_id] = exc
        except Exception as exc:
            # The flush failed: any message of the batch may be lost. Publishing one again is harmless (a
            # second delivery of a call never runs it twice), losing one is not.
            return {task_id: errors.get(task_id, exc) for _, _, task_id in sends}
        return errors

    async def revoke(self, task_ids: list[str]) -> None:
        """Revoke and terminate these tasks; returns once the broadcast that carries them is sent.

        Revocations asked for within REVOKE_BATCH_S share one broadcast (`Control.revoke` takes a list): a
        deadline that stops hundreds of turns at once costs the workers a few control messages (and a few
        killed pool processes), not one each, and costs this process little CPU while it must answer them.
        """
        loop = asyncio.get_running_loop()
        if self._revokes is None:
            self._revokes = ([], loop.create_future())
            loop.call_later(REVOKE_BATCH_S, self._flush_revokes)
        ids, sent = self._revokes
        ids += task_ids
        await asyncio.shield(sent)

    def _flush_revokes(self) -> None:
        if self._revokes is None:
            return  # flushed already, by aclose
        ids, sent = self._revokes
        self._revokes = None
        future = asyncio.get_running_loop().run_in_executor(self._pool, self._revoke_all, ids)
        future.add_done_callback(lambda _: sent.set_result(None))

    def _revoke_all(self, task_ids: list[str]) -> None:
        try:
            # terminate: a running tool is killed, not left to finish work nobody will read.
            self._app.control.revoke(task_ids, terminate=True)
        except Exception as exc:
            # Best effort: the calls' outcomes are already decided by first-writer-wins.
            log.warning("revoking %s failed: %s", ", ".join(task_ids), exc)

    async def aclose(self) -> None:
        """Send the revocations still waiting, let the thread finish what it publishes, then end it."""
        self._flush_revokes()
        await asyncio.to_thread(self._pool.shutdown)


class CommandExecutor:
    """Executes commands for the runtime; owns the shared model clients and the in-process scripted model."""

    def __init__(
        self,
        *,
        store: TurnStore,
        celery_app: Celery,
        http: httpx.AsyncClient,
        settings: Settings,
        timers: TimerHeap,
        spawn: Spawn,
        feed: Feed,
        finish: Finished,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._app = celery_app
        self._http = http
        self._settings = settings
        self._timers = timers
        self._spawn = spawn
        self._feed = feed
        self._finish = finish
        self._clock = clock
        self._clients: dict[str, ModelClient] = {}
        self._scripted: ScriptedServer | None = None
        self._scripted_lock = asyncio.Lock()
        self._publisher = Publisher(celery_app)

    async def execute(self, handle: TurnHandle, commands: Iterable[Command]) -> list[Event]:
        """Perform `commands` in order; the events they produce at once, to step next."""
        follow_ups: list[Event] = []
        finishing = False
        for command in commands:
            if isinstance(command, Finish):
                await self._store.save_outcome(
                    handle.turn_id, command.outcome, conversation_id=handle.conversation_id
                )
                finishing = True
            else:
                follow_ups += await self._execute_one(handle, command)
        if finishing:
            # After the whole list: the machine may put revocations after its Finish.
            await self._finish(handle)
        return follow_ups

    async def _execute_one(self, handle: TurnHandle, command: Command) -> list[Event]:
        match command:
            case CallModel():
                self._spawn(self._call_model(handle, command), handle)
            case DispatchTools():
                self._spawn(self._dispatch(handle, command.calls), handle)
            case WriteOutcomes():
                return [await self._write(outcome) for outcome in command.outcomes]
            case ArmTimer():
                self._timers.arm(handle.turn_id, command.timer_id, command.at)
            case CancelTimer():
                self._timers.cancel(handle.turn_id, command.timer_id)
            case Revoke():
                self._spawn(self._revoke(command.task_ids), handle)
            case AwaitApproval():
                log.info("turn %s waits for approval of %s", handle.turn_id, ", ".join(command.call_ids))
            case Emit():
                await self._store.append_event(handle.turn_id, command.event_name, command.data)
            case Finish():
                raise AssertionError("Finish is handled by execute()")
            case _:
                assert_never(command)
        return []

    async def _write(self, outcome: ToolOutcome) -> Event:
        winner = await self._store.write_outcome(to_wire_outcome(outcome))
        return ToolFinished(outcome=to_local_outcome(winner), at=self._clock())

    async def aclose(self) -> None:
        """Stop the publishing thread, and the in-process scripted model if this executor started one."""
        await self._publisher.aclose()
        if self._scripted is not None:
            await self._scripted.__aexit__(None, None, None)
            self._scripted = None

    # --- model calls -----------------------------------------------------------------------------------

    async def _call_model(self, handle: TurnHandle, command: CallModel) -> None:
        started = time.monotonic()
        result = await self._complete(command)
        duration_s = time.monotonic() - started
        at = self._clock()
        event: Event
        if isinstance(result, ProviderError):
            outcome = "retryable_error" if result.retryable else "error"
            metrics.record_model_call(result.provider, outcome, duration_s)
            event = ModelFailed(
                error=result, duration_ms=duration_s * 1000, at=at, llm_call_index=command.llm_call_index
            )
        else:
            metrics.record_model_call(
                result.provider or "unknown",
                "ok",
                duration_s,
                input_tokens=result.usage.input_tokens,
                output_tokens=result.usage.output_tokens,
            )
            event = ModelResponded(
                turn=result, duration_ms=duration_s * 1000, at=at, llm_call_index=command.llm_call_index
            )
        await self._feed(handle, [event])

    async def _complete(self, command: CallModel) -> Turn | ProviderError:
        try:
            client = await self._client_for(command.model)
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
        )
        try:
            return await client.complete(request)
        except Exception as exc:
            # A client promises errors as values; a bug in one must still end as a model failure, not a
            # turn that waits forever for a response.
            log.exception("model client for %s raised", command.model)
            return ProviderError(provider=client.provider, type="client_error", message=repr(exc))

    async def _client_for(self, model: str) -> ModelClient:
        client = self._clients.get(model)
        if client is None:
            ref = parse_model_ref(model)
            scripted_url = None
            if ref.provider == "scripted" and not self._settings.scripted_base_url:
                scripted_url = await self._scripted_url()
            client = build_model_client(
                ref, self._settings, self._http, max_retries=0, scripted_base_url=scripted_url
            )
            self._clients[model] = client
        return client

    async def _scripted_url(self) -> str:
        # Started once, inside this event loop, the first time a turn names a scripted model.
        async with self._scripted_lock:
            if self._scripted is None:
                server = ScriptedServer()
                await server.__aenter__()
                self._scripted = server
                log.info("scripted model serving at %s", server.base_url)
            return self._scripted.base_url

    # --- tools -----------------------------------------------------------------------------------------

    async def _dispatch(self, handle: TurnHandle, calls: list[Dispatch]) -> None:
        requests = [self._build_request(handle, call) for call in calls]
        sends = [
            (spec, request, call.task_id)
            for call, request in zip(calls, requests, strict=True)
            if (spec := handle.state.offered.get(call.tool)) is not None
        ]
        errors: dict[str, Exception] = {}
        for attempt in range(PUBLISH_ATTEMPTS):
            if attempt:
                await asyncio.sleep(PUBLISH_BACKOFF_S * 2 ** (attempt - 1))
            errors = await self._publisher.publish(sends)
            for task_id, exc in errors.items():
                log.warning("publishing %s failed (%s); attempt %d", task_id, exc, attempt + 1)
            sends = [send for send in sends if send[2] in errors]
            if not sends:
                break
        for call, request in zip(calls, requests, strict=True):
            if call.tool in handle.state.offered and call.task_id not in errors:
                continue
            error = errors.get(call.task_id) or "tool not in the turn catalogue"
            message = f"could not send '{call.tool}' to the workers: {error}"
            outcome = build_failure(
                request, FailureKind.WORKER_LOST, message, attempts=call.attempt, synthetic=True
            )
            await self._feed(handle, [await self._write(outcome)])

    def _build_request(self, handle: TurnHandle, call: Dispatch) -> ToolCallRequest:
        return ToolCallRequest(
            call_id=build_wire_call_id(handle.turn_id, call.call_id),
            tool=call.tool,
            arguments=call.arguments,
            turn_id=handle.turn_id,
            context=call.context,
            attempt=call.attempt,
            deadline_at=call.deadline_at,
            dispatched_at=self._clock(),
        )

    async def _revoke(self, task_ids: list[str]) -> None:
        await self._publisher.revoke(task_ids)
