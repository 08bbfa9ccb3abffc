"""The turn driver with tracing: each turn's span (`runtime.turn_spans`) opened as the turn is adopted and
closed as it is dropped — the driver's two ends, hooked here so that the driver stays about turns alone."""

from __future__ import annotations

import logging

from orchestrator.runtime.driver import TurnDriver
from orchestrator.runtime.handle import TurnHandle
from orchestrator.runtime.turn_spans import TurnSpans
from orchestrator.store.codec import ClaimedTurn

log = logging.getLogger("toolloop.tracing")


class TracingTurnDriver(TurnDriver):
    """The turn driver, with each turn's span opened as it is adopted and closed as it is dropped."""

    @property
    def spans(self) -> TurnSpans | None:
        """The performer's turn spans (its model calls and the publisher read them)."""
        return self._performer.spans

    async def adopt(self, turn_id: str, *, how: str, claimed: ClaimedTurn | None = None) -> None:
        """Open the turn's span, then adopt it (`TurnDriver.adopt`); a turn not adopted closes it again."""
        spans = self.spans
        if spans is not None:
            try:
                await spans.begin(turn_id, how=how, orchestrator_id=self._orchestrator_id)
            except Exception:  # tracing never holds a turn up
                log.exception("turn %s: its span could not be opened", turn_id)
        await super().adopt(turn_id, how=how, claimed=claimed)
        if spans is not None and turn_id not in self.turns:
            spans.end(turn_id, None, how="not_adopted")

    async def _drop(self, handle: TurnHandle, *, release: bool, parked: bool = False) -> None:
        spans = self.spans
        if spans is not None and not handle.dropped and handle.turn_id in spans:
            state = handle.state if handle.hydrated or handle.state_json is not None else None
            if state is not None and state.terminal:
                how = "finished"
            elif parked:
                how = "parked"
            else:
                how = "released" if release else "lease_lost"
            spans.end(handle.turn_id, state, how=how)
        await super()._drop(handle, release=release, parked=parked)
