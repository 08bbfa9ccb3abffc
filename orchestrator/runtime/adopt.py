"""Bringing a turn into an orchestrator: what the driver reads and filters around `machine.start` / `resume`.

Resuming is where durability is earned. The previous owner may have died at any point after a persisted
step. `machine.resume` says what the new owner must (re)issue from the state alone — timers, outcome writes
that were asked for, the model call in flight (the same call again, not a retry), approvals still awaited,
dispatches whose start was never recorded (the same task again: maybe never published) — and
`read_missed_outcomes` reads what happened while nobody owned the turn: outcomes written to Redis, whose
notifications went to nobody (`drop_dispatches` then leaves their calls out of the dispatches sent again).
The machine itself is run by the driver (`runtime.driver`), never here.

A turn this process cannot run — a state of a version it does not read, a request or state that does not
parse (another release wrote it: `workers.records`) — is released, told once, and set aside (`SetAside`):
neither claimed nor taken over again here until its hold expires, so that an orchestrator that can run it
takes it, and this one never releases it again and again. Its deadline still holds: one that nobody able to
run it ended by `OVERDUE_GRACE_S` past it is ended here (`build_overdue_outcome`), from its stored history.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from orchestrator.errors import ModelConfigError
from orchestrator.machine.events import Command, DispatchTools, ToolFinished, WriteOutcomes
from orchestrator.machine.state import TurnState
from orchestrator.model import (
    AssistantMessage,
    Limits,
    Message,
    ProviderError,
    ToolMessage,
    TurnOutcome,
    TurnRequest,
)
from orchestrator.providers.base import resolve_model
from orchestrator.runtime.handle import TurnHandle
from orchestrator.runtime.inbox import build_wire_call_id, to_local_outcome
from orchestrator.settings import Settings
from orchestrator.store.history import StoredState, parse_messages
from orchestrator.store.turns import TurnStore
from orchestrator.submit_checks import ModelNames, find_refusals

# How long a turn this process cannot run is left alone before it is tried again: long enough that a rolling
# deploy is over by then (a newer orchestrator took the turn), short enough that a turn nobody took is looked
# at again within minutes; the retry costs one read and no log line.
SET_ASIDE_S = 300.0
# How many turns are held aside at most (the earliest to expire is forgotten first).
SET_ASIDE_MAX = 10_000
# How long past its deadline a turn this process cannot run is left to one that can, before this one ends it:
# an orchestrator running it ends it at its deadline, so a turn still unended then has nobody to run it.
OVERDUE_GRACE_S = 30.0
# The error of a turn ended that way (`TurnOutcome.error`): who ended it, and why.
UNRUNNABLE_PROVIDER = "toolloop"
UNRUNNABLE_TYPE = "unrunnable_turn"


class SetAside:
    """Turns this orchestrator found it cannot run, each until its hold expires (monotonic seconds); added in
    order, all held as long, so the first is the first to expire."""

    def __init__(self, hold_s: float = SET_ASIDE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_s = hold_s
        self._clock = clock
        self._until: dict[str, float] = {}

    def add(self, turn_id: str) -> None:
        """Hold `turn_id` aside for `hold_s` from now."""
        now = self._clock()
        self._until.pop(turn_id, None)
        self._until[turn_id] = now + self.hold_s
        if len(self._until) > SET_ASIDE_MAX:
            self._until = {t: until for t, until in self._until.items() if until > now}
            while len(self._until) > SET_ASIDE_MAX:
                del self._until[next(iter(self._until))]

    def __contains__(self, turn_id: object) -> bool:
        if not isinstance(turn_id, str) or turn_id not in self._until:
            return False
        if self._until[turn_id] > self._clock():
            return True
        del self._until[turn_id]
        return False

    def __len__(self) -> int:
        return len(self._until)


@dataclass(frozen=True)
class Unrunnable:
    """A turn this process cannot run: why, and when it is its stored state it cannot read, that state (and
    the turn's conversation), from which an overdue turn is ended. `fallback_deadline_at`: the deadline
    to end it by when no state says one (unreadable, or without one): its submit time plus its request's
    `deadline_s` (`build_fallback_deadline`)."""

    problem: str
    stored: StoredState | None = None
    conversation_id: str | None = None
    fallback_deadline_at: float | None = None


def read_deadline_at(state_text: str | None) -> float | None:
    """The `deadline_at` a stored state says, in any version that keeps it there; None when it says none
    this release can read (pure)."""
    try:
        data = json.loads(state_text) if state_text is not None else None
    except ValueError:
        return None
    deadline_at = data.get("deadline_at") if isinstance(data, dict) else None
    if isinstance(deadline_at, bool) or not isinstance(deadline_at, int | float):
        return None
    return float(deadline_at)


def build_fallback_deadline(submitted_at: float | None, request_text: str | None) -> float | None:
    """The deadline of a turn whose state says none (pure): its submit time plus its request's `deadline_s`,
    or the default's when the request cannot be read either; None without a submit time. A turn whose
    state is unreadable can never resume, so time it may have waited for people does not matter."""
    if submitted_at is None:
        return None
    deadline_s = Limits().deadline_s
    try:
        data = json.loads(request_text) if request_text is not None else None
    except ValueError:
        data = None
    limits = data.get("limits") if isinstance(data, dict) else None
    asked = limits.get("deadline_s") if isinstance(limits, dict) else None
    if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > 0:
        deadline_s = float(asked)
    return submitted_at + deadline_s


def build_overdue_outcome(turn_id: str, unrunnable: Unrunnable, now: float) -> TurnOutcome | None:
    """The end of a turn this process cannot run, once `OVERDUE_GRACE_S` past its deadline (None before, or
    when neither its state nor the fallback says a deadline): `stopped` at its `deadline`, with the history
    that is stored (a round in progress is not in it: its calls are left unanswered nowhere), and an error
    saying that its usage and counts are not known."""
    stored = unrunnable.stored
    deadline_at = read_deadline_at(stored.text if stored is not None else None)
    if deadline_at is None:
        deadline_at = unrunnable.fallback_deadline_at
    if deadline_at is None or now < deadline_at + OVERDUE_GRACE_S:
        return None
    try:
        data = json.loads(stored.text) if stored is not None else None
    except ValueError:
        data = None
    try:
        messages = parse_messages(stored.history) if stored is not None else []
    except ValueError:
        messages = []
    model = data.get("model") if isinstance(data, dict) else None
    message = (
        f"ended {now - deadline_at:.0f} s past its deadline by an orchestrator that cannot run it "
        f"({unrunnable.problem}); its usage and counts are not known"
    )
    return TurnOutcome(
        turn_id=turn_id,
        status="stopped",
        stop_reason="deadline",
        limit_reached=True,
        messages=drop_unanswered(messages),
        model=model if isinstance(model, str) else None,
        error=ProviderError(provider=UNRUNNABLE_PROVIDER, type=UNRUNNABLE_TYPE, message=message),
    )


def drop_unanswered(messages: Sequence[Message]) -> list[Message]:
    """`messages` without a last round whose calls are not all answered: a history never ends on one."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AssistantMessage) and message.tool_calls:
            answered = {m.tool_call_id for m in messages[index + 1 :] if isinstance(m, ToolMessage)}
            if all(call.id in answered for call in message.tool_calls):
                return list(messages)
            return list(messages[:index])
    return list(messages)


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
    outcomes = await store.read_outcomes(dict.fromkeys(pending, state.turn_id))
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
