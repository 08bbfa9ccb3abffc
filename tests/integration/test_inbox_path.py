"""Following an inbox entry to `machine.step` stays inside runtime/ and machine/, and never climbs back.

A real turn (the scripted `plan` model over HTTP, one round of two `echo` calls on the session's prefork
worker, real Redis) runs through an in-process `Runtime`. A profile hook records the toolloop frames on the
stack whenever the inbox hands events to the driver (`TurnDriver.deliver`) and whenever the machine is
stepped. Each stack must be made of orchestrator.runtime.* and orchestrator.machine.* frames only, and read
from the bottom up it must go down the layers — process, driver, performer/publisher, machine — never up: a
lower module calling back into a higher one (as the old executor's feed/spawn/finish callbacks did) fails.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest

from orchestrator.machine import loop
from orchestrator.model import TurnRequest
from orchestrator.providers.scripted.server import ScriptedServer
from orchestrator.runtime import driver, process
from orchestrator.settings import Settings
from orchestrator.store.turns import TurnStore
from tests.support.in_process import serving
from tests.support.processes import WorkerHandle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WATCHED = {loop.step.__code__: "step", driver.TurnDriver.deliver.__code__: "deliver"}
# The runtime's layers, from the top: a frame may only call into a module of a higher rank.
RANKS = {
    "orchestrator.runtime.process": 0,
    "orchestrator.runtime.driver": 1,
    "orchestrator.runtime.perform": 2,
    "orchestrator.publishing.publisher": 3,
}
MACHINE_RANK = 10


def rank(module: str) -> int:
    if module.startswith("orchestrator.machine."):
        return MACHINE_RANK
    assert module in RANKS, f"{module} has no place on the way from the inbox to the machine"
    return RANKS[module]


def toolloop_frames(frame: FrameType | None) -> list[str]:
    """The orchestrator modules on the stack, outermost first, consecutive repeats folded."""
    modules: list[str] = []
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith(("orchestrator.", "workers.")) and (not modules or modules[-1] != name):
            modules.append(name)
        frame = frame.f_back
    return modules[::-1]


@pytest.fixture
def recorded_stacks() -> Iterator[dict[str, list[list[str]]]]:
    stacks: dict[str, list[list[str]]] = {"step": [], "deliver": []}

    def profile(frame: FrameType, event: str, _: Any) -> None:
        if event == "call" and (kind := WATCHED.get(frame.f_code)) is not None:
            stacks[kind].append(toolloop_frames(frame))

    sys.setprofile(profile)
    try:
        yield stacks
    finally:
        sys.setprofile(None)


async def run_one_turn(redis_url: str) -> str:
    plan = {"plan": [{"calls": [{"name": "echo", "arguments": {"text": t}} for t in ("a", "b")]}]}
    async with ScriptedServer() as base_url:
        settings = Settings(redis_url=redis_url, scripted_base_url=base_url, model="scripted:plan")
        store = TurnStore.from_url(redis_url)
        async with serving(store, settings):
            turn_id = await store.submit(TurnRequest(prompt=json.dumps(plan), tools=["echo"]))
            outcome = await store.wait_outcome(turn_id, timeout_s=30)
        await store.aclose()
    return outcome.status


async def test_an_inbox_entry_reaches_the_machine_without_climbing_back(
    redis_url: str, worker: WorkerHandle, recorded_stacks: dict[str, list[list[str]]]
) -> None:
    assert await run_one_turn(redis_url) == "completed"
    inbox_deliveries = [s for s in recorded_stacks["deliver"] if s and s[0] == process.__name__]
    assert inbox_deliveries, "the tool outcomes came through the inbox"
    for stack in inbox_deliveries:
        assert stack == [process.__name__, driver.__name__]
    assert recorded_stacks["step"], "the machine was stepped"
    for stack in recorded_stacks["step"]:
        assert stack[-1] == loop.__name__
        ranks = [rank(module) for module in stack]
        assert ranks == sorted(set(ranks)), f"climbs back: {' → '.join(stack)}"
