"""Per-tool concurrency limits: `@tool(max_concurrency=N)` and `@tool(max_concurrency_per_tenant=N)`.

A tool that calls a fragile service (a scraper, a legacy API allowing three connections) must not run on as
many pool processes as the fleet has. Each limit is a set of slots in Redis shared by every worker
(`keys.tool_slots`, `keys.tenant_slots`), taken and given back by `slots.lua`, atomically for both limits:

- **Where a slot sits in a call's life.** An execution takes its slots after the deadline check and before
  its start script (`workers.execution`), so a call that waits has not started: no attempt is counted, no
  `tool_started` goes out, and the orchestrator arms no lost-call timer for it. The slot is given back when
  the execution ends, whatever its end (an outcome, a retry, a duplicate delivery that runs nothing); for a
  pool process that cannot give it back, by the worker's parent, with its running guard (`workers.parent`).
- **Slots expire with their execution.** A slot entry is the execution's token (`workers.fence`) scored by
  when it expires: as long as the running guard lives (the hard limit and a margin), the longest an
  execution can hold it. A worker killed whole (SIGKILL, a lost machine) frees its slots then, with nothing
  to clean up: each acquire drops the expired entries first.
- **A call past a limit waits without a pool process.** It is handed back to Celery (`RetryLater`) with a
  short countdown, growing with how long the call has waited (`build_wait_countdown_s`, 0.1 s to 2 s): the
  same call, the same dispatch attempt, so the fence and idempotency are not disturbed. Waiting in place
  would hold a pool process other tools could use, and eat the call's own time limits, which run from the
  delivery's start; a re-published call costs a broker round trip a poll and shows in Flower as RETRY
  ("waiting for a slot: …"). The turn's deadline still applies: a retry past it is answered
  `deadline_exceeded` without running, and its `expires` ends it in the queue.
- **The turn is told once.** A call that waits adds one `tool_waiting_for_slot` event to its turn's stream
  per dispatch attempt (`slot_waiting.lua`); its `tool_started` ends the wait.

Slots are not handed out in order: a freed slot goes to whichever waiting call polls first. Each worker
enforces the limits its own tool spec states, so workers of two releases with different limits each hold
to their own during a deploy.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

from workers import keys, scripts
from workers.contract import ToolCallRequest, ToolSpec
from workers.progress import build_event_fields, build_model_call_id
from workers.redis_retry import RedisRetry

logger = logging.getLogger(__name__)

EVENT_NAME = "tool_waiting_for_slot"
# A waiting call polls again after a quarter of how long it has waited, within these bounds (seconds).
WAIT_COUNTDOWN_MIN_S = 0.1
WAIT_COUNTDOWN_MAX_S = 2.0


@dataclass(frozen=True)
class SlotClaim:
    """The slots one call of a tool needs: the key and limit of each of its tool's limits ('' and 0: none)."""

    tool_key: str
    tool_limit: int
    tenant_key: str
    tenant_limit: int
    tenant: str

    @property
    def keys(self) -> tuple[str, str]:
        return self.tool_key, self.tenant_key


def build_slot_claim(spec: ToolSpec, tenant: str) -> SlotClaim | None:
    """The slots a call of `spec` for `tenant` takes; None for a tool without limits (it takes none)."""
    fleet, per_tenant = spec.max_concurrency, spec.max_concurrency_per_tenant
    if fleet is None and per_tenant is None:
        return None
    return SlotClaim(
        tool_key=keys.tool_slots(spec.name) if fleet is not None else "",
        tool_limit=fleet or 0,
        tenant_key=keys.tenant_slots(spec.name, tenant) if per_tenant is not None else "",
        tenant_limit=per_tenant or 0,
        tenant=tenant,
    )


def build_slot_script_keys(slot_keys: tuple[str, str]) -> list[str]:
    """The KEYS of `slots.lua` for a call's slot keys ('' for a limit its tool does not have): as they are on
    one Redis; on a Redis Cluster a '' is the other key again, since every key of a script must be in one slot
    and '' is a key of slot 0 (both slot keys are in the tool's). The script leaves a limit of 0 alone and
    releases a key given twice once."""
    tool_key, tenant_key = slot_keys
    if keys.is_cluster_layout():
        return [tool_key or tenant_key, tenant_key or tool_key]
    return [tool_key, tenant_key]


def build_all_slot_keys(tool: str, tenant: str) -> tuple[str, str]:
    """Both slot keys a call of `tool` for `tenant` may hold: what the worker's parent releases, not knowing
    the tool's limits."""
    return keys.tool_slots(tool), keys.tenant_slots(tool, tenant)


