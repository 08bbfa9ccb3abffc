"""The orchestrator process: drives many turns at once in one asyncio event loop (SPEC §5, §7.2).

The state machine decides; this module only performs what it decides and feeds back what happened:

    claim / take over a turn ──► load or start its state ──► machine.step(state, event…) ──► commands
          ▲                                                        │
          │      save the state and its Emit events (one script) ◄┘ then execute each command:
          │   CallModel → a task: ModelClient.complete → ModelResponded / ModelFailed
          │   DispatchTools → publish through Celery off the loop (one publishing thread)
          │   WriteOutcomes → first-writer-wins write → ToolFinished(the winner)
          │   ArmTimer / CancelTimer → the one timer heap → TimerFired
          │   Revoke → Celery revoke off the loop; Finish → outcome, lease released
          │
    one blocking read of the inbox stream for all turns: outcome / started / control notifications

Steps of one turn are serialised by a per-turn lock; different turns interleave freely. The events at hand
for a turn are stepped together and saved in one round trip (`_advance`). No task or thread exists per parked
turn: a turn waiting for a tool or a person is a handle with its state (as JSON beyond the most recently used
`hydrated_turns`), a lock and heap entries. Outcomes never come through `AsyncResult.get`: a small one comes
in its notification, a large one is read from its key, and every pending call's is read once more whenever
a turn is claimed or taken over (an outcome written while nobody owned the turn notified nobody).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import redis.exceptions
from celery import Celery

from orchestrator import metrics
from orchestrator.errors import StateVersionError
from orchestrator.machine.events import Command, Emit, Event, TimerFired, ToolFinished
from orchestrator.machine.state import TurnState, dump_state, find_call
from orchestrator.model import TurnStatus
from orchestrator.runtime.adopt import TurnFactory
from orchestrator.runtime.handle import TurnHandle, forget_task
from orchestrator.runtime.inbox import build_control_event, parse_inbox, parse_payloads, to_local_outcome
from orchestrator.runtime.perform import CommandExecutor
from orchestrator.runtime.publish import get_producer_app
from orchestrator.runtime.timers import TimerHeap
from orchestrator.settings import Settings
from orchestrator.store.catalogue import aread_catalogue
from orchestrator.store.turns import TurnStore

log = logging.getLogger("toolloop.orchestrator")

# How long one blocking Redis read waits: bounds how fast a stopping orchestrator notices.
BLOCK_S = 1.0
# Pause after a Redis error before a loop tries again (Redis briefly unavailable must not kill the process).
REDIS_RETRY_S = 0.5
# How long a call's `started` notification may wait for its outcome, to be stepped with it (see _defer).
STARTED_DELAY_S = 0.05
# How often the inbox stream is trimmed up to what was handled.
INBOX_ACK_S = 1.0
REDIS_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


def build_orchestrator_id() -> str:
    """A unique, readable id: host, pid and a random suffix (a restarted process never reuses one)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass
class RuntimeOptions:
    """Tuning of one orchestrator process; the defaults come from `Settings`."""

    lease_ttl_s: float = 15.0
    max_turns: int = 10_000
    orphan_scan_s: float = 5.0
    lost_call_grace_s: float = 5.0
    # How many idle turns keep their parsed state; the others are parked as their JSON (see TurnHandle).
    hydrated_turns: int = 1024

    @classmethod
    def from_settings(cls, settings: Settings) -> RuntimeOptions:
        """Options as configured through `TOOLLOOP_*` variables."""
        return cls(
            lease_ttl_s=settings.lease_ttl_s,
            max_turns=settings.orchestrator_max_turns,
            # Scanning a few times per lease period bounds how long an orphan waits.
            orphan_scan_s=max(0.5, settings.lease_ttl_s / 3),
            lost_call_grace_s=settings.lost_call_grace_s,
        )


