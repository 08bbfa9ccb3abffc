"""Persisting one step of a turn: its small state, the messages it added to the history, once, and its events.

The machine keeps the whole history in memory (`TurnState.history`); Redis keeps it once, in an append-only
list (`orchestrator.store.history`). The handle knows which of the state's messages the list holds
(`TurnHandle.entries`), so a step sends only the messages past them, with the list length it expects before
them: a step that adds no message writes none, and a long turn writes each message once instead of its whole
history at every step. The tool messages a step adds consume their calls' outcome keys, which keep a stub.

A save retried after a lost reply proves itself by the state stored (`TurnStore.resave_step`); `save_step.lua`
appends after the expected length in any case, so a message is never stored twice. A list that lost messages
the state had (expired, or lost with Redis's data) is written again whole.

A step's events (`build_emits`) are the streamed events its model calls still owed, then the machine's; an
outcome is counted once it became its call's answer (`count_answer`). A turn's last step carries its outcome
(`build_ending`): the save and the terminal write are one round trip.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from orchestrator import metrics
from orchestrator.machine.events import (
    ArmTimer,
    CancelTimer,
    Command,
    Emit,
    Event,
    Finish,
    ModelFailed,
    ModelResponded,
    ToolFinished,
)
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import TurnState, dump_entries, dump_state, find_call
from orchestrator.model import Message, ToolMessage, TurnOutcome, TurnStatus
from orchestrator.outage import REDIS_ERRORS, RedisRetry
from orchestrator.runtime.handle import TurnHandle
from orchestrator.runtime.inbox import to_wire_outcome
from orchestrator.store.flows import Unread
from orchestrator.store.history import Appended
from orchestrator.store.scripts import SaveResult
from orchestrator.store.turns import TurnStore
from workers import keys
from workers.contract import ToolOutcome
from workers.redis_errors import maybe_ran

log = logging.getLogger("toolloop.orchestrator")


def build_emits(events: Sequence[Event], commands: Sequence[Command]) -> list[tuple[str, Mapping[str, Any]]]:
    """What a step writes to the turn's event stream: the streamed events its model calls still owed (first:
    they were shown before the answer), then the machine's `Emit` commands, in order."""
    owed = [e for event in events if isinstance(event, ModelResponded | ModelFailed) for e in event.preview]
    return [*owed, *((c.event_name, c.data) for c in commands if isinstance(c, Emit))]


def build_ending(handle: TurnHandle, state: TurnState, commands: Sequence[Command]) -> Ending | None:
    """The outcome to store with the save of `state`, when its step ends the turn and nothing the step asks
    for must happen before the outcome is stored: its `Finish` comes after timers and events only (a
    synthetic outcome, a revocation, a parent's report go first, or after it, as the list has them). Only on
    one Redis (a cluster's end has a queue shard's part) and with the turn's conversation known."""
    if keys.is_cluster_layout() or state.parent is not None or isinstance(handle.conversation_id, Unread):
        return None
    for command in commands:
        if isinstance(command, Finish):
            return Ending(command.outcome, handle.conversation_id, state.tenant)
        if not isinstance(command, Emit | ArmTimer | CancelTimer):
            return None
    return None


def find_consumed(
    before: TurnState, added: Sequence[Message], finished: Sequence[ToolOutcome]
) -> tuple[ToolOutcome, ...]:
    """The outcomes (under their wire ids) of the calls whose tool messages are in `added`: from the round
    of the state before the step, else from the outcomes stepped in it."""
    answered = [m.tool_call_id for m in added if isinstance(m, ToolMessage)]
    if not answered:
        return ()
    known = {outcome.call_id: outcome for outcome in reversed(finished)}
    if before.current is not None:
        known.update({c.call_id: c.outcome for c in before.current.calls if c.outcome is not None})
    return tuple(to_wire_outcome(known[call_id]) for call_id in answered if call_id in known)


def build_append(
    handle: TurnHandle,
    before: TurnState,
    state: TurnState,
    finished: Sequence[ToolOutcome],
    *,
    whole: bool = False,
) -> tuple[Appended | None, list[str], list[str]]:
    """What the step appends to the turn's history and log lists (None: nothing), and the lists' entries
    after it. `whole`: the lists are written again from their start (one lost entries)."""
    stored = handle.entries
    if whole or len(state.history) < len(stored):
        start, kept = 0, stored[: len(state.history)] if whole else []
    else:
        start, kept = len(stored), stored
    added = state.history[start:]
    known = kept[: len(added)] if start == 0 else []
    texts = known + dump_entries(added[len(known) :])
    log_start = 0 if whole else len(handle.log)
    logged = dump_log(state, () if whole else handle.log)
    entries, log = [*stored[:start], *texts], [*handle.log[:log_start], *logged]
    if not texts and not logged:
        return None, stored, handle.log
    consumed = find_consumed(before, added, finished)
    append = Appended(
        handle.history_key, start, tuple(texts), consumed, handle.log_key, log_start, tuple(logged)
    )
    return append, entries, log


