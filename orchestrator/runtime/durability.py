"""The durability watch: an orchestrator notices when Redis comes back without its data, and says so loudly.

A Redis without persistence (or restored from an older snapshot, or a replica that lagged when it was
promoted) comes back with a new `run_id` and without the keys of the turns in flight. Nothing else tells:
leases look "lost", `show` says "never submitted". So every `interval_s` the watcher reads the run id
(`orchestrator.store.losses`); when it changes, it checks whether the data survived (the marker) and which
turns this orchestrator ran have lost their keys, and for those:

- one ERROR line naming how many and which, counted in `toolloop_turns_lost_total`;
- the turn is dropped here (nothing more is stepped, saved or dispatched for it);
- a terminal `failed` record is written in its place (`record_lost.lua`) from the state held in memory: its
  request and transcript as this orchestrator last had them, an outcome whose error says what happened,
  and `turn_finished`, so `toolloop show`, `GET /v1/turns/{id}` and a waiting client get an answer;
- every call of its round still unanswered gets a synthetic outcome (first writer wins), so a worker that
  still holds its message skips it, and a worker that finishes it late only adds to the audit list;
- the loss is noted in Redis (`RedisLoss`), which `toolloop show` of an unknown turn mentions.

The watcher remembers the turns it saw held at its last look, so a turn the lease loop dropped first (its
lease "lost" with the rest of Redis) is still recorded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator import metrics
from orchestrator.machine.state import TurnState
from orchestrator.model import (
    Message,
    ProviderError,
    ToolMessage,
    TurnOutcome,
    TurnRequest,
    UserMessage,
)
from orchestrator.runtime.handle import TurnHandle
from orchestrator.runtime.inbox import build_wire_call_id
from orchestrator.store import cluster, flows, losses
from orchestrator.store.losses import LostResult, RedisLoss
from orchestrator.store.runner import AsyncRunner
from orchestrator.store.turns import TurnStore
from workers import keys
from workers.contract import FailureKind, ToolOutcome, build_failure
from workers.redis_errors import REDIS_ERRORS, RedisErrorKind, classify

log = logging.getLogger("toolloop.orchestrator")

# How often the run id is read at most: an INFO costs Redis next to nothing, and reading it well within the
# lease loop's period lets the watcher tell a loss before the lease loop calls every lease "lost".
WATCH_S = 1.0
# How often the turns held are noted between two looks (no Redis involved): a turn claimed just before Redis
# went away, and dropped by the driver (its save refused) before the next look, is still known to be lost.
TRACK_S = 0.1
# After a restart or failover with the data, when the turns catch up again (seconds after it was seen):
# writers leave an old master still up at different speeds (a pool asks the sentinels every second, kombu's
# consumers when it is demoted, which sentinels do within ten seconds), and what they wrote there is lost.
CATCH_UP_AFTER_S = (1.0, 3.0, 10.0, 20.0)
# How many lost turn ids the ERROR line names at most (each lost turn's record tells it too).
SHOWN_IDS = 100
# Redis errors the watcher waits out (Redis not there, or restarting): the other loops report the outage; the
# next look retries.
_WAITED_OUT = (RedisErrorKind.UNREACHABLE, RedisErrorKind.LOADING)


class HoldsTurns(Protocol):
    """What the watcher needs of the turn driver: the turns it holds, and dropping one (no lease release)."""

    @property
    def turns(self) -> Mapping[str, TurnHandle]: ...

    async def drop(self, handle: TurnHandle, *, release: bool) -> None: ...

    async def catch_up(self) -> None: ...


@dataclass(frozen=True)
class LostRecord:
    """What is written for one lost turn: its request and outcome, and its unanswered calls' outcomes."""

    request: TurnRequest
    outcome: TurnOutcome
    call_outcomes: list[ToolOutcome]


def build_watch_interval(lease_ttl_s: float) -> float:
    """How often to read the run id: at least six times per lease period, at most once a second."""
    return min(WATCH_S, lease_ttl_s / 6)


def build_id_list(turn_ids: Sequence[str], limit: int = SHOWN_IDS) -> str:
    """The ids for the log line, the first `limit` of them, then how many more."""
    shown = ", ".join(turn_ids[:limit])
    rest = len(turn_ids) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown


def build_lost_message(redis_url: str, loss: RedisLoss) -> str:
    """What a lost turn's outcome says: what happened, and what to do."""
    return (
        f"turn lost: Redis at {redis_url} came back without its keys ({losses.build_loss_line(loss)}); its "
        "request and transcript are as the orchestrator running it last held them. Submit it again to run it."
    )


