"""Bringing a turn into an orchestrator: what the driver reads and filters around `machine.start` / `resume`.

Resuming is where durability is earned. The previous owner may have died at any point after a persisted
step. `machine.resume` says what the new owner must (re)issue from the state alone — timers, outcome writes
that were asked for, the model call in flight (the same call again, not a retry), approvals still awaited,
dispatches whose start was never recorded (the same task again: maybe never published) — and
`read_missed_outcomes` reads what happened while nobody owned the turn: outcomes written to Redis, whose
notifications went to nobody (`drop_dispatches` then leaves their calls out of the dispatches sent again).
The machine itself is run by the driver (`runtime.driver`), never here.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from orchestrator.errors import ModelConfigError
from orchestrator.machine.events import Command, DispatchTools, ToolFinished, WriteOutcomes
from orchestrator.machine.state import TurnState
from orchestrator.model import TurnRequest
from orchestrator.providers.base import resolve_model
from orchestrator.runtime.handle import TurnHandle
from orchestrator.runtime.inbox import build_wire_call_id, to_local_outcome
from orchestrator.settings import Settings
from orchestrator.store.submit_checks import ModelNames, find_refusals
from orchestrator.store.turns import TurnStore


@dataclass(frozen=True)
class Adopted:
    """A turn ready to drive: its state and the commands still to perform for it."""

    state: TurnState
    commands: list[Command]
    resumed: bool
    # The turn's conversation (None: none), so that finishing it need not read its request again.
    conversation_id: str | None = None
    # The entries of the turn's history list that are its state's first messages (`TurnHandle.entries`).
    entries: list[str] = field(default_factory=list)
    # The entries of the turn's log list (`TurnHandle.log`).
    log: list[str] = field(default_factory=list)

    def build_handle(self, turn_id: str) -> TurnHandle:
        """The handle the driver keeps for the turn."""
        return TurnHandle(
            turn_id, self.state, conversation_id=self.conversation_id, entries=self.entries, log=self.log
        )


def resolve_turn_models(requested: str | list[str] | None, settings: Settings) -> list[str]:
    """The `provider:model`s a new turn runs with, in fallback order: each its own, a configured tier, or the
    default model. A model named twice (a tier and the model it names) is tried once."""
    names: list[str | None] = list(requested) if isinstance(requested, list) else [requested]
    resolved = [_resolve_one(name, settings) for name in names or [None]]
    return list(dict.fromkeys(resolved))


def _resolve_one(requested: str | None, settings: Settings) -> str:
    try:
        return resolve_model(requested, default=settings.model, tiers=settings.model_tiers)
    except ModelConfigError:
        # Kept as given: the model call then fails with a provider error that names the problem (the next
        # model of a fallback order takes over), so a bad model ends the turn through the one stop path
        # instead of crashing here.
        return requested or settings.model


def refuse_turn_controls(request: TurnRequest, models: Sequence[str]) -> list[str]:
    """What the resolved `models`' providers cannot honour of `request`, each naming its field; checked here
    because a submitting process that could not resolve a tier or the default model left it to us."""
    resolved = request.model_copy(update={"model": list(models)})
    return [str(refusal) for refusal in find_refusals(resolved, ModelNames())]


async def read_missed_outcomes(store: TurnStore, state: TurnState) -> list[ToolFinished]:
    """What a resumed turn missed: the stored outcomes of its calls still unanswered, as events."""
    if state.terminal or state.current is None:
        return []
    pending = [build_wire_call_id(state.turn_id, c.call_id) for c in state.current.calls if not c.finished]
    outcomes = await store.read_outcomes(pending)
    now = time.time()
    return [ToolFinished(outcome=to_local_outcome(outcomes[c]), at=now) for c in pending if c in outcomes]


def drop_dispatches(commands: Sequence[Command], call_ids: Collection[str]) -> list[Command]:
    """`commands` without the dispatches of `call_ids` (a `DispatchTools` left empty goes too)."""
    kept: list[Command] = []
    for command in commands:
        if not isinstance(command, DispatchTools):
            kept.append(command)
        elif calls := [d for d in command.calls if d.call_id not in call_ids]:
            kept.append(command.model_copy(update={"calls": calls}))
    return kept


def select_resent(commands: Sequence[Command], missed: Sequence[ToolFinished]) -> list[Command]:
    """Of `machine.resume`'s commands for a turn still running here, what it sends again after Redis restarted
    or failed over: its dispatches no worker confirmed (a redelivery is harmless), less those of calls whose
    outcome was read (`missed`), and the outcome writes it asked for."""
    again = [c for c in commands if isinstance(c, DispatchTools | WriteOutcomes)]
    return drop_dispatches(again, {e.outcome.call_id for e in missed})