def build_wait_countdown_s(waited_s: float, jitter: float) -> float:
    """How long a call that found no slot waits before it looks again: a quarter of how long it has waited,
    within `WAIT_COUNTDOWN_MIN_S`..`WAIT_COUNTDOWN_MAX_S`, with equal jitter (half to all of it)."""
    step = min(max(waited_s / 4, WAIT_COUNTDOWN_MIN_S), WAIT_COUNTDOWN_MAX_S)
    return step / 2 + step / 2 * min(max(jitter, 0.0), 1.0)


def build_wait_reason(tool: str, claim: SlotClaim, result: scripts.SlotResult, held: int) -> str:
    """Why a call waits, as Flower shows its retry and the log has it."""
    if result is scripts.SlotResult.TENANT_FULL:
        return (
            f"waiting for a slot: tenant '{claim.tenant}' runs at most {claim.tenant_limit} call(s) of "
            f"'{tool}' at once ({held} running)"
        )
    return f"waiting for a slot: '{tool}' runs at most {claim.tool_limit} call(s) at once ({held} running)"


def build_waiting_event_data(
    request: ToolCallRequest, claim: SlotClaim, result: scripts.SlotResult, held: int
) -> dict[str, Any]:
    """The data of a `tool_waiting_for_slot` event: the model's call id, the tool, which limit holds it."""
    per_tenant = result is scripts.SlotResult.TENANT_FULL
    return {
        "call_id": build_model_call_id(request.turn_id or "", request.call_id),
        "tool": request.tool,
        "limit": "max_concurrency_per_tenant" if per_tenant else "max_concurrency",
        "max_concurrency": claim.tenant_limit if per_tenant else claim.tool_limit,
        "running": held,
        "tenant": claim.tenant,
    }


class SlotStore:
    """The slot scripts on one Redis client."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._slots = client.register_script(scripts.SLOTS.source)
        self._waiting = client.register_script(scripts.SLOT_WAITING.source)

    def acquire(
        self, claim: SlotClaim, holder: str, *, ttl_s: float, retry: RedisRetry | None = None
    ) -> tuple[scripts.SlotResult, int]:
        """Take the claim's slots for the execution `holder`: (ACQUIRED, 0), or (TOOL_FULL | TENANT_FULL,
        slots held). Safe to repeat per holder; with `retry`, tried again while Redis is unavailable."""
        args: list[str | int] = [
            "acquire",
            holder,
            claim.tool_limit,
            claim.tenant_limit,
            max(int(ttl_s * 1000), 1),
        ]

        def once(_failures: int) -> Any:
            return self._slots(keys=build_slot_script_keys(claim.keys), args=args)

        reply = retry.call(once, "a concurrency slot") if retry is not None else once(0)
        return scripts.SlotResult(int(reply[0])), int(reply[1])

    def release(self, slot_keys: tuple[str, str], holder: str, *, prefix: bool = False) -> int:
        """Give back the slots `holder` holds in `slot_keys` (`prefix`: those of any token starting with it);
        how many."""
        script_keys = build_slot_script_keys(slot_keys)
        return int(self._slots(keys=script_keys, args=["release", holder, "1" if prefix else ""]))

    def tell_waiting(
        self, request: ToolCallRequest, claim: SlotClaim, result: scripts.SlotResult, held: int
    ) -> scripts.SlotWaitingResult | None:
        """Add the call's `tool_waiting_for_slot` event to its turn's stream, once per dispatch attempt;
        None outside a turn. Raises what Redis raises (the caller decides what a failure costs)."""
        turn_id = request.turn_id
        if turn_id is None:
            return None
        data = build_waiting_event_data(request, claim, result, held)
        fields = build_event_fields(EVENT_NAME, data, time.time())
        reply = self._waiting(
            keys=[
                keys.turn_events(turn_id),
                keys.turn_outcome(turn_id),
                keys.outcome(request.call_id, turn_id),
                keys.slot_waiting_told(request.call_id, turn_id),
            ],
            args=[
                request.attempt,
                keys.SLOT_WAITING_TOLD_TTL_S,
                keys.EVENTS_MAXLEN,
                fields["name"],
                fields["at"],
                fields["data"],
            ],
        )
        return scripts.SlotWaitingResult(int(reply))


_stores: dict[int, SlotStore] = {}
_stores_lock = threading.Lock()


def get_slot_store(client: redis.Redis) -> SlotStore:
    """The process's `SlotStore` on `client` (its scripts registered once)."""
    with _stores_lock:
        store = _stores.get(id(client))
        if store is None or store.client is not client:
            store = _stores[id(client)] = SlotStore(client)
        return store