def build_lost_request(state: TurnState, conversation_id: str | None) -> TurnRequest:
    """The request as far as the state tells: the history up to its last user message, and its settings."""
    history = list(state.history)
    users = [i for i, m in enumerate(history) if isinstance(m, UserMessage)]
    messages = history[: users[-1] + 1] if users else history
    return TurnRequest(
        messages=messages,
        tools=state.tools_allowed,
        model=state.model,
        limits=state.limits,
        context=state.context,
        conversation_id=conversation_id,
        tool_choice=state.tool_choice,
    )


def build_lost_record(state: TurnState, conversation_id: str | None, message: str, at: float) -> LostRecord:
    """The terminal record of a lost turn (pure): a `failed` outcome whose history ends on no unanswered
    call — the round in progress closes with its outcomes so far, the others answered as lost."""
    messages: list[Message] = list(state.history)
    unanswered: list[ToolOutcome] = []
    current = state.current
    if current is not None:
        round_messages: list[Message] = [current.assistant]
        for call in current.calls:
            answer = call.outcome
            if answer is None:
                wire_id = build_wire_call_id(state.turn_id, call.call_id)
                answer = build_failure(
                    (wire_id, call.tool, state.turn_id),
                    FailureKind.CANCELLED,
                    f"not answered: {message}",
                    synthetic=True,
                    finished_at=at,
                )
                unanswered.append(answer)
            round_messages.append(
                ToolMessage(
                    tool_call_id=call.call_id,
                    name=call.tool,
                    content=answer.content,
                    is_error=not answer.ok,
                    failure_kind=answer.failure_kind,
                    synthetic=answer.synthetic,
                )
            )
        messages += round_messages
    outcome = TurnOutcome(
        turn_id=state.turn_id,
        status="failed",
        text=None,
        messages=messages,
        usage=state.usage,
        llm_calls=state.llm_calls,
        tool_executions=state.tool_executions,
        model=state.model,
        error=ProviderError(
            provider=losses.LOST_PROVIDER, type="state_lost", code=losses.LOST_CODE, message=message
        ),
        llm_call_records=list(state.llm_call_records),
    )
    return LostRecord(build_lost_request(state, conversation_id), outcome, unanswered)


def _conversation_of(handle: TurnHandle) -> str | None:
    return handle.conversation_id if isinstance(handle.conversation_id, str) else None


