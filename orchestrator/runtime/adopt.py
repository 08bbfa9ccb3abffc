"""Bringing a turn into an orchestrator: start it from its request, or resume it from its persisted state.

Resuming is where durability is earned. The previous owner may have died at any point after a persisted
step. `machine.resume` says what the new owner must (re)issue from the state alone — timers, outcome writes
that were asked for, the model call in flight (the same call again, not a retry), approvals still awaited,
dispatches whose start was never recorded (the same task again: maybe never published) — and `catch_up`
reads what happened while nobody owned the turn: outcomes written to Redis, whose notifications went to
nobody (their calls need no dispatch again).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from orchestrator import machine
from orchestrator.machine.events import Command, DispatchTools, Event, ToolFinished
from orchestrator.machine.state import TurnState, load_state
from orchestrator.providers.base import resolve_model
from orchestrator.runtime.inbox import build_wire_call_id, to_local_outcome
from orchestrator.settings import Settings
from orchestrator.store.turns import TurnStore
from workers.contract import ToolSpec

log = logging.getLogger("toolloop.orchestrator")

CatalogueReader = Callable[[], Awaitable[Mapping[str, ToolSpec]]]


@dataclass(frozen=True)
class Adopted:
    """A turn ready to drive: its state and the commands still to perform for it."""

    state: TurnState
    commands: list[Command]
    resumed: bool
    # The turn's conversation (None: none), so that finishing it need not read its request again.
    conversation_id: str | None = None


class TurnFactory:
    """Starts and resumes turns for one orchestrator; `step` is the one place the machine is stepped."""

    def __init__(
        self,
        *,
        store: TurnStore,
        settings: Settings,
        read_catalogue: CatalogueReader,
        lost_grace_s: float,
        clock: Callable[[], float],
        policy: machine.Policy | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._read_catalogue = read_catalogue
        self._lost_grace_s = lost_grace_s
        self._clock = clock
        self._policy = policy

    def step(self, state: TurnState, event: Event) -> tuple[TurnState, list[Command]]:
        """One machine step, with this orchestrator's stop-policy hook."""
        return machine.step(state, event, policy=self._policy)

    async def adopt(self, turn_id: str) -> Adopted | None:
        """The turn's persisted state, or a new one started from its request; None for an unknown turn."""
        raw, request = await self._store.load_state_and_request(turn_id)
        conversation_id = request.conversation_id if request is not None else None
        if raw is not None:
            state, commands = machine.resume(load_state(raw), at=self._clock())
            return Adopted(state, commands, resumed=True, conversation_id=conversation_id)
        if request is None:
            log.error("turn %s has no request: nothing to run", turn_id)
            return None
        prior = []
        if request.conversation_id:
            prior = await self._store.conversation_history(request.conversation_id)
        catalogue = await self._read_catalogue()
        state, commands = machine.start(
            turn_id,
            request,
            model=self._resolve_model(request.model),
            catalogue=catalogue,
            at=self._clock(),
            lost_grace_s=self._lost_grace_s,
            prior_history=prior,
        )
        return Adopted(state, commands, resumed=False, conversation_id=conversation_id)

    async def catch_up(self, adopted: Adopted) -> tuple[list[Command], list[Event]]:
        """The commands of an adopted turn to perform now, and the outcomes it missed, to step after them.

        A call `machine.resume` sends again whose outcome is already stored is left out: its worker would
        only skip the delivery, and the outcome read here answers it.
        """
        if not adopted.resumed:
            return adopted.commands, []
        events = await self.catch_up_events(adopted.state)
        answered = {e.outcome.call_id for e in events if isinstance(e, ToolFinished)}
        return drop_dispatches(adopted.commands, answered), events

    async def catch_up_events(self, state: TurnState) -> list[Event]:
        """Events a resumed turn missed: the stored outcomes of its calls still unanswered."""
        if state.terminal or state.current is None:
            return []
        pending = [
            build_wire_call_id(state.turn_id, c.call_id) for c in state.current.calls if not c.finished
        ]
        outcomes = await self._store.read_outcomes(pending)
        now = self._clock()
        return [ToolFinished(outcome=to_local_outcome(outcomes[c]), at=now) for c in pending if c in outcomes]

    def _resolve_model(self, requested: str | None) -> str:
        tiers = {
            tier: name
            for tier, name in (
                ("fast", self._settings.model_fast),
                ("default", self._settings.model_default),
                ("smart", self._settings.model_smart),
            )
            if name
        }
        try:
            return resolve_model(requested, default=self._settings.model, tiers=tiers)
        except ValueError:
            # Kept as given: the model call then fails with a provider error that names the problem, so a
            # bad model ends the turn through the one stop path instead of crashing here.
            return requested or self._settings.model


def drop_dispatches(commands: Sequence[Command], call_ids: Collection[str]) -> list[Command]:
    """`commands` without the dispatches of `call_ids` (a `DispatchTools` left empty goes too)."""
    kept: list[Command] = []
    for command in commands:
        if not isinstance(command, DispatchTools):
            kept.append(command)
        elif calls := [d for d in command.calls if d.call_id not in call_ids]:
            kept.append(command.model_copy(update={"calls": calls}))
    return kept
