"""The turn driver: the turns one orchestrator owns, and the one place their state machines are run.

`machine.start`, `machine.resume` and `machine.step` are called here and nowhere else in the runtime. For
each turn the driver holds a `TurnHandle` (its lock, its state parsed or parked as JSON, its tasks) and:
- adopts it (`adopt`): starts it from its request or resumes its persisted state, then catches up on the
  outcomes written while nobody owned it (see `runtime.adopt`);
- steps it (`_advance`) under its lock: every event at hand through `machine.step`, one save of the state
  and its Emit events, then the commands — timers and `Finish` here, the rest through the `Performer`, whose
  events (at once, or from a task when slow work ends) are stepped in turn;
- keeps it light (`HydratedTurns`): beyond the `hydrated_turns` most recently stepped, a turn keeps its JSON
  only;
- parks it in Redis once it does nothing but wait for people (`machine.parkable`): its lease given up, the
  turn in the parked set until an answer or its earliest wait's deadline queues it again (`store.park`), and
  forgotten here — a waiting turn costs no orchestrator anything;
- drops it: finished, parked, lease lost, or stopping.
Steps of one turn are serialised by its lock; different turns interleave freely. Events come in through
`deliver` / `defer` (inbox notifications, batched on the handle) and the timer heap (`TimerFired`). Redis
failing never abandons a turn: each Redis call of a step is retried (`RedisRetry`) under its lock, its state
kept, until it lands, is refused (lease lost: dropped) or the process stops (released).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from orchestrator import machine, metrics
from orchestrator.agents import build_agent_runs, build_child_report, resolve_agent
from orchestrator.attention import AttentionSender
from orchestrator.errors import UnknownAgentError
from orchestrator.machine.events import (
    ArmTimer,
    AskAttention,
    CancelTimer,
    Command,
    Emit,
    Event,
    Finish,
    TimerFired,
    ToolFinished,
)
from orchestrator.machine.state import AgentRun, TurnState, load_state
from orchestrator.outage import REDIS_ERRORS, RedisOutage, RedisRetry
from orchestrator.runtime.adopt import (
    Adopted,
    SetAside,
    Unrunnable,
    build_fallback_deadline,
    build_overdue_outcome,
    drop_dispatches,
    read_deadline_at,
    read_missed_outcomes,
    refuse_turn_controls,
    resolve_turn_models,
    select_resent,
)
from orchestrator.runtime.handle import HydratedTurns, TurnHandle, forget_task
from orchestrator.runtime.inbox import build_control_event
from orchestrator.runtime.perform import Performer, build_context_budget
from orchestrator.runtime.persist import (
    Ending,
    Persisted,
    build_emits,
    build_ending,
    count_answer,
    persist_step,
)
from orchestrator.runtime.timers import TimerHeap
from orchestrator.settings import Settings
from orchestrator.store.codec import ClaimedTurn
from orchestrator.store.history import Prior
from orchestrator.store.scripts import ParkResult
from orchestrator.store.turns import TurnStore
from workers import keys
from workers.agents import AgentSpec
from workers.contract import ToolOutcome
from workers.records import warn_once

log = logging.getLogger("toolloop.orchestrator")

# How long a notification that moves nothing on may wait for what follows, to be stepped with it (`defer`).
STARTED_DELAY_S = 0.05
# A turn whose earliest wait ends sooner than this is not parked: its timer fires here, where it is armed,
# rather than the turn leaving and being woken again for it (a parked turn is woken WAKE_AHEAD_S early).
PARK_AHEAD_S = 5.0


def _one_line(exc: Exception) -> str:
    # A validation error's lines joined: one log line, one outcome message.
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


class TurnDriver:
    """Drives the turns of one orchestrator: adopt, step, persist, perform, park, drop."""

    def __init__(
        self,
        *,
        store: TurnStore,
        performer: Performer,
        settings: Settings,
        orchestrator_id: str,
        hydrated_turns: int,
        lost_call_grace_s: float,
        lost_call_wait_s: float = 0.0,
        policy: machine.Policy | None = None,
        retry: RedisRetry | None = None,
        attention: AttentionSender | None = None,
    ) -> None:
        self._store = store
        self._retry = retry or RedisRetry(RedisOutage(settings.redis_url))
        self._performer = performer
        self._settings = settings
        self._orchestrator_id = orchestrator_id
        self._lost_grace_s = lost_call_grace_s
        self._lost_wait_s = lost_call_wait_s
        self._policy = policy
        # Told of each call that starts waiting for a person (TOOLLOOP_ATTENTION_TASK); None: nobody is.
        self._attention = attention
        self.turns: dict[str, TurnHandle] = {}
        self._hydrated = HydratedTurns(hydrated_turns)
        self.timers = TimerHeap(self._on_timer)
        # Turns found unrunnable here (another release's records): not taken over again until their hold ends.
        self.set_aside = SetAside()

    # --- what the process calls ------------------------------------------------------------------------

    async def adopt(self, turn_id: str, *, how: str, claimed: ClaimedTurn | None = None) -> None:
        """Load or start a claimed turn, then catch up on what happened while nobody owned it. `claimed`: what
        the claim read with the lease (a new turn's request), not read again. A turn whose records this
        release cannot read is set aside (`runtime.adopt`) and released, or ended if overdue; never raised."""
        adopted: Adopted | Unrunnable | None
        try:
            if claimed is not None and claimed.unreadable is not None:
                adopted = Unrunnable(claimed.unreadable)
            else:
                adopted = await self._retry.call("adopt", lambda: self._load(turn_id, claimed))
        except REDIS_ERRORS as exc:
            log.warning("turn %s: could not load (%s) while stopping; releasing it", turn_id, exc)
            adopted = None
        except Exception as exc:
            # A request another release wrote that this one cannot parse (a ValueError), or a bug met on this
            # turn's records: the same, and the claim and take-over loops go on.
            log.debug("turn %s: adopting failed", turn_id, exc_info=True)
            adopted = Unrunnable(
                ("unreadable: " if isinstance(exc, ValueError) else "failed: ") + _one_line(exc)
            )
        if isinstance(adopted, Unrunnable):
            await self._set_aside(turn_id, adopted)
            return
        if adopted is None:
            await self._release(turn_id)
            return
        handle = adopted.build_handle(turn_id)
        self.turns[turn_id] = handle
        log.info("turn %s %s (%s)", turn_id, how, handle.state.status.value)
        async with handle.lock:
            await self._guarded(handle, self._start(handle, adopted, claimed))
        self._hydrated.stepped(handle)

    async def _set_aside(self, turn_id: str, unrunnable: Unrunnable) -> None:
        # Told once per turn; ended here if overdue (the lease goes with the outcome), else released.
        self.set_aside.add(turn_id)
        if read_deadline_at(unrunnable.stored.text if unrunnable.stored is not None else None) is None:
            unrunnable = await self._find_deadline(turn_id, unrunnable)
        overdue = build_overdue_outcome(turn_id, unrunnable, time.time())
        if overdue is None:
            warn_once(
                log,
                turn_id,
                "turn %s: this orchestrator cannot run it (%s); released, and left to another for %.0f s",
                turn_id,
                unrunnable.problem,
                self.set_aside.hold_s,
            )
            await self._release(turn_id)
            return
        log.warning("turn %s: %s", turn_id, overdue.error.message if overdue.error else "overdue")
        save = functools.partial(
            self._store.save_outcome,
            turn_id,
            overdue,
            conversation_id=unrunnable.conversation_id,
            orchestrator_id=self._orchestrator_id,
        )
        with contextlib.suppress(
            *REDIS_ERRORS
        ):  # only while stopping: the lease expires, and it is tried again
            await self._retry.call("finish", save)

    async def _find_deadline(self, turn_id: str, unrunnable: Unrunnable) -> Unrunnable:
        # No state this release read says a deadline: one the state says all the same (the request was the
        # unreadable record), else its submit time (the first event's) plus its request's deadline_s. Read
        # once per set-aside; a Redis error leaves it for the next.
        try:
            state_text = None if unrunnable.stored is not None else await self._store.load_state(turn_id)
            deadline_at = read_deadline_at(state_text)
            if deadline_at is None:
                first = await self._store.read_events(turn_id, count=1)
                request_text = await self._store.load_request_text(turn_id)
                deadline_at = build_fallback_deadline(first[0].at if first else None, request_text)
        except REDIS_ERRORS:
            return unrunnable
        return dataclasses.replace(unrunnable, fallback_deadline_at=deadline_at)

    def deliver(self, handle: TurnHandle, events: list[Event], *, read_control: bool = False) -> None:
        """Step `events` (and, with `read_control`, the new control requests) in a task of the turn."""
        if handle.queue(events, read_control=read_control):
            self._spawn(handle, self._feed_deferred(handle))

    def defer(self, handle: TurnHandle, events: list[Event]) -> None:
        """Hold back notifications that move nothing on (STARTED_DELAY_S), to be stepped with what follows."""
        if handle.hold(events):
            asyncio.get_running_loop().call_later(STARTED_DELAY_S, self._flush_deferred, handle)

    async def drop(self, handle: TurnHandle, *, release: bool) -> None:
        """Forget a turn once its step in progress ends (lease lost, or stopping); `release` its lease."""
        async with handle.lock:
            await self._drop(handle, release=release)

    def lose(self, handle: TurnHandle) -> None:
        """The turn's lease is lost: drop it, in a task of its own, once its step in progress ends (a step
        retrying its save holds the lock until refused: the lease loop must not wait for that)."""
        self._spawn(handle, self.drop(handle, release=False))

    async def catch_up(self) -> None:
        """Redis restarted or failed over, maybe without its last acknowledged writes, and writers may reach
        the old master a moment longer: each turn reads the outcomes of its unanswered calls (their notices
        may be lost) and sends again what `select_resent` keeps of `machine.resume`'s commands."""
        for handle in list(self.turns.values()):
            async with handle.lock:
                if not handle.dropped and not handle.state.terminal:
                    read = functools.partial(read_missed_outcomes, self._store, handle.state)
                    missed = await self._retry.call("catch-up", read)
                    _, commands = machine.resume(handle.state, at=time.time())
                    await self._advance(handle, missed, select_resent(commands, missed))

    async def drop_all(self) -> None:
        """Drop and release every turn (stopping): each state was persisted by the step that made it."""
        for handle in list(self.turns.values()):
            await self.drop(handle, release=True)

    # --- adopting --------------------------------------------------------------------------------------

    async def _start(self, handle: TurnHandle, adopted: Adopted, claimed: ClaimedTurn | None) -> None:
        if adopted.state.terminal:
            # The previous owner died between persisting the end and storing the outcome: the commands are
            # its Finish, performed without saving the state again (the turn is over).
            await self._perform(handle, adopted.state, adopted.commands)
            return
        commands: Sequence[Command] = adopted.commands
        missed: list[ToolFinished] = []
        if adopted.resumed:
            # A call `machine.resume` sends again whose outcome is already stored is left out: its worker
            # would only skip the delivery, and the outcome read here answers it.
            read = functools.partial(read_missed_outcomes, self._store, adopted.state)
            missed = await self._retry.call("adopt", read)
            commands = drop_dispatches(commands, {e.outcome.call_id for e in missed})
        # The state is saved (with the events of `machine.start` or `resume`) before any command runs: a
        # resumed turn's commands re-arm its timers and repeat what died with its last owner; the outcomes
        # written meanwhile are stepped after them.
        await self._advance(handle, (), commands, save=True)
        if missed and not handle.dropped:
            await self._advance(handle, missed)
        if not handle.dropped:
            # Read only now that the turn is registered: a request sent since is notified to this process.
            await self._read_control(handle)

    async def _load(self, turn_id: str, claimed: ClaimedTurn | None) -> Adopted | Unrunnable:
        """The turn's persisted state resumed, or a new one started from its request; `Unrunnable` for
        neither, or for a state this release cannot read (a `ValueError` for a request it cannot read)."""
        if claimed is not None and not claimed.has_state:
            stored, request = None, claimed.request
        else:
            stored, request = await self._store.load_state_and_request(turn_id)
        conversation_id = request.conversation_id if request is not None else None
        if stored is not None:
            try:
                loaded = load_state(stored.text, stored.history, stored.log)
            except ValueError as exc:  # a newer (or older) version, or values this release does not know
                problem = f"its state ({keys.turn_state(turn_id)}) cannot be read: {_one_line(exc)}"
                return Unrunnable(problem, stored, conversation_id)
            state, commands = machine.resume(loaded, at=time.time())
            return Adopted(state, commands, True, conversation_id, stored.history, stored.log)
        if request is None:
            return Unrunnable("it has neither a state nor a request: nothing to run")
        prior = await self._store.conversation_history(conversation_id) if conversation_id else Prior([], [])
        agents: dict[str, AgentSpec] = {}
        refused: list[str] = []
        if request.agent is not None:
            agents = await self._performer.read_agents()
            try:
                request = resolve_agent(request, agents)
            except UnknownAgentError as exc:
                refused.append(str(exc))
        tool_names = None if request.tools is None else [t for t in request.tools if t not in agents]
        catalogue = await self._performer.read_catalogue(tool_names)
        models = resolve_turn_models(request.model, self._settings)
        runs: dict[str, AgentRun] = {}
        if request.agent is not None and not refused:
            resolve = functools.partial(resolve_turn_models, settings=self._settings)
            runs = build_agent_runs(request, agents, catalogue, models, resolve)
        state, commands = machine.start(
            turn_id,
            request,
            model=models,
            catalogue=catalogue,
            at=time.time(),
            lost_grace_s=self._lost_grace_s,
            lost_wait_s=self._lost_wait_s,
            prior_history=prior.messages,
            context_budget=build_context_budget(models, self._settings, self._performer.learned_windows),
            unpriced=self._performer.unpriced(models) if request.limits.max_cost_usd is not None else (),
            refused=[*refused, *refuse_turn_controls(request, models)],
            agents=runs,
            max_agent_depth=self._settings.max_agent_depth,
        )
        return Adopted(state, commands, False, conversation_id, prior.entries)

    # --- stepping --------------------------------------------------------------------------------------

    async def _feed(self, handle: TurnHandle, events: Sequence[Event]) -> None:
        async with handle.lock:
            await self._advance(handle, events)
        self._hydrated.stepped(handle)

    async def _feed_deferred(self, handle: TurnHandle) -> None:
        async with handle.lock:
            # From here on, what is delivered waits for the next step: this one takes what is deferred now.
            read_control = handle.take_feeding()
            await self._advance(handle, ())
            if read_control and not handle.dropped:
                await self._read_control(handle)
        self._hydrated.stepped(handle)

    async def _read_control(self, handle: TurnHandle) -> None:
        read = functools.partial(self._store.read_control, handle.turn_id, handle.control_after)
        requests = await self._retry.call("steps", read)
        if not requests:
            return
        handle.control_after = requests[-1].id
        events = [e for e in (build_control_event(r) for r in requests) if e is not None]
        await self._advance(handle, events)

    async def _advance(
        self,
        handle: TurnHandle,
        events: Sequence[Event],
        commands: Sequence[Command] = (),
        *,
        save: bool = False,
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
                state, produced = machine.step(previous, event, policy=self._policy)
                todo += produced
                if isinstance(event, ToolFinished):
                    answered.append((previous, state, event))
            emits = build_emits(pending, todo)
            finished = [e.outcome for e in pending if isinstance(e, ToolFinished)]
            # An unchanged state without events is already saved: nothing to write.
            changed = save or emits or state is not before
            persisted = Persisted.SAVED
            if changed:
                ending = build_ending(handle, state, todo)
                persisted = await self._persist(handle, (before, state), emits, finished, ending)
                if persisted is Persisted.REFUSED:
                    return
            save = False
            for previous, after, event in answered:
                count_answer(previous, after, event)
            commands = [c for c in todo if not isinstance(c, Emit)]
            pending = await self._perform(
                handle, state, commands, finish_stored=persisted is Persisted.FINISHED
            )
            todo = []
            if not pending:
                look_at = machine.parkable(state)
                if look_at is not None and not handle.dropped:
                    await self._park(handle, look_at)
                return

    async def _persist(
        self,
        handle: TurnHandle,
        steps: tuple[TurnState, TurnState],
        emits: Sequence[tuple[str, Mapping[str, Any]]],
        finished: Sequence[ToolOutcome] = (),
        ending: Ending | None = None,
    ) -> Persisted:
        # `steps`: the state last saved and the one to save; `finished`: the outcomes stepped in between;
        # `ending`: the outcome stored with the step, when it is the turn's last.
        persisted = await persist_step(
            self._store,
            self._retry,
            handle,
            steps=steps,
            emits=emits,
            finished=finished,
            orchestrator_id=self._orchestrator_id,
            ending=ending,
        )
        if persisted is Persisted.REFUSED:
            # Terminal already, or another orchestrator holds the lease now: this copy is stale.
            log.warning("turn %s: state not saved (lease lost or turn ended); dropping it", handle.turn_id)
            await self._drop(handle, release=False)
        return persisted

    async def _perform(
        self,
        handle: TurnHandle,
        state: TurnState,
        commands: Sequence[Command],
        *,
        finish_stored: bool = False,
    ) -> list[Event]:
        """Perform `commands` in order; the events they produce at once, to step next. `finish_stored`: the
        step's save stored the outcome of its `Finish` already (`build_ending`)."""
        follow_ups: list[Event] = []
        finishing = False
        for command in commands:
            if isinstance(command, ArmTimer):
                self.timers.arm(handle.turn_id, command.timer_id, command.at)
            elif isinstance(command, CancelTimer):
                self.timers.cancel(handle.turn_id, command.timer_id)
            elif isinstance(command, AskAttention):
                if self._attention is not None:
                    self._attention.ask(handle.turn_id, command)
            elif isinstance(command, Finish) and finish_stored:
                finishing = True
            elif isinstance(command, Finish):
                if state.parent is not None:
                    # Told before the outcome is stored: a crash in between ends the turn again after a
                    # takeover, and the parent keeps the first report (a second changes nothing).
                    report = functools.partial(
                        self._store.report_to_parent, state.parent, build_child_report(command.outcome)
                    )
                    await self._retry.call("finish", report)
                # Retried until stored: a second try after a lost reply finds the turn terminal (False).
                save = functools.partial(
                    self._store.save_outcome,
                    handle.turn_id,
                    command.outcome,
                    conversation_id=handle.conversation_id,
                    orchestrator_id=self._orchestrator_id,
                    tenant=state.tenant,
                )
                await self._retry.call("finish", save)
                finishing = True
            else:
                done = await self._performer.perform(handle.turn_id, state, command)
                if isinstance(done, list):
                    follow_ups += done
                else:
                    self._spawn(handle, done)
        if finishing:
            # After the whole list: the machine may put revocations after its Finish.
            await self._finished(handle)
        return follow_ups

    def _spawn(self, handle: TurnHandle, work: Coroutine[Any, Any, Sequence[Event] | None]) -> None:
        task = asyncio.create_task(self._guarded(handle, work))
        if handle.tasks is None:
            handle.tasks = set()
        handle.tasks.add(task)
        task.add_done_callback(lambda done: forget_task(handle, done))
        # A task cancelled before its first step (the turn dropped meanwhile) never started `work`: closed
        # here, it goes without a "never awaited" warning; a finished one is closed already.
        task.add_done_callback(lambda _done: work.close())

    async def _guarded(self, handle: TurnHandle, work: Coroutine[Any, Any, Sequence[Event] | None]) -> None:
        # One task of a turn: a step, or slow work whose events are stepped when it ends.
        try:
            events = await work
            if events:
                await self._feed(handle, events)
        except asyncio.CancelledError:
            raise
        except REDIS_ERRORS as exc:  # only while stopping: until then, a step retries its Redis calls
            log.warning(
                "turn %s: Redis error (%s); the turn resumes from its last state", handle.turn_id, exc
            )
            if not handle.dropped:
                # Give the turn up so that it is taken over and resumed from what was persisted.
                await self._drop(handle, release=True)
        except Exception:
            log.exception("turn %s: unexpected error", handle.turn_id)

    def _on_timer(self, turn_id: str, timer_id: str) -> None:
        handle = self.turns.get(turn_id)
        if handle is not None:
            self.deliver(handle, [TimerFired(timer_id=timer_id, at=time.time())])

    def _flush_deferred(self, handle: TurnHandle) -> None:
        if handle.deferred and not handle.dropped:
            self.deliver(handle, [])

    # --- parking and dropping --------------------------------------------------------------------------

    async def _park(self, handle: TurnHandle, look_at: float) -> None:
        """Give up a turn that does nothing but wait for people: parked in Redis until an answer or `look_at`
        (its earliest wait's deadline) queues it for any orchestrator. Its state is saved; a turn with work in
        hand (events held back, a task still running) stays until that work steps it again. A control request
        this process has not read yet keeps it here: read now (its notice may be on its way too)."""
        current = asyncio.current_task()
        if handle.deferred or handle.feeding is not None or any(t is not current for t in handle.tasks or ()):
            return
        if look_at - time.time() < PARK_AHEAD_S:
            return
        park = functools.partial(
            self._store.park, self._orchestrator_id, handle.turn_id, look_at, handle.control_after
        )
        result = await self._retry.call("park", park)
        if result is ParkResult.PARKED:
            log.info(
                "turn %s parked: it waits for a person (looked at again by %.0f)", handle.turn_id, look_at
            )
            await self._drop(handle, release=False, parked=True)
        elif result is ParkResult.UNREAD:
            await self._read_control(handle)
        else:
            log.warning("turn %s: lease lost while parking it; dropping it", handle.turn_id)
            await self._drop(handle, release=False)

    async def _finished(self, handle: TurnHandle) -> None:
        # The turn's outcome is stored (Finish), and its lease released with it: count it, forget the turn.
        outcome = handle.state.outcome
        if outcome is not None:
            metrics.record_turn_finished(outcome, time.monotonic() - handle.claimed_at)
        await self._drop(handle, release=False)

    async def _drop(self, handle: TurnHandle, *, release: bool, parked: bool = False) -> None:
        """Forget a turn locally (finished, parked, lost, or stopping); the caller holds its lock. `parked`:
        its lease went with the parking (for those who tell why a turn left)."""
        if handle.dropped:
            return
        handle.dropped = True
        self.turns.pop(handle.turn_id, None)
        self.timers.cancel_turn(handle.turn_id)
        current = asyncio.current_task()
        self._hydrated.forget(handle.turn_id)
        for task in list(handle.tasks or ()):
            if task is not current:
                task.cancel()
        if release:
            await self._release(handle.turn_id)

    async def _release(self, turn_id: str) -> None:
        # Best effort: a lease not released expires, and its turn is taken over as after a crash.
        with contextlib.suppress(*REDIS_ERRORS):
            await self._store.release(self._orchestrator_id, turn_id)
