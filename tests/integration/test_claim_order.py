"""The claim's order (`claim.lua`) on a real redis-server: lanes in order, tenants in turn within a lane, a
tenant at its `max_running_turns` passed over and served again once its turns end, and the queue of the
previous releases still claimed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import redis

from orchestrator.model import TurnOutcome, TurnPriority, TurnRequest
from orchestrator.store import operations
from orchestrator.store import scripts as lua
from orchestrator.store.codec import CLAIM_AGAIN, ClaimedTurn, dump_request
from orchestrator.store.runner import SyncRunner
from orchestrator.tenant_limits import NO_CAPS, RunningCaps
from tests.support.store_db import store_db_url
from workers import keys
from workers.connect import connect_redis

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

CLAIM_DB = 5


@pytest.fixture(params=[True, False], ids=["decoded", "bytes"])
def runner(redis_url: str, request: pytest.FixtureRequest) -> Iterator[SyncRunner]:
    client = connect_redis(store_db_url(redis_url, CLAIM_DB), decode_responses=request.param)
    client.flushdb()
    yield SyncRunner(client)
    client.close()


def submit(
    runner: SyncRunner, turn_id: str, tenant: str = "default", priority: TurnPriority = "normal"
) -> None:
    request = TurnRequest(prompt=turn_id, tenant=tenant, priority=priority)
    assert runner.run(operations.submit(request, turn_id, 1.0)) is lua.SubmitResult.QUEUED


def claim(runner: SyncRunner, caps: RunningCaps = NO_CAPS) -> str | None:
    claimed = runner.run(operations.claim("orch-a", 60_000, caps))
    assert claimed is not CLAIM_AGAIN
    return claimed.turn_id if isinstance(claimed, ClaimedTurn) else None


def claim_all(runner: SyncRunner, caps: RunningCaps = NO_CAPS) -> list[str]:
    claimed = []
    while (turn_id := claim(runner, caps)) is not None:
        claimed.append(turn_id)
    return claimed


def finish(runner: SyncRunner, turn_id: str) -> None:
    outcome = TurnOutcome(turn_id=turn_id, status="completed", text="ok")
    done = operations.save_outcome(turn_id, outcome, None, 2.0, orchestrator_id="orch-a")
    assert runner.run(done) is lua.FinishResult.FINISHED


def test_tenants_take_turns_within_a_lane_whatever_their_backlog(runner: SyncRunner) -> None:
    for n in range(5):
        submit(runner, f"a{n}", "acme")
    submit(runner, "b0", "beta")
    submit(runner, "b1", "beta")
    submit(runner, "d0")
    # One tenant's backlog delays another's turn by at most one claim.
    assert claim_all(runner) == ["a0", "b0", "d0", "a1", "b1", "a2", "a3", "a4"]
    assert runner.client.llen(keys.lane_tenants("normal")) == 0


def test_lanes_are_claimed_in_order_interactive_normal_batch(runner: SyncRunner) -> None:
    submit(runner, "batch-a", "acme", "batch")
    submit(runner, "normal-a", "acme")
    submit(runner, "batch-b", "beta", "batch")
    submit(runner, "inter-b", "beta", "interactive")
    submit(runner, "inter-a", "acme", "interactive")
    assert claim_all(runner) == ["inter-b", "inter-a", "normal-a", "batch-a", "batch-b"]


def test_a_tenant_at_its_cap_is_passed_over_and_served_as_its_turns_end(runner: SyncRunner) -> None:
    caps = RunningCaps({"acme": 2}, 0)
    for n in range(4):
        submit(runner, f"a{n}", "acme")
    submit(runner, "b0", "beta")
    assert claim_all(runner, caps) == ["a0", "b0", "a1"]
    assert runner.client.scard(keys.tenant_running("acme")) == 2
    # A turn's end frees its place (and pushes a ready token for a blocked claimer).
    runner.client.delete(keys.TURNS_READY)
    finish(runner, "a0")
    assert runner.client.llen(keys.TURNS_READY) == 1
    assert claim_all(runner, caps) == ["a2"]
    # A running turn that ended otherwise (expired, ended by another release) is cleaned by the claim.
    runner.client.delete(keys.turn_status("a1"))
    assert claim_all(runner, caps) == ["a3"]
    assert {codec_text(t) for t in runner.client.smembers(keys.tenant_running("acme"))} == {"a2", "a3"}


def test_ready_tokens_wake_claimers_only_for_what_a_claim_can_take(runner: SyncRunner) -> None:
    # Each submit pushes a token; one claimer takes the queue's turns one after the other without waiting for
    # them, and the claim that finds nothing drops the tokens left: each would wake a claimer for nothing.
    for n in range(3):
        submit(runner, f"a{n}")
    assert runner.client.llen(keys.TURNS_READY) == 3
    assert claim_all(runner) == ["a0", "a1", "a2"]
    assert runner.client.llen(keys.TURNS_READY) == 0
    # A turn's end frees a place only its tenant's queued turns can use: with none queued, it wakes nobody.
    finish(runner, "a0")
    assert runner.client.llen(keys.TURNS_READY) == 0
    caps = RunningCaps({"acme": 1}, 0)
    submit(runner, "c0", "acme")
    submit(runner, "c1", "acme")
    submit(runner, "b0", "beta")
    assert claim_all(runner, caps) == ["c0", "b0"]
    finish(runner, "b0")  # beta has nothing queued
    assert runner.client.llen(keys.TURNS_READY) == 0
    finish(runner, "c0")  # acme's c1 waits for this place
    assert runner.client.llen(keys.TURNS_READY) == 1
    assert claim_all(runner, caps) == ["c1"]


def test_the_ready_tokens_stay_under_their_cap(runner: SyncRunner) -> None:
    for n in range(4):
        op = operations.submit(TurnRequest(prompt=f"t{n}"), f"t{n}", 1.0)
        # A cap of 2 instead of the default (the argument that holds keys.READY_TOKENS_MAX).
        at = len(op.args) - 1
        assert op.args[at] == str(keys.READY_TOKENS_MAX)
        runner.run(dataclasses.replace(op, args=(*op.args[:at], "2")))
    assert runner.client.llen(keys.TURNS_READY) == 2


def test_the_default_cap_holds_each_other_tenant_on_its_own(runner: SyncRunner) -> None:
    caps = RunningCaps({"acme": 3}, 1)
    for tenant in ("acme", "beta", "gamma"):
        for n in range(3):
            submit(runner, f"{tenant}{n}", tenant)
    assert claim_all(runner, caps) == ["acme0", "beta0", "gamma0", "acme1", "acme2"]


def test_a_parked_turn_holds_no_place_and_comes_back_past_the_cap(runner: SyncRunner) -> None:
    caps = RunningCaps({"acme": 1}, 0)
    submit(runner, "a0", "acme")
    submit(runner, "a1", "acme")
    assert claim_all(runner, caps) == ["a0"]
    assert runner.run(operations.park("orch-a", "a0", 9e9, "0")) is lua.ParkResult.PARKED
    assert claim_all(runner, caps) == ["a1"]
    # An answer wakes a0 onto the front of the previous releases' queue: it moves to acme's queue and is
    # claimed though acme is at its cap, being one of its running turns already.
    runner.client.zrem(keys.TURNS_PARKED, "a0")
    runner.client.lpush(keys.TURN_QUEUE, "a0")
    assert claim_all(runner, caps) == ["a0"]


def test_turns_the_previous_release_queued_are_claimed_and_others_moved_to_their_lane(
    runner: SyncRunner,
) -> None:
    # The previous release's submit: the request stored, its id pushed onto the one queue, no rotation.
    for turn_id, request in (
        ("old", TurnRequest(prompt="old")),
        ("moved", TurnRequest(prompt="moved", tenant="acme", priority="interactive")),
    ):
        runner.client.set(keys.turn_request(turn_id), dump_request(request))
        runner.client.set(keys.turn_status(turn_id), "queued")
    runner.client.rpush(keys.TURN_QUEUE, "moved", "old")
    submit(runner, "new", "beta")
    # The default tenant joins the normal lane's rotation when the claim finds its queue not empty.
    assert claim_all(runner) == ["moved", "new", "old"]


def test_ended_and_leased_ids_are_passed_over(runner: SyncRunner) -> None:
    for n in range(3):
        submit(runner, f"a{n}", "acme")
    runner.client.set(keys.turn_status("a0"), "cancelled")
    runner.client.set(keys.turn_lease("a1"), "orch-b")
    assert claim_all(runner) == ["a2"]
    # Past the skip budget in one call, the script stops short and says so: the flow claims again at once.
    for n in range(operations.CLAIM_SKIP_BUDGET + 1):
        submit(runner, f"gone{n}", "acme")
        runner.client.set(keys.turn_status(f"gone{n}"), "cancelled")
    submit(runner, "last", "acme")
    assert runner.run(operations.claim("orch-a", 60_000)) is CLAIM_AGAIN
    assert claim(runner) == "last"


def codec_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def test_redis_client_is_real(runner: SyncRunner) -> None:
    assert isinstance(runner.client, redis.Redis)