class DurabilityWatcher:
    """Watches Redis's run id for one orchestrator; `await run()` forever (see the module docstring)."""

    def __init__(
        self,
        *,
        store: TurnStore,
        driver: HoldsTurns,
        orchestrator_id: str,
        redis_url: str,
        interval_s: float = WATCH_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._runner = AsyncRunner(store.redis)
        self._retention = store.retention
        self._driver = driver
        self._orchestrator_id = orchestrator_id
        self._url = redis_url
        self.interval_s = interval_s
        self._clock = clock
        self.run_id: str | None = None
        # The turns held since the last look: one the lease loop or the driver has dropped since (its lease
        # "lost", its save refused) is still checked.
        self._seen: dict[str, TurnHandle] = {}
        # Turns already told and counted as lost in the change being handled (a retried handling after a
        # Redis error does not count them twice).
        self._told: set[str] = set()
        self._told_loss = False
        self._error_said: str | None = None
        self._looking = asyncio.Lock()
        self._catching_up: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Look now, then every `interval_s`, until cancelled; Redis errors are retried at the next look."""
        try:
            while True:
                await self._look_safely()
                for _ in range(max(1, round(self.interval_s / TRACK_S))):
                    await asyncio.sleep(min(TRACK_S, self.interval_s))
                    self._seen.update(self._driver.turns)
        finally:
            # The orchestrator is stopping: the catch-ups still scheduled are its turns' next owners' now.
            if self._catching_up is not None:
                self._catching_up.cancel()

    async def _look_safely(self) -> None:
        try:
            await self.check()
        except REDIS_ERRORS as exc:
            meaning = classify(exc)
            if meaning is not None and meaning.kind in _WAITED_OUT:
                return  # the other loops tell the outage; the next look sees what Redis came back with
            # Refused (INFO disabled, out of memory for the records): said once, retried every look.
            if str(exc) != self._error_said:
                self._error_said = str(exc)
                log.warning("durability watch on Redis at %s failed (%s); retrying", self._url, exc)
        except Exception as exc:
            # A bug here must not stop the orchestrator (its loops end it when one ends): said, retried.
            if repr(exc) != self._error_said:
                self._error_said = repr(exc)
                log.exception("durability watch failed; retrying")

    async def check(self) -> set[str]:
        """One look: the ids of the turns found lost (and recorded) by this look; usually none.

        Also called by the lease loop before it says a lease was lost: one look at a time (the lock), so a
        loss is told and recorded once."""
        async with self._looking:
            return await self._look()

    async def _look(self) -> set[str]:
        run_id = await self._runner.run(losses.get_run_id())
        lost: set[str] = set()
        if self.run_id is None:
            await self._runner.run(losses.set_marker(run_id))
        elif run_id != self.run_id:
            lost = await self._changed(self.run_id, run_id)
        self.run_id = run_id
        self._seen = dict(self._driver.turns)
        self._told.clear()
        self._told_loss = False
        self._error_said = None
        return lost

    async def _changed(self, old_run_id: str, new_run_id: str) -> set[str]:
        marker = await self._runner.run(losses.get_marker())
        # Written under an earlier run id: the data survived. Missing, or written under the new run id by a
        # peer that found it missing: Redis came back without it.
        empty = marker is None or marker == new_run_id
        candidates = {
            turn_id: handle
            for turn_id, handle in {**self._seen, **self._driver.turns}.items()
            if not handle.state.terminal
        }
        missing: list[str] = []
        if candidates:
            missing = await self._runner.run(losses.find_missing_turns(list(candidates)))
        if not empty and not missing:
            log.info(
                "Redis at %s restarted or failed over (run id %s -> %s) with its data; reading the outcomes "
                "of unanswered calls and sending again the calls no worker has started",
                self._url,
                old_run_id[:12],
                new_run_id[:12],
            )
            await self._driver.catch_up()
            if self._catching_up is not None:
                self._catching_up.cancel()
            self._catching_up = asyncio.create_task(self._catch_up_later())
            return set()
        loss = RedisLoss(
            detected_at=self._clock(),
            old_run_id=old_run_id,
            new_run_id=new_run_id,
            kind="empty" if empty else "partial",
            detected_by=self._orchestrator_id,
        )
        self._tell(loss, missing)
        lost = [candidates[turn_id] for turn_id in missing]
        for handle in lost:
            if not handle.dropped:
                await self._driver.drop(handle, release=False)
        message = build_lost_message(self._url, loss)
        for handle in lost:
            await self._record(handle, message)
        await self._runner.run(losses.note_loss(loss))
        return set(missing)

    async def _catch_up_later(self) -> None:
        waited = 0.0
        for after_s in CATCH_UP_AFTER_S:
            await asyncio.sleep(after_s - waited)
            waited = after_s
            try:
                await self._driver.catch_up()
            except Exception:
                # Redis away again (its retries ended by a stop) or a bug: the next catch-up tries again.
                log.exception("catching up after a Redis restart failed")

    def _tell(self, loss: RedisLoss, missing: Sequence[str]) -> None:
        # One ERROR line per loss; a handling retried after a Redis error tells only turns not told yet.
        new = [turn_id for turn_id in missing if turn_id not in self._told]
        if self._told_loss and not new:
            return
        if not self._told_loss:
            metrics.record_redis_data_loss(loss.kind)
        self._told_loss = True
        self._told.update(new)
        metrics.record_turns_lost(len(new))
        if not missing:
            log.error(
                "DATA LOST: %s; none of the turns lost ran here, but queued turns and the records of "
                "finished ones are gone",
                losses.build_loss_line(loss),
            )
            return
        log.error(
            "DATA LOST: %d turn(s) lost: %s; dropped here and recorded as failed (toolloop show <id>): %s",
            len(new),
            losses.build_loss_line(loss),
            build_id_list(new),
        )

    async def _record(self, handle: TurnHandle, message: str) -> None:
        now = self._clock()
        record = build_lost_record(handle.state, _conversation_of(handle), message, now)
        ttl_s = self._retention.turn_ttl_s
        operation = losses.record_lost(handle.turn_id, record.request, record.outcome, now, ttl_s)
        if await self._runner.run(operation) is not LostResult.RECORDED:
            return
        if keys.is_cluster_layout():
            await self._runner.run_flow(cluster.end(handle.turn_id, now))
        for outcome in record.call_outcomes:
            await self._runner.run_flow(flows.write_outcome(outcome, self._retention))