class Runtime:
    """One orchestrator: `await run()` until `request_stop()` (or SIGTERM/SIGINT with `install_signals`)."""

    def __init__(
        self,
        *,
        store: TurnStore,
        celery_app: Celery,
        http: httpx.AsyncClient,
        settings: Settings,
        options: RuntimeOptions | None = None,
        orchestrator_id: str | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.options = options or RuntimeOptions.from_settings(settings)
        self.orchestrator_id = orchestrator_id or build_orchestrator_id()
        self.turns: dict[str, TurnHandle] = {}
        # Turns holding a parsed state, least recently stepped first.
        self._hydrated: OrderedDict[str, TurnHandle] = OrderedDict()
        self.timers = TimerHeap(self._on_timer)
        self._stopping = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        self._factory = TurnFactory(
            store=store,
            settings=settings,
            read_catalogue=lambda: aread_catalogue(store.redis),
            lost_grace_s=self.options.lost_call_grace_s,
            clock=time.time,
        )
        self._exec = CommandExecutor(
            store=store,
            celery_app=celery_app,
            http=http,
            settings=settings,
            timers=self.timers,
            spawn=self._spawn,
            feed=self.feed,
            finish=self._finished,
        )

    # --- lifecycle -------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming, persist and release every turn, and return from `run()`."""
        self._stopping.set()

    def install_signals(self) -> None:
        """SIGTERM and SIGINT stop the process gracefully (call from inside the running loop)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)

    async def run(self) -> None:
        """Serve until stopped: claim, take over, read the inbox, renew leases, fire timers."""
        await self._retrying(lambda: self.store.register_orchestrator(self.orchestrator_id))
        log.info("orchestrator %s started", self.orchestrator_id)
        loops = [
            asyncio.create_task(self._claim_loop(), name="claim"),
            asyncio.create_task(self._inbox_loop(), name="inbox"),
            asyncio.create_task(self._lease_loop(), name="leases"),
            asyncio.create_task(self._orphan_loop(), name="orphans"),
            asyncio.create_task(self.timers.run(), name="timers"),
        ]
        try:
            stop = asyncio.create_task(self._stopping.wait())
            done, _ = await asyncio.wait([stop, *loops], return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stop}:
                task.result()  # a loop that ended on its own is a bug: surface it
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            await self._shutdown()

    async def _shutdown(self) -> None:
        # Every step persists its state before acting, so stopping is: wait for steps in progress, drop the
        # in-flight work (the next owner redoes or re-reads it), release the leases.
        for handle in list(self.turns.values()):
            async with handle.lock:
                await self._drop(handle, release=True)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._exec.aclose()
        with contextlib.suppress(*REDIS_ERRORS):
            await self.store.unregister(self.orchestrator_id)
        log.info("orchestrator %s stopped", self.orchestrator_id)

    # --- the loops -------------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        while not self._stopping.is_set():
            if len(self.turns) >= self.options.max_turns:
                await asyncio.sleep(BLOCK_S)
                continue
            try:
                turn_id = await self.store.claim(
                    self.orchestrator_id, timeout_s=BLOCK_S, lease_ttl_s=self.options.lease_ttl_s
                )
            except REDIS_ERRORS as exc:
                log.warning("claim failed: %s", exc)
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            if turn_id is not None:
                await self._adopt(turn_id, how="claimed")

    async def _orphan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.orphan_scan_s)
            try:
                orphans = await self.store.find_orphans()
                for turn_id in orphans:
                    if self._stopping.is_set() or len(self.turns) >= self.options.max_turns:
                        break
                    if turn_id not in self.turns and await self.store.take_over(
                        self.orchestrator_id, turn_id, self.options.lease_ttl_s
                    ):
                        await self._adopt(turn_id, how="taken_over")
            except REDIS_ERRORS as exc:
                log.warning("orphan scan failed: %s", exc)

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.lease_ttl_s / 3)
            try:
                await self.store.heartbeat(self.orchestrator_id)
                lost = await self.store.renew_leases(
                    self.orchestrator_id, list(self.turns), self.options.lease_ttl_s
                )
            except REDIS_ERRORS as exc:
                log.warning("lease renewal failed: %s", exc)
                continue
            for turn_id in lost:
                handle = self.turns.get(turn_id)
                if handle is not None:
                    log.warning("lease of %s lost: dropping the turn", turn_id)
                    async with handle.lock:
                        await self._drop(handle, release=False)

    async def _inbox_loop(self) -> None:
        after = "0"
        acked = "0"
        acked_at = time.monotonic()
        while True:
            try:
                entries = await self.store.read_inbox(
                    self.orchestrator_id, after, block_ms=int(BLOCK_S * 1000)
                )
                if entries:
                    await self._handle_inbox(entries)
                    after = entries[-1][0]
                # Trimming only bounds the stream's memory (entries are read by id, never twice): once per
                # INBOX_ACK_S, or when idle, instead of a round trip between every two reads.
                if after != acked and (not entries or time.monotonic() - acked_at >= INBOX_ACK_S):
                    await self.store.ack_inbox(self.orchestrator_id, after)
                    acked, acked_at = after, time.monotonic()
            except REDIS_ERRORS as exc:
                log.warning("inbox read failed: %s", exc)
                await asyncio.sleep(REDIS_RETRY_S)

    async def _handle_inbox(self, entries: list[tuple[str, dict[str, str]]]) -> None:
        batch = parse_inbox(entries)
        outcomes = parse_payloads(batch.payloads)
        missing = [
            c for t, calls in batch.outcomes.items() if t in self.turns for c in calls if c not in outcomes
        ]
        if missing:
            outcomes.update(await self.store.read_outcomes(missing))
        now = time.time()
        for turn_id in batch.turns:
            handle = self.turns.get(turn_id)
            if handle is None:
                continue  # not ours (any more): its new owner re-reads outcomes on take-over
            started: list[Event] = list(batch.started.get(turn_id, []))
            finished: list[Event] = [
                ToolFinished(outcome=to_local_outcome(outcomes[c]), at=now)
                for c in batch.outcomes.get(turn_id, [])
                if c in outcomes
            ]
            control = turn_id in batch.control
            if finished or control:
                self._spawn_feed(handle, started + finished, read_control=control)
            elif started:
                self._defer(handle, started)

    def _defer(self, handle: TurnHandle, events: list[Event]) -> None:
        # A `started` notification only arms a lost-work timer (hard limit + grace away) and tells
        # observers; the call's outcome usually follows within milliseconds. Held back for STARTED_DELAY_S,
        # the two are stepped and saved together, and the outcome never waits behind the started step.
        if handle.deferred is None:
            handle.deferred = []
            asyncio.get_running_loop().call_later(STARTED_DELAY_S, self._flush_deferred, handle)
        handle.deferred += events

    def _flush_deferred(self, handle: TurnHandle) -> None:
        if handle.deferred and not handle.dropped:
            self._spawn_feed(handle, [])

    # --- turns -----------------------------------------------------------------------------------------

    async def _adopt(self, turn_id: str, *, how: str) -> None:
        """Load or start a claimed turn, then catch up on what happened while nobody owned it."""
        try:
            adopted = await self._factory.adopt(turn_id)
        except StateVersionError as exc:
            # A newer (or older) orchestrator wrote this state: leave the turn to one that reads it.
            log.error("turn %s: %s; releasing it", turn_id, exc)
            await self.store.release(self.orchestrator_id, turn_id)
            return
        except REDIS_ERRORS as exc:
            log.warning("turn %s: could not load (%s); releasing it", turn_id, exc)
            with contextlib.suppress(*REDIS_ERRORS):
                await self.store.release(self.orchestrator_id, turn_id)
            return
        if adopted is None:
            await self.store.release(self.orchestrator_id, turn_id)
            return
        handle = TurnHandle(turn_id, adopted.state, conversation_id=adopted.conversation_id)
        self.turns[turn_id] = handle
        log.info("turn %s %s (%s)", turn_id, how, handle.state.status.value)
        async with handle.lock:
            if adopted.state.terminal:
                # The previous owner died between persisting the end and storing the outcome: the commands
                # are its Finish, performed without saving the state again (the turn is over).
                await self._exec.execute(handle, adopted.commands)
                return
            commands, catch_up = await self._factory.catch_up(adopted)
            # The state is saved (with the events of `machine.start` or `resume`) before any command runs: a
            # resumed turn's commands re-arm its timers and repeat what died with its last owner; the
            # outcomes written meanwhile are stepped after them.
            await self._advance(handle, [], commands, save=True)
            if catch_up and not handle.dropped:
                await self._advance(handle, catch_up)
            if not handle.dropped:
                await self._read_control(handle)
        self._stepped(handle)

    async def feed(self, handle: TurnHandle, events: Iterable[Event]) -> None:
        """Step a turn through `events`, in order, under its lock (and every event the steps lead to)."""
        async with handle.lock:
            await self._advance(handle, list(events))
        self._stepped(handle)

    def _spawn_feed(self, handle: TurnHandle, events: list[Event], *, read_control: bool = False) -> None:
        async def run() -> None:
            async with handle.lock:
                await self._advance(handle, events)
                if read_control and not handle.dropped:
                    await self._read_control(handle)
            self._stepped(handle)

        self._spawn(run(), handle)

    def _stepped(self, handle: TurnHandle) -> None:
        """Mark a turn as just used; park the least recently used ones beyond `hydrated_turns`."""
        if handle.dropped or not handle.hydrated:
            return
        self._hydrated[handle.turn_id] = handle
        self._hydrated.move_to_end(handle.turn_id)
        while len(self._hydrated) > self.options.hydrated_turns:
            _, oldest = self._hydrated.popitem(last=False)
            if not oldest.park() and not oldest.dropped:
                # Busy (a step, a model call or a publish in progress): it comes back when its step ends.
                self._hydrated[oldest.turn_id] = oldest
                break

    async def _read_control(self, handle: TurnHandle) -> None:
        requests = await self.store.read_control(handle.turn_id, handle.control_after)
        if not requests:
            return
        handle.control_after = requests[-1].id
        events = [e for e in (build_control_event(r) for r in requests) if e is not None]
        await self._advance(handle, list(events))

    async def _advance(
        self, handle: TurnHandle, events: list[Event], commands: Sequence[Command] = (), *, save: bool = False
    ) -> None:
        """Step `events`, persist the state once, perform the commands; again with the events they yield.

        Holding the turn's lock. All events at hand are stepped before one save (state and emitted events in
        one round trip): a call's `started` and `outcome` that arrive together cost one write, not four.
        Nothing is performed before the state that asked for it is saved, so a crash loses no decision it
        acted on. Writing a synthetic outcome yields the winner as a new event, stepped in the next round
        here rather than re-entering the lock.
        """
        pending = events
        if handle.deferred:
            # Held-back notifications come first: they happened before anything that arrived since.
            pending = [*handle.deferred, *events]
        handle.deferred = None
        todo = list(commands)
        while not handle.dropped:
            before = state = handle.state
            answered: list[tuple[TurnState, TurnState, ToolFinished]] = []
            for event in pending:
                previous = state
                state, produced = self._factory.step(previous, event)
                todo += produced
                if isinstance(event, ToolFinished):
                    answered.append((previous, state, event))
            emits = [(c.event_name, c.data) for c in todo if isinstance(c, Emit)]
            # An unchanged state without events is already saved: nothing to write.
            if (save or emits or state is not before) and not await self._persist(handle, state, emits):
                return
            save = False
            for previous, after, event in answered:
                _record_answer(previous, after, event)
            pending = await self._exec.execute(handle, [c for c in todo if not isinstance(c, Emit)])
            todo = []
            if not pending:
                return

    async def _persist(
        self, handle: TurnHandle, state: TurnState, emits: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> bool:
        # The terminal status is written by `save_outcome` (Finish), atomically with the outcome; a terminal
        # state saved before it keeps a live status, and a resumed terminal state finishes on adoption.
        status = TurnStatus.RUNNING if state.terminal else state.status
        state_json = dump_state(state)
        saved = await self.store.save_step(
            handle.turn_id, state_json, status, emits, orchestrator_id=self.orchestrator_id
        )
        if not saved:
            # Terminal already, or another orchestrator holds the lease now: this copy is stale.
            log.warning("turn %s: state not saved (lease lost or turn ended); dropping it", handle.turn_id)
            await self._drop(handle, release=False)
            return False
        handle.set_state(state, state_json)
        return True

    async def _finished(self, handle: TurnHandle) -> None:
        """Called by the executor once a turn's outcome is stored."""
        outcome = handle.state.outcome
        if outcome is not None:
            metrics.record_turn_finished(outcome, time.monotonic() - handle.claimed_at)
        await self._drop(handle, release=True)

    async def _drop(self, handle: TurnHandle, *, release: bool) -> None:
        """Forget a turn locally (finished, lost, or stopping); the caller holds its lock."""
        if handle.dropped:
            return
        handle.dropped = True
        self.turns.pop(handle.turn_id, None)
        self.timers.cancel_turn(handle.turn_id)
        current = asyncio.current_task()
        self._hydrated.pop(handle.turn_id, None)
        for task in list(handle.tasks or ()):
            if task is not current:
                task.cancel()
        if release:
            with contextlib.suppress(*REDIS_ERRORS):
                await self.store.release(self.orchestrator_id, handle.turn_id)

    # --- plumbing --------------------------------------------------------------------------------------

    def _on_timer(self, turn_id: str, timer_id: str) -> None:
        handle = self.turns.get(turn_id)
        if handle is not None:
            self._spawn_feed(handle, [TimerFired(timer_id=timer_id, at=time.time())])

    def _spawn(self, coro: Awaitable[None], handle: TurnHandle | None = None) -> None:
        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except REDIS_ERRORS as exc:
                log.warning("turn %s: Redis error (%s); the turn resumes from its last state", turn_id, exc)
                if handle is not None and not handle.dropped:
                    # Give the turn up so that it is taken over and resumed from what was persisted.
                    await self._drop(handle, release=True)
            except Exception:
                log.exception("turn %s: unexpected error", turn_id)

        turn_id = handle.turn_id if handle else "-"
        task = asyncio.create_task(guarded())
        if handle is None:
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            return
        if handle.tasks is None:
            handle.tasks = set()
        handle.tasks.add(task)
        task.add_done_callback(lambda done: forget_task(handle, done))

    async def _retrying(self, action: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await action()
                return
            except REDIS_ERRORS as exc:
                log.warning("Redis unavailable (%s); retrying", exc)
                await asyncio.sleep(REDIS_RETRY_S)


def _record_answer(before: TurnState, after: TurnState, event: ToolFinished) -> None:
    # Count an outcome once, when it became its call's answer; a duplicate or late one is only audited.
    call = find_call(before, event.outcome.call_id)
    if call is not None and call.outcome is None and len(after.late_outcomes) == len(before.late_outcomes):
        metrics.record_tool_outcome(event.outcome)


async def serve(settings: Settings, *, orchestrator_id: str | None = None) -> None:
    """Run one orchestrator process until SIGTERM/SIGINT: the body of `toolloop orchestrator`."""
    store = TurnStore.from_url(
        settings.redis_url, ssl_cert_reqs=settings.redis_ssl_cert_reqs, lease_ttl_s=settings.lease_ttl_s
    )
    celery_app = get_producer_app(settings)
    # One HTTP client (one connection pool) for every model call of every turn.
    async with httpx.AsyncClient() as http:
        runtime = Runtime(
            store=store, celery_app=celery_app, http=http, settings=settings, orchestrator_id=orchestrator_id
        )
        runtime.install_signals()
        try:
            await runtime.run()
        finally:
            await store.aclose()
