"""Performing the state machine's I/O commands: a command in, the events it produces out.

`Performer.perform(turn_id, state, command)` never calls back into the driver or the process. It returns
either the events the command produces at once, or a coroutine for slow work, which the driver runs as one
of the turn's tasks and whose result are the events to step when it ends — so one turn never holds up
another:

    WriteOutcomes   at once: first-writer-wins writes → ToolFinished(the winner) for each outcome
    Emit            at once: the turn event appended → nothing
    AwaitApproval   at once: a log line → nothing
    CallModel       later: the model's answer → ModelResponded, or ModelFailed (errors are values)
    DispatchTools   later: published through the `Publisher` → ToolFinished of each call that could not be
                    published (its synthetic `worker_lost` outcome, as written: the winner)
    Revoke          later: one batched revoke broadcast → nothing

Timers and `Finish` are not performed here: they are the turn's own bookkeeping, kept by the driver.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, assert_never

from orchestrator import metrics
from orchestrator.machine.events import (
    AwaitApproval,
    CallModel,
    Dispatch,
    DispatchTools,
    Emit,
    Event,
    ModelFailed,
    ModelResponded,
    Revoke,
    ToolFinished,
    WriteOutcomes,
)
from orchestrator.machine.state import TurnState
from orchestrator.model import ProviderError, Turn
from orchestrator.providers.base import ModelRequest, parse_model_ref
from orchestrator.providers.registry import ModelClients
from orchestrator.runtime.inbox import build_wire_call_id, to_local_outcome, to_wire_outcome
from orchestrator.runtime.publish import Publisher
from orchestrator.store.turns import TurnStore
from workers.contract import FailureKind, ToolCallRequest, ToolOutcome, build_failure

log = logging.getLogger("toolloop.orchestrator")

IoCommand = WriteOutcomes | Emit | AwaitApproval | CallModel | DispatchTools | Revoke
"""The commands a `Performer` performs (every other one is the driver's)."""

Later = Coroutine[Any, Any, Sequence[Event]]
"""Slow work of one command: run it as a task; it returns the events to step when it ends."""

_NOTHING: tuple[Event, ...] = ()


class Performer:
    """Performs I/O commands for every turn of one process; owns the publisher and the model clients."""

    def __init__(
        self,
        *,
        store: TurnStore,
        publisher: Publisher,
        models: ModelClients,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._models = models
        self._clock = clock

    async def perform(self, turn_id: str, state: TurnState, command: IoCommand) -> list[Event] | Later:
        """Perform `command` of the turn in `state`: the events it produces now (a list), or its slow work."""
        match command:
            case WriteOutcomes():
                return [await self._write(outcome) for outcome in command.outcomes]
            case Emit():
                await self._store.append_event(turn_id, command.event_name, command.data)
            case AwaitApproval():
                log.info("turn %s waits for approval of %s", turn_id, ", ".join(command.call_ids))
            case CallModel():
                return self._call_model(command)
            case DispatchTools():
                return self._dispatch(turn_id, state, command.calls)
            case Revoke():
                return self._revoke(command.task_ids)
            case _:
                assert_never(command)
        return []

    async def aclose(self) -> None:
        """Stop the publishing thread, then the in-process scripted model if one was started."""
        await self._publisher.aclose()
        await self._models.aclose()

    async def _write(self, outcome: ToolOutcome) -> ToolFinished:
        winner = await self._store.write_outcome(to_wire_outcome(outcome))
        return ToolFinished(outcome=to_local_outcome(winner), at=self._clock())

    # --- model calls -----------------------------------------------------------------------------------

    async def _call_model(self, command: CallModel) -> Sequence[Event]:
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
        return (event,)

    async def _complete(self, command: CallModel) -> Turn | ProviderError:
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
        )
        try:
            return await client.complete(request)
        except Exception as exc:
            # A client promises errors as values; a bug in one must still end as a model failure, not a
            # turn that waits forever for a response.
            log.exception("model client for %s raised", command.model)
            return ProviderError(provider=client.provider, type="client_error", message=repr(exc))

    # --- tools -----------------------------------------------------------------------------------------

    async def _dispatch(self, turn_id: str, state: TurnState, calls: list[Dispatch]) -> Sequence[Event]:
        offered = state.offered
        requests = [self._build_request(turn_id, call) for call in calls]
        sends = [
            (spec, request, call.task_id)
            for call, request in zip(calls, requests, strict=True)
            if (spec := offered.get(call.tool)) is not None
        ]
        errors = await self._publisher.publish(sends)
        unsent: list[Event] = []
        for call in calls:
            if call.tool in offered and call.task_id not in errors:
                continue
            error = errors.get(call.task_id) or "tool not in the turn catalogue"
            message = f"could not send '{call.tool}' to the workers: {error}"
            # Built under the model's call id, like every outcome the machine asks for: `_write` puts it
            # under the wire id once (from the request it would be prefixed twice, and never answer).
            outcome = build_failure(
                (call.call_id, call.tool, turn_id),
                FailureKind.WORKER_LOST,
                message,
                attempts=call.attempt,
                synthetic=True,
            )
            unsent.append(await self._write(outcome))
        return unsent

    def _build_request(self, turn_id: str, call: Dispatch) -> ToolCallRequest:
        return ToolCallRequest(
            call_id=build_wire_call_id(turn_id, call.call_id),
            tool=call.tool,
            arguments=call.arguments,
            turn_id=turn_id,
            context=call.context,
            attempt=call.attempt,
            deadline_at=call.deadline_at,
            dispatched_at=self._clock(),
        )

    async def _revoke(self, task_ids: list[str]) -> Sequence[Event]:
        await self._publisher.revoke(task_ids)
        return _NOTHING