@dataclass(frozen=True)
class Ending:
    """The outcome a turn's last step stores with it (`TurnStore.finish_step`), and the turn's conversation
    and tenant."""

    outcome: TurnOutcome
    conversation_id: str | None
    tenant: str


class Persisted(IntEnum):
    """What `persist_step` did: nothing (refused), the step, or the step with the turn's outcome."""

    REFUSED = 0
    SAVED = 1
    FINISHED = 2


async def persist_step(
    store: TurnStore,
    retry: RedisRetry,
    handle: TurnHandle,
    *,
    steps: tuple[TurnState, TurnState],
    emits: Sequence[tuple[str, Mapping[str, Any]]],
    finished: Sequence[ToolOutcome],
    orchestrator_id: str,
    ending: Ending | None = None,
) -> Persisted:
    """Save the step that turned `before` into `state` (retried until it lands); REFUSED when the turn is
    terminal already, or another orchestrator holds its lease. `steps`: (before, state).

    With `ending`, the turn's outcome goes in the same round trip (FINISHED) — unless a try failed in a way
    that may have written it: then the step is proved or saved alone (SAVED) and the caller stores the
    outcome, whose first terminal write wins."""
    before, state = steps
    # The terminal status is written by `save_outcome` (Finish), atomically with the outcome; a terminal
    # state saved before it keeps a live status, and a resumed terminal state finishes on adoption.
    status = TurnStatus.RUNNING if state.terminal else state.status
    append, entries, logged = build_append(handle, before, state, finished)

    def dump(log: list[str]) -> str:
        return dump_state(state, history_key=handle.history_key, log_key=handle.log_key, log_len=len(log))

    state_json = dump(logged)
    unsure = False
    ends = False

    async def write(whole: bool) -> SaveResult:
        nonlocal ends
        # After a lost connection a try may have saved all but its reply; a refused one wrote nothing.
        if unsure and not whole:
            # Proved or saved alone, the step leaves the outcome to the caller (whose first write wins): a
            # finishing try that failed may have stored nothing, and a turn taken as finished is dropped.
            ends = False
            return await store.resave_step(
                handle.turn_id,
                state_json,
                status,
                emits,
                orchestrator_id=orchestrator_id,
                append=append,
                lists_kept=handle.lists_kept,
            )
        if ending is not None and not unsure:
            ends = True
            return await store.finish_step(
                handle.turn_id,
                state_json,
                status,
                emits,
                outcome=ending.outcome,
                conversation_id=ending.conversation_id,
                orchestrator_id=orchestrator_id,
                append=append,
                lists_kept=handle.lists_kept,
                tenant=ending.tenant,
            )
        ends = False
        return await store.write_step(
            handle.turn_id,
            state_json,
            status,
            emits,
            orchestrator_id=orchestrator_id,
            append=append,
            lists_kept=handle.lists_kept and not whole,
        )

    async def save() -> SaveResult:
        nonlocal unsure, append, entries, logged, state_json
        try:
            result = await write(whole=False)
            if result is SaveResult.HISTORY_GAP:
                log.warning("turn %s: its lists lost entries; writing them again", handle.turn_id)
                append, entries, logged = build_append(handle, before, state, finished, whole=True)
                state_json = dump(logged)
                result = await write(whole=True)
        except REDIS_ERRORS as exc:
            unsure = unsure or maybe_ran(exc)
            raise
        return result

    if await retry.call("steps", save) is not SaveResult.SAVED:
        return Persisted.REFUSED
    handle.set_state(state, state_json, entries, logged)
    return Persisted.FINISHED if ends else Persisted.SAVED


def count_answer(before: TurnState, after: TurnState, event: ToolFinished) -> None:
    """Count an outcome once, when it became its call's answer (a duplicate or late one is only audited)."""
    call = find_call(before, event.outcome.call_id)
    if call is not None and call.outcome is None and len(after.late_outcomes) == len(before.late_outcomes):
        metrics.record_tool_outcome(event.outcome)
