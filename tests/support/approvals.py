"""A turn that waits for approvals, without an orchestrator: the state one persists after the model asked for
calls of a tool that needs confirmation (`delete` in the machine harness's catalogue).

Approvals are only taken for calls a running turn waits on (`CallNotWaitingError` otherwise), so the tests
of what an approval carries (over the clients, HTTP and the CLI) first put their turn in that state.
"""

from __future__ import annotations

import asyncio

from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import dump_entries, dump_state
from orchestrator.store.history import Appended
from orchestrator.store.turns import TurnStore
from tests.unit.machine.harness import Driver, calls
from workers import keys

CONFIRMED_TOOL = "delete"


async def ahold_for_approval(store: TurnStore, turn_id: str, count: int) -> list[str]:
    """Save the state of `turn_id` waiting for `count` confirmed calls; their call ids, in order."""
    driver = Driver(tools=[CONFIRMED_TOOL])
    driver.respond(calls(*[(CONFIRMED_TOOL, {"id": number}) for number in range(count)]))
    state = driver.state
    assert state.current is not None, "the model's answer opened a round of calls"
    history_key, log_key = keys.turn_history(turn_id), keys.turn_log(turn_id)
    text = dump_state(state, history_key=history_key, log_key=log_key)
    lists = Appended(
        history_key, 0, tuple(dump_entries(state.history)), (), log_key, 0, tuple(dump_log(state))
    )
    assert await store.save_step(turn_id, text, state.status, append=lists)
    return [call.call_id for call in state.current.calls]


def hold_for_approval(redis_url: str, turn_id: str, count: int) -> list[str]:
    """`ahold_for_approval` from synchronous code, on a store of its own."""

    async def hold() -> list[str]:
        store = TurnStore.from_url(redis_url)
        try:
            return await ahold_for_approval(store, turn_id, count)
        finally:
            await store.aclose()

    return asyncio.run(hold())
