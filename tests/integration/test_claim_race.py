"""A cancel sent while an orchestrator picks a turn up is never lost (found by a newcomer's trial).

The claim leases the turn (`claim.lua`); until the driver has registered it, the inbox drops notices for it
(not ours yet). A cancel written in between is therefore only in the turn's control stream, which the driver
reads once the turn is registered. Here the cancel is sent right after the claim and the inbox is given time
to see (and drop) its notice before the turn is registered: the turn must still end cancelled.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from orchestrator.model import TurnRequest
from orchestrator.providers.scripted.server import ScriptedServer
from orchestrator.runtime.driver import TurnDriver
from orchestrator.settings import Settings
from orchestrator.store.turns import TurnStore
from tests.support.in_process import serving

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_cancel_sent_between_the_claim_and_the_registration_stops_the_turn(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = TurnStore.from_url(redis_url)
    load = TurnDriver._load

    async def load_after_a_cancel(driver: TurnDriver, turn_id: str, *args: Any) -> Any:
        assert await store.request_cancel(turn_id)
        await asyncio.sleep(0.3)  # the inbox reads the notice meanwhile, for a turn it does not hold yet
        return await load(driver, turn_id, *args)

    monkeypatch.setattr(TurnDriver, "_load", load_after_a_cancel)
    async with ScriptedServer(chunk_delay_s=0.05) as base_url:
        settings = Settings(redis_url=redis_url, scripted_base_url=base_url, model="scripted:echo")
        async with serving(store, settings):
            turn_id = await store.submit(TurnRequest(prompt="a long answer " * 50))
            outcome = await store.wait_outcome(turn_id, timeout_s=30)
    await store.aclose()
    assert outcome.status == "cancelled"
