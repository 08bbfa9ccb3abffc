"""The durability watcher on a real redis-server that restarts (issue 12, item 7).

A restart with an append-only file keeps every key: nothing is said but one INFO line. A restart without one
empties Redis: the turns the orchestrator held are told in one ERROR line, counted, dropped and recorded as
`failed`, their unanswered calls answered, the loss noted for `show` — and nothing written for them
afterwards (a late step, outcome or tool result) brings them back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator, Mapping

import pytest
import redis.exceptions
from prometheus_client import REGISTRY

from orchestrator.model import TurnOutcome, TurnRequest, TurnStatus
from orchestrator.redis_server import RedisServer
from orchestrator.runtime.durability import DurabilityWatcher
from orchestrator.runtime.handle import TurnHandle
from orchestrator.runtime.inbox import build_wire_call_id
from orchestrator.store import losses
from orchestrator.store.runner import AsyncRunner
from orchestrator.store.turns import TurnStore
from tests.unit.machine.harness import Driver, calls, ok
from workers.contract import ToolOutcome

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TURN = "turn1"  # the id the machine harness gives its turn


class Held:
    """The driver's side the watcher uses: the turns held, and dropping one."""

    def __init__(self) -> None:
        self.handles: dict[str, TurnHandle] = {}
        self.dropped: list[tuple[str, bool]] = []
        self.resent = 0

    @property
    def turns(self) -> Mapping[str, TurnHandle]:
        return self.handles

    async def drop(self, handle: TurnHandle, *, release: bool) -> None:
        handle.dropped = True
        self.handles.pop(handle.turn_id, None)
        self.dropped.append((handle.turn_id, release))

    async def catch_up(self) -> None:
        self.resent += 1


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A Redis without persistence; parametrize indirectly with True for one with an append-only file."""
    with RedisServer(appendonly=getattr(request, "param", False)) as redis_server:
        yield redis_server


@pytest.fixture
async def store(server: RedisServer) -> AsyncIterator[TurnStore]:
    turn_store = TurnStore.from_url(server.url, lease_ttl_s=30)
    yield turn_store
    await turn_store.aclose()


async def _hold_a_turn_mid_round(store: TurnStore, held: Held) -> TurnHandle:
    """A turn submitted, claimed and mid-round (call_0 answered, call_1 running), held by `held`."""
    turn_id = await store.submit(TurnRequest(prompt="do it", tools=["add", "fetch"]), turn_id=TURN)
    assert await store.claim("orch-1", timeout_s=1) == turn_id
    driver = Driver(tools=["add", "fetch"])
    driver.respond(calls(("add", {"a": 1, "b": 2}), ("fetch", {})))
    driver.finish(ok("call_0", "add", "3"))
    handle = TurnHandle(turn_id, driver.state, conversation_id=None)
    held.handles[turn_id] = handle
    return handle


def _watcher(store: TurnStore, held: Held, name: str = "orch-1") -> DurabilityWatcher:
    return DurabilityWatcher(store=store, driver=held, orchestrator_id=name, redis_url="redis://test")


def _restart(server: RedisServer) -> None:
    if server.appendonly:
        server.stop(keep_data=True)  # SIGTERM: the append-only file is flushed
    else:
        server.kill()  # a crash: nothing was on disk
    server.start()


async def _look(watcher: DurabilityWatcher) -> set[str]:
    """One look; the pool's connections to the old server fail once each, as in the watcher's loop."""
    for _ in range(5):
        try:
            return await watcher.check()
        except redis.exceptions.ConnectionError:
            continue
    return await watcher.check()


def _lost_total() -> float:
    return REGISTRY.get_sample_value("toolloop_turns_lost_total") or 0.0


def _loss_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and "DATA LOST" in r.message]


@pytest.mark.parametrize("server", [False, True], ids=["volatile", "aof"], indirect=True)
async def test_a_restart_is_a_loss_only_when_redis_came_back_empty(
    server: RedisServer, store: TurnStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="toolloop.orchestrator")
    held = Held()
    handle = await _hold_a_turn_mid_round(store, held)
    watcher = _watcher(store, held)
    assert await watcher.check() == set()
    before = _lost_total()

    _restart(server)
    found = await _look(watcher)

    runner = AsyncRunner(store.redis)
    if server.appendonly:
        assert found == set() and held.dropped == [] and not _loss_lines(caplog)
        assert held.resent == 1  # a message Redis may have lost with its last second is sent again
        assert await store.get_status(TURN) is TurnStatus.RUNNING
        assert await runner.run(losses.read_losses()) == []
        assert any("with its data" in r.getMessage() for r in caplog.records)
        # Writers still on the old master a moment longer: the turns catch up again a second later.
        for _ in range(50):
            if held.resent > 1:
                break
            await asyncio.sleep(0.1)
        assert held.resent == 2
        return
    assert found == {TURN} and held.dropped == [(TURN, False)] and handle.dropped
    (line,) = _loss_lines(caplog)
    assert "1 turn(s) lost" in line and TURN in line and "without its data" in line
    assert _lost_total() == before + 1
    (loss,) = await runner.run(losses.read_losses())
    assert loss.kind == "empty" and loss.detected_by == "orch-1" and loss.new_run_id == watcher.run_id

    view = await store.get_view(TURN)
    assert view is not None and view.status is TurnStatus.FAILED
    assert losses.is_lost_outcome(view.outcome) and view.request.tools == ["add", "fetch"]
    # The call still running when Redis went is answered, so a worker that holds its message skips it and
    # one that finishes it late only adds to the audit list.
    wire_id = build_wire_call_id(TURN, "call_1")
    written = await store.read_outcomes({wire_id: TURN})
    assert written[wire_id].synthetic and not written[wire_id].ok
    late = ToolOutcome(call_id=wire_id, tool="fetch", turn_id=TURN, ok=True, result="x", content="x")
    assert await store.write_outcome(late) != late
    # Nothing brings the turn back: a step or an outcome of a (stale) owner is refused.
    assert not await store.save_step(TURN, "{}", TurnStatus.RUNNING, orchestrator_id="orch-1")
    done = TurnOutcome(turn_id=TURN, status="completed", text="done")
    assert not await store.save_outcome(TURN, done, conversation_id=None)
    assert losses.is_lost_outcome(await store.get_outcome(TURN))

    # Told once: the next looks say nothing more.
    assert await _look(watcher) == set()
    assert len(_loss_lines(caplog)) == 1 and _lost_total() == before + 1


async def test_a_peer_that_saw_the_loss_first_does_not_hide_it(
    server: RedisServer, store: TurnStore, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = _watcher(store, Held(), "orch-1"), _watcher(store, Held(), "orch-2")
    await first.check()
    await second.check()
    _restart(server)
    assert await _look(first) == set()  # it held no turn, yet Redis came back empty: that is told
    assert await _look(second) == set()
    lines = _loss_lines(caplog)
    assert len(lines) == 2 and all("none of the turns lost ran here" in line for line in lines)
    (loss,) = await AsyncRunner(store.redis).run(losses.read_losses())
    assert loss.detected_by == "orch-1"


async def test_a_turn_the_lease_loop_dropped_first_is_still_recorded(
    server: RedisServer, store: TurnStore
) -> None:
    held = Held()
    handle = await _hold_a_turn_mid_round(store, held)
    watcher = _watcher(store, held)
    await watcher.check()
    _restart(server)
    await held.drop(handle, release=False)  # "lease lost", before the watcher's next look
    assert await _look(watcher) == {TURN}
    assert losses.is_lost_outcome(await store.get_outcome(TURN))


async def test_writes_that_raced_the_watcher_are_not_overwritten(
    server: RedisServer, store: TurnStore
) -> None:
    held = Held()
    await _hold_a_turn_mid_round(store, held)
    watcher = _watcher(store, held)
    await watcher.check()
    _restart(server)
    await _look(_watcher(store, Held(), "orch-2"))  # (its pool's stale connections fail here)
    # The same id submitted again before the watcher looked: a turn with keys is not lost.
    await store.submit(TurnRequest(prompt="again"), turn_id=TURN)
    assert await _look(watcher) == set()
    view = await store.get_view(TURN)
    assert view is not None and view.status is TurnStatus.QUEUED and view.request.prompt == "again"
    # Nor are the calls of a turn not recorded as lost answered.
    assert await store.read_outcomes({build_wire_call_id(TURN, "call_1"): TURN}) == {}
