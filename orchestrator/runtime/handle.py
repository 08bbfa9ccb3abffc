"""One turn owned by an orchestrator (`TurnHandle`): its state, parsed or parked as JSON, and its lock.

Memory per parked turn is what an orchestrator holding thousands of them pays for (a parked turn
is a state, a lock and heap entries). So the handle has slots, creates its task set only while tasks run, and
can drop its parsed `TurnState` (pydantic objects, ~14 KB for a one-call turn) for the JSON last saved
(~3 KB) and the entries of its history list, which is what the state is parsed from again on the turn's next
event. The entries (one message's JSON each, as stored) are also how the handle knows how much of the history
its list holds: a step appends only the messages past them (`runtime.persist`).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence

from orchestrator.machine.events import Event, ToolFinished
from orchestrator.machine.state import TurnState, load_state
from orchestrator.store.turns import UNREAD, Unread
from workers import keys


class TurnHandle:
    """One turn owned by this orchestrator: its latest state and what serialises its steps.

    The state is kept as the JSON last persisted (`state_json`) and, while the turn is in use, also as the
    parsed `TurnState`. A parked turn (waiting for tools or a person) can `park()`: it then holds only the
    JSON, about a fifth of the parsed objects, and `state` parses it again on the next event.
    """

    __slots__ = (
        "_state",
        "claimed_at",
        "control_after",
        "conversation_id",
        "deferred",
        "dropped",
        "entries",
        "feeding",
        "lists_kept",
        "lock",
        "log",
        "state_json",
        "tasks",
        "turn_id",
    )

    def __init__(
        self,
        turn_id: str,
        state: TurnState,
        state_json: str | None = None,
        *,
        conversation_id: str | Unread | None = UNREAD,
        entries: list[str] | None = None,
        log: list[str] | None = None,
    ) -> None:
        self.turn_id = turn_id
        self.conversation_id = conversation_id
        # The history list's entries that are the state's first messages: all of them once a step is saved.
        self.entries: list[str] = entries if entries is not None else []
        # The turn's log list's entries, which hold its state's audit lists (`LOGGED_FIELDS`).
        self.log: list[str] = log if log is not None else []
        # True once this owner saved a step: its lists hold no TTL then (a conversation's history list carries
        # one between two turns, which the owner's first save removes).
        self.lists_kept = False
        self._state: TurnState | None = state
        self.state_json = state_json
        self.claimed_at = time.monotonic()
        self.lock = asyncio.Lock()
        self.control_after = "0"
        self.dropped = False
        # Model calls, dispatches and revocations in flight; kept so they are not garbage-collected, and
        # cancelled when the turn moves away. None while there are none (most parked turns).
        self.tasks: set[asyncio.Task[None]] | None = None
        # Events waiting to be stepped: notifications held back (TurnDriver.defer), and those delivered
        # while a step already waits for the lock (TurnDriver.deliver).
        self.deferred: list[Event] | None = None
        # A step waits for the lock and will take every deferred event (None: none waits); True: it also reads
        # the turn's control requests.
        self.feeding: bool | None = None

    @property
    def state(self) -> TurnState:
        """The turn's latest state (parsed again from its JSON if the turn was parked)."""
        if self._state is None:
            assert self.state_json is not None, "only a saved state is ever parked"
            self._state = load_state(self.state_json, self.entries, self.log)
        return self._state

    @property
    def history_key(self) -> str:
        """The list the turn's messages are appended to: its conversation's, else its own."""
        conversation = self.conversation_id if isinstance(self.conversation_id, str) else None
        return keys.history(self.turn_id, conversation)

    @property
    def log_key(self) -> str:
        """The turn's log list."""
        return keys.turn_log(self.turn_id)

    def set_state(
        self,
        state: TurnState,
        state_json: str,
        entries: list[str] | None = None,
        log: list[str] | None = None,
    ) -> None:
        """The state just saved, its JSON, and (when it added to them) its lists' entries now stored."""
        self._state = state
        self.state_json = state_json
        self.lists_kept = True
        if entries is not None:
            self.entries = entries
        if log is not None:
            self.log = log

    @property
    def hydrated(self) -> bool:
        """True while the parsed state is held."""
        return self._state is not None

    def queue(self, events: Sequence[Event], *, read_control: bool) -> bool:
        """Add events to step; True when no step waits for the lock yet (the caller starts one).

        Events that arrive while the lock is held (a step saving, a model answer being stepped) join the one
        step already waiting for it: one step and one save for the batch, not one each."""
        self._defer(events)
        if self.feeding is not None:
            self.feeding = self.feeding or read_control
            return False
        self.feeding = read_control
        return True

    def take_feeding(self) -> bool:
        """The waiting step has the lock (what comes later waits for the next): whether it reads control."""
        read_control = bool(self.feeding)
        self.feeding = None
        return read_control

    def hold(self, events: Sequence[Event]) -> bool:
        """Hold back events that move nothing on; True when none were held yet (the caller arms a flush).

        A `started` notification only arms a lost-work timer (hard limit + grace away) and tells observers;
        an outcome while other calls of its round run only records it (it is stored already, in its own key).
        What follows usually comes within milliseconds: held back a moment, they are stepped and saved
        together, and the round's last outcome never waits behind their steps."""
        return self._defer(events)

    def _defer(self, events: Sequence[Event]) -> bool:
        # Appended in place: no list copied per notification. True when none were deferred before.
        if self.deferred is None:
            self.deferred = list(events)
            return True
        self.deferred += events
        return False

    def still_waits(self, events: Sequence[Event]) -> bool:
        """True when, with `events` and those deferred stepped, a call of the current round would still have
        no outcome: stepping them now would move nothing on. False when that is not known without parsing a
        parked state or reading one that a step is changing."""
        state = self._state
        if state is None or state.current is None or self.lock.locked():
            return False
        waiting = {call.call_id for call in state.current.calls if call.outcome is None}
        for event in (*(self.deferred or ()), *events):
            if isinstance(event, ToolFinished):
                waiting.discard(event.outcome.call_id)
        return bool(waiting)

    def park(self) -> bool:
        """Drop the parsed state, keeping its JSON; False (nothing done) when it is in use or unsaved."""
        if self._state is None or self.state_json is None or self.lock.locked() or self.tasks:
            return False
        self._state = None
        return True


def forget_task(handle: TurnHandle, task: asyncio.Task[None]) -> None:
    """Done-callback of a turn's task: drop it, and the set when it is empty (most parked turns have none)."""
    if handle.tasks is not None:
        handle.tasks.discard(task)
        if not handle.tasks:
            handle.tasks = None


class HydratedTurns:
    """Turns holding a parsed state, least recently stepped first; beyond `limit` the oldest are parked."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._turns: OrderedDict[str, TurnHandle] = OrderedDict()

    def __len__(self) -> int:
        return len(self._turns)

    def stepped(self, handle: TurnHandle) -> None:
        """Mark a turn as just used; park the least recently used ones beyond `limit`."""
        if handle.dropped or not handle.hydrated:
            return
        self._turns[handle.turn_id] = handle
        self._turns.move_to_end(handle.turn_id)
        while len(self._turns) > self.limit:
            _, oldest = self._turns.popitem(last=False)
            if not oldest.park() and not oldest.dropped:
                # Busy (a step, a model call or a publish in progress): it comes back when its step ends.
                self._turns[oldest.turn_id] = oldest
                break

    def forget(self, turn_id: str) -> None:
        """A dropped turn."""
        self._turns.pop(turn_id, None)
