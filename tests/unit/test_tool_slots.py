"""The accounting of `slots.lua` and `slot_waiting.lua` (`workers.concurrency`), on the session's real Redis,
and the pure pieces around them: which slots a call takes, how long a waiting call waits, what it says.

The fleet-wide and the per-tenant slots are taken together or not at all; a repeat of an acquire by its holder
(a lost reply) takes nothing more; an expired entry frees its slot; a release by token gives back only that
execution's, and by prefix those of the pool process the worker's parent names.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from orchestrator.store import codec
from tests.support.turns import turn_events
from workers import keys
from workers.concurrency import (
    WAIT_COUNTDOWN_MAX_S,
    WAIT_COUNTDOWN_MIN_S,
    SlotClaim,
    SlotStore,
    build_slot_claim,
    build_wait_countdown_s,
    build_wait_reason,
)
from workers.contract import ToolCallRequest, ToolSpec
from workers.errors import ToolDefinitionError
from workers.scripts import SlotResult, SlotWaitingResult
from workers.tools import ToolRegistry, tool

pytestmark = pytest.mark.timeout(30)

ACQUIRED, TOOL_FULL, TENANT_FULL = SlotResult.ACQUIRED, SlotResult.TOOL_FULL, SlotResult.TENANT_FULL


@pytest.fixture
def slots(redis_url: str) -> Iterator[SlotStore]:
    client = redis.Redis.from_url(redis_url)
    yield SlotStore(client)
    client.close()


def _claim(fleet: int | None, per_tenant: int | None, tenant: str = "acme") -> SlotClaim:
    spec = ToolSpec(
        name=f"slots_{uuid.uuid4().hex[:8]}", max_concurrency=fleet, max_concurrency_per_tenant=per_tenant
    )
    claim = build_slot_claim(spec, tenant)
    assert claim is not None
    return claim


def test_a_tool_without_limits_takes_no_slot() -> None:
    assert build_slot_claim(ToolSpec(name="free"), "acme") is None
    claim = build_slot_claim(ToolSpec(name="scrape", max_concurrency_per_tenant=2), "acme")
    assert claim == SlotClaim("", 0, keys.tenant_slots("scrape", "acme"), 2, "acme")


def test_n_slots_then_full_and_a_released_one_is_taken_again(slots: SlotStore) -> None:
    claim = _claim(3, None)
    assert [slots.acquire(claim, f"1|w:{pid}:a", ttl_s=10) for pid in range(3)] == [(ACQUIRED, 0)] * 3
    assert slots.acquire(claim, "1|w:9:a", ttl_s=10) == (TOOL_FULL, 3)
    # The holder asking again (its first reply lost) holds it still, and takes no second slot.
    assert slots.acquire(claim, "1|w:0:a", ttl_s=10) == (ACQUIRED, 0)
    assert slots.client.zcard(claim.tool_key) == 3
    assert slots.release(claim.keys, "1|w:1:a") == 1
    assert slots.release(claim.keys, "1|w:1:a") == 0
    assert slots.acquire(claim, "1|w:9:a", ttl_s=10) == (ACQUIRED, 0)


def test_both_limits_are_taken_together_or_not_at_all(slots: SlotStore) -> None:
    acme = _claim(2, 1, "acme")
    globex = SlotClaim(acme.tool_key, 2, keys.tenant_slots("t", f"globex_{uuid.uuid4().hex}"), 1, "globex")
    assert slots.acquire(acme, "1|w:1:a", ttl_s=10) == (ACQUIRED, 0)
    # Acme's one slot is held: its second call takes none, not even a fleet-wide one.
    assert slots.acquire(acme, "1|w:2:a", ttl_s=10) == (TENANT_FULL, 1)
    assert slots.client.zcard(acme.tool_key) == 1
    assert slots.acquire(globex, "1|w:3:a", ttl_s=10) == (ACQUIRED, 0)
    # The fleet's two are held now: the fleet-wide limit is told first.
    assert slots.acquire(globex, "1|w:4:a", ttl_s=10) == (TOOL_FULL, 2)
    assert slots.release(acme.keys, "1|w:1:a") == 2
    assert slots.acquire(acme, "1|w:2:a", ttl_s=10) == (ACQUIRED, 0)


def test_an_expired_entry_frees_its_slot_and_the_key_expires_with_its_last(slots: SlotStore) -> None:
    claim = _claim(1, None)
    assert slots.acquire(claim, "1|dead:1:a", ttl_s=0.2) == (ACQUIRED, 0)
    assert slots.acquire(claim, "1|w:2:a", ttl_s=10) == (TOOL_FULL, 1)
    assert 0 < slots.client.pttl(claim.tool_key) <= 1200
    time.sleep(0.25)
    assert slots.acquire(claim, "1|w:2:a", ttl_s=0.5) == (ACQUIRED, 0)
    assert slots.client.zrange(claim.tool_key, 0, -1) == [b"1|w:2:a"]
    time.sleep(1.6)  # its entry's expiry and the key's second after it
    assert slots.client.exists(claim.tool_key) == 0


def test_a_release_by_prefix_gives_back_that_pool_process_only(slots: SlotStore) -> None:
    claim = _claim(5, 5)
    for token in ("2|w:7:aaa", "2|w:70:bbb", "2|w:8:ccc", "3|w:7:ddd"):
        assert slots.acquire(claim, token, ttl_s=10) == (ACQUIRED, 0)
    # The parent names the execution its lost process 7 ran of dispatch attempt 2 by `2|w:7:`.
    assert slots.release(claim.keys, "2|w:7:", prefix=True) == 2
    assert sorted(slots.client.zrange(claim.tool_key, 0, -1)) == [b"2|w:70:bbb", b"2|w:8:ccc", b"3|w:7:ddd"]


def test_the_turn_is_told_once_per_dispatch_attempt_while_it_runs(slots: SlotStore) -> None:
    client = slots.client
    turn_id = f"turn_slots_{uuid.uuid4().hex[:8]}"
    claim = _claim(1, None)
    request = ToolCallRequest(call_id=f"{turn_id}/call_1", tool="scrape", turn_id=turn_id)
    assert slots.tell_waiting(request, claim, TOOL_FULL, 1) is SlotWaitingResult.ENDED  # no stream: none made
    assert client.exists(keys.turn_events(turn_id)) == 0
    client.xadd(keys.turn_events(turn_id), codec.build_event_fields(codec.TURN_QUEUED, {}, time.time()))  # type: ignore[arg-type]
    assert slots.tell_waiting(request, claim, TOOL_FULL, 1) is SlotWaitingResult.ADDED
    assert slots.tell_waiting(request, claim, TOOL_FULL, 1) is SlotWaitingResult.TOLD
    again = request.model_copy(update={"attempt": 2})
    assert slots.tell_waiting(again, claim, TOOL_FULL, 1) is SlotWaitingResult.ADDED
    client.set(keys.outcome(request.call_id), "{}")
    assert slots.tell_waiting(request.model_copy(update={"attempt": 3}), claim, TOOL_FULL, 1) is (
        SlotWaitingResult.CALL_DONE
    )
    assert [event["name"] for event in turn_events(client, turn_id)] == [
        "turn_queued",
        "tool_waiting_for_slot",
        "tool_waiting_for_slot",
    ]
    direct = ToolCallRequest(call_id="direct-1", tool="scrape")
    assert slots.tell_waiting(direct, claim, TOOL_FULL, 1) is None


@pytest.mark.parametrize(
    ("waited_s", "jitter", "expected_s"),
    [
        (0.0, 1.0, WAIT_COUNTDOWN_MIN_S),
        (0.0, 0.0, WAIT_COUNTDOWN_MIN_S / 2),
        (2.0, 1.0, 0.5),
        (600.0, 1.0, WAIT_COUNTDOWN_MAX_S),
        (-5.0, 2.0, WAIT_COUNTDOWN_MIN_S),  # a skewed clock, a jitter out of range
    ],
)
def test_a_waiting_call_looks_again_sooner_the_less_it_has_waited(
    waited_s: float, jitter: float, expected_s: float
) -> None:
    assert build_wait_countdown_s(waited_s, jitter) == pytest.approx(expected_s)


def test_the_wait_says_which_limit_holds_the_call() -> None:
    claim = SlotClaim("k", 3, "kt", 1, "acme")
    assert build_wait_reason("scrape", claim, TOOL_FULL, 3) == (
        "waiting for a slot: 'scrape' runs at most 3 call(s) at once (3 running)"
    )
    assert build_wait_reason("scrape", claim, TENANT_FULL, 1) == (
        "waiting for a slot: tenant 'acme' runs at most 1 call(s) of 'scrape' at once (1 running)"
    )


def test_the_limits_are_in_the_spec_and_checked_at_definition() -> None:
    registry = ToolRegistry()

    @tool(max_concurrency=3, max_concurrency_per_tenant=1, registry=registry)
    def scrape(url: str) -> str:
        """Fetch a page."""
        return url

    assert (scrape.spec.max_concurrency, scrape.spec.max_concurrency_per_tenant) == (3, 1)
    # A catalogue entry of a release before the limits reads as unlimited.
    assert ToolSpec.model_validate({"name": "old"}).max_concurrency is None
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ToolDefinitionError, match="max_concurrency must be a whole number"):
            tool(name="bad", max_concurrency=bad, registry=registry)(lambda: None)  # type: ignore[arg-type]
