"""The turn queue on a Redis Cluster: what one script does on one Redis, done slot by slot (sans-IO).

On a cluster (`TOOLLOOP_REDIS_CLUSTER`, `workers.keys`) a script may touch the keys of one slot only. A
turn's keys share its slot (the turn id is their hash tag) and the turn queue's structures share another
(`{turns}`): the queues and lanes, the homes hash, the active, claiming, parked and recent indexes and the
tenants' running sets. So every operation that moves a turn through the queue is two scripts, one per side,
run in an order that leaves nothing behind when its caller dies between them:

    submit   the turn's keys (submit.lua)            then  enqueue.lua: homes, active, recent, queue;
             a retried submit that finds the turn still queued enqueues it again (enqueue.lua does it once)
    claim    pick.lua: the next id, into the         then  lease.lua: lease it, read its request,
             claiming list and its running set       then  unpick.lua: out of the claiming list;
             a claimer that dies after the pick leaves the id in the claiming list: `find_orphans` sees it
    end      save_outcome.lua: outcome, status,      then  leave.lua: out of homes, active, running set;
             event                                         an owner that dies first leaves an ended turn
                                                           active: `find_orphans` runs leave.lua for it
    park     into the parked set                     then  park.lua gives up the lease; out of the set again
             when it refuses, so an answer coming in between finds the owner (told) or the parked turn (woken)
    control  control.lua: recorded, owner read       then  the owner's inbox told, or unpark.lua

What the turn's own keys say decides; the queue side only points at turns, and whatever points at a turn
that ended or is leased is dropped when met. Conversations (their head, history and lock in a slot of their
own) do not run on a cluster yet: a submit naming one is refused before anything is stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestrator.model import TurnRequest, TurnStatus
from orchestrator.store import codec, operations, scripts
from orchestrator.store.effects import Batch, Flow, RedisCommand, ScriptCall, Transaction, parse_reply
from orchestrator.store.operations import CLAIM_SKIP_BUDGET, LEASED_STATUSES, TERMINAL_STATUSES
from orchestrator.store.scripts import ControlResult, ParkResult, SubmitResult, TakeOverResult
from orchestrator.tenant_limits import NO_CAPS, RunningCaps
from workers import keys
from workers.contract import DEFAULT_TENANT
from workers.scripts import build_notify_command

# --- submitting ------------------------------------------------------------------------------------------


def refuse_conversation(request: TurnRequest) -> None:
    """Refuse, before anything is stored, what a cluster does not run yet: a turn of a conversation
    (`ValueError`, as every other rule of a request)."""
    if request.conversation_id is not None:
        raise ValueError(
            "conversation_id is not supported on a Redis Cluster yet (TOOLLOOP_REDIS_CLUSTER): submit the "
            "turn without it and pass the history in its messages, or run on one Redis"
        )


def enqueue(request: TurnRequest, turn_id: str, now: float) -> ScriptCall[bool]:
    """The queue's side of a submit (`enqueue.lua`); False when the turn was queued already."""
    keys_ = [keys.TURNS_HOMES, keys.TURNS_ACTIVE, keys.TURNS_RECENT]
    keys_ += [keys.turn_queue(request.priority, request.tenant), keys.lane_tenants(request.priority)]
    keys_ += [keys.TURNS_READY]
    args = [turn_id, repr(now), str(keys.RECENT_TURNS_MAX), request.tenant, request.priority]
    args += [str(keys.READY_TOKENS_MAX)]
    return ScriptCall(scripts.ENQUEUE, tuple(keys_), tuple(args), lambda reply: bool(int(reply)))


def submit(request: TurnRequest, turn_id: str, now: float) -> Flow[SubmitResult]:
    """Store the turn in its slot, then queue it in the queue's (a submit retried after dying between the two
    queues the turn it left stored but not queued)."""
    result: SubmitResult = yield operations.submit(request, turn_id, now)
    if result is SubmitResult.EXISTS:
        status: TurnStatus | None = yield operations.get_status(turn_id)
        if status is not TurnStatus.QUEUED:
            return result
    yield enqueue(request, turn_id, now)
    return result


# --- claiming --------------------------------------------------------------------------------------------


def _parse_pick(reply: Any) -> str | codec.ClaimAgain | None:
    if not isinstance(reply, list):
        return codec.CLAIM_AGAIN if int(reply or 0) == 2 else None
    return codec.text(reply[1])


def pick(caps: RunningCaps = NO_CAPS) -> ScriptCall[str | codec.ClaimAgain | None]:
    """The next queued turn's id, put in the claiming list and its tenant's running set (`pick.lua`)."""
    keys_ = [keys.TURN_QUEUE, keys.TURNS_PARKED, keys.TURNS_CLAIMING, keys.TURNS_HOMES]
    keys_ += [keys.lane_tenants(lane) for lane in keys.TURN_LANES]
    lane_queue_prefix = keys.turn_queue("batch", "\0").split("batch:\0")[0]
    running_prefix, running_suffix = keys.tenant_running("\0").split("\0")
    args = [" ".join(keys.TURN_LANES), lane_queue_prefix, running_prefix, running_suffix]
    args += [
        " ".join(f"{t} {n}" for t, n in caps.by_tenant.items()),
        str(caps.others),
        str(CLAIM_SKIP_BUDGET),
    ]
    return ScriptCall(scripts.PICK, tuple(keys_), tuple(args), _parse_pick)


def _parse_lease(turn_id: str) -> Any:
    def parse(reply: Any) -> codec.ClaimedTurn | int:
        if int(reply[0]) != 1:
            return int(reply[0])
        return codec.parse_claim([1, turn_id, reply[1], reply[2]])  # type: ignore[return-value]

    return parse


def lease(orchestrator_id: str, turn_id: str, ttl_ms: int) -> ScriptCall[codec.ClaimedTurn | int]:
    """Lease a picked turn and read its request (`lease.lua`): the claimed turn, or 0 (it ended) or -1
    (held)."""
    keys_ = (
        keys.turn_status(turn_id),
        keys.turn_lease(turn_id),
        keys.turn_request(turn_id),
        keys.turn_state(turn_id),
    )
    args = (
        orchestrator_id,
        str(ttl_ms),
        TurnStatus.QUEUED.value,
        TurnStatus.RUNNING.value,
        TERMINAL_STATUSES,
    )
    return ScriptCall(scripts.LEASE, keys_, args, _parse_lease(turn_id))


def unpick(turn_id: str, tenant: str, ended: bool) -> ScriptCall[Any]:
    """Settle a pick (`unpick.lua`)."""
    keys_ = (keys.TURNS_CLAIMING, keys.tenant_running(tenant))
    return ScriptCall(scripts.UNPICK, keys_, (turn_id, "1" if ended else ""), parse_reply)


def claim(
    orchestrator_id: str, ttl_ms: int, caps: RunningCaps = NO_CAPS
) -> Flow[codec.ClaimedTurn | codec.ClaimAgain | None]:
    """`operations.claim` on a cluster: pick, lease, settle; `CLAIM_AGAIN` when the id picked could not be
    leased (it ended, or another orchestrator holds it)."""
    picked: str | codec.ClaimAgain | None = yield pick(caps)
    if not isinstance(picked, str):
        return picked
    leased: codec.ClaimedTurn | int = yield lease(orchestrator_id, picked, ttl_ms)
    request = leased.request if isinstance(leased, codec.ClaimedTurn) else None
    tenant = request.tenant if request is not None else (yield home_tenant(picked))
    yield unpick(picked, tenant, ended=leased == 0)
    return leased if isinstance(leased, codec.ClaimedTurn) else codec.CLAIM_AGAIN


def home_tenant(turn_id: str) -> RedisCommand[str]:
    """The tenant the homes hash has for an active turn (the default tenant's when it has none)."""

    def parse(raw: Any) -> str:
        value = codec.text(raw) if raw is not None else ""
        return value.split(" ", 1)[1] if " " in value else DEFAULT_TENANT

    return RedisCommand(("HGET", keys.TURNS_HOMES, turn_id), parse)


# --- a turn's end ----------------------------------------------------------------------------------------


def leave(turn_id: str) -> ScriptCall[bool]:
    """The queue's side of a turn's end (`leave.lua`); True when the turn was still active there."""
    running_prefix, running_suffix = keys.tenant_running("\0").split("\0")
    keys_ = (keys.TURNS_HOMES, keys.TURNS_ACTIVE, keys.TURNS_CLAIMING, keys.TURNS_READY)
    args = (turn_id, running_prefix, running_suffix, str(keys.READY_TOKENS_MAX))
    return ScriptCall(scripts.LEAVE, keys_, args, lambda reply: bool(int(reply)))


# --- leases, orphans, the orchestrators ------------------------------------------------------------------


def renew_leases(orchestrator_id: str, turn_ids: Sequence[str], ttl_ms: int) -> Batch[set[str]]:
    """`operations.renew_leases` on a cluster: one `renew.lua` per lease (each in its turn's slot), in one
    pipeline."""
    ids = list(turn_ids)
    calls = tuple(operations.renew_leases(orchestrator_id, [turn_id], ttl_ms) for turn_id in ids)
    return Batch(calls, lambda lost: {t for t, gone in zip(ids, lost, strict=True) if gone})


def keep_inbox(orchestrator_id: str, ttl_ms: int, now: float) -> Batch[bool]:
    """`operations.keep_inbox` on a cluster: the inbox kept, and the orchestrators' set trimmed, side by
    side."""
    trim = RedisCommand(
        ("ZREMRANGEBYSCORE", keys.ORCHESTRATORS, "-inf", f"({now - ttl_ms / 1000!r}"), parse_reply
    )
    return Batch(
        (operations.keep_inbox(orchestrator_id, ttl_ms, now), trim), lambda replies: bool(replies[0])
    )


def unregister(orchestrator_id: str) -> Batch[Any]:
    """`operations.unregister` on a cluster: the two keys are in different slots."""
    commands = (
        RedisCommand(("ZREM", keys.ORCHESTRATORS, orchestrator_id), parse_reply),
        RedisCommand(("DEL", keys.inbox(orchestrator_id)), parse_reply),
    )
    return Batch(commands, parse_reply)


def _read_queue_side() -> Transaction[tuple[list[str], list[str], set[str]]]:
    # The claiming list, the active index and the parked set, at one moment.
    commands = (
        ("LRANGE", keys.TURNS_CLAIMING, 0, -1),
        ("ZRANGE", keys.TURNS_ACTIVE, 0, -1),
        ("ZRANGE", keys.TURNS_PARKED, 0, -1),
    )

    def parse(replies: list[Any]) -> tuple[list[str], list[str], set[str]]:
        claiming, active, parked = ([codec.text(i) for i in reply or []] for reply in replies)
        return claiming, active, set(parked)

    return Transaction(commands, parse)


def _read_turn_sides(turn_ids: Sequence[str]) -> Batch[list[tuple[str | None, bool]]]:
    # Each turn's status and whether it is leased, from its own slot.
    ops: list[RedisCommand[Any]] = []
    for turn_id in turn_ids:
        ops.append(
            RedisCommand(("GET", keys.turn_status(turn_id)), lambda raw: codec.text(raw) if raw else None)
        )
        ops.append(RedisCommand(("EXISTS", keys.turn_lease(turn_id)), lambda raw: bool(int(raw))))

    def combine(replies: list[Any]) -> list[tuple[str | None, bool]]:
        return list(zip(replies[::2], replies[1::2], strict=True))

    return Batch(tuple(ops), combine)


def find_orphans(limit: int) -> Flow[list[str]]:
    """`operations.find_orphans` on a cluster, which also sweeps the queue side: an ended turn still active
    there (its owner died before `leave.lua`) leaves it now, and an ended id in the claiming list goes."""
    claiming, active, parked = yield _read_queue_side()
    candidates = list(dict.fromkeys([*claiming, *(t for t in active if t not in parked)]))
    if not candidates:
        return []
    sides: list[tuple[str | None, bool]] = yield _read_turn_sides(candidates)
    terminal = set(TERMINAL_STATUSES.split())
    leased_statuses = set(LEASED_STATUSES.split())
    in_claiming = set(claiming)
    found: list[str] = []
    ended: list[str] = []
    for turn_id, (status, leased) in zip(candidates, sides, strict=True):
        if status is None or status in terminal:
            ended.append(turn_id)
        elif not leased and (turn_id in in_claiming or status in leased_statuses) and len(found) < limit:
            found.append(turn_id)
    if ended:
        yield Batch(tuple(leave(t) for t in ended), parse_reply)
    return found


def take_over(orchestrator_id: str, turn_id: str, ttl_ms: int) -> Flow[TakeOverResult]:
    """`operations.take_over` on a cluster: whether the id is in the claiming list is read first, and it is
    taken out after."""
    position = yield RedisCommand(("LPOS", keys.TURNS_CLAIMING, turn_id), parse_reply)
    claiming = position is not None
    result: TakeOverResult = yield operations.take_over(orchestrator_id, turn_id, ttl_ms, claiming=claiming)
    if result is TakeOverResult.TAKEN and claiming:
        yield RedisCommand(("LREM", keys.TURNS_CLAIMING, 0, turn_id), parse_reply)
    return result


def read_active_statuses() -> Flow[list[tuple[str, TurnStatus | None]]]:
    """`operations.read_active_statuses` on a cluster: the active index, then each turn's status."""
    _, active, _ = yield _read_queue_side()
    if not active:
        return []
    sides: list[tuple[str | None, bool]] = yield _read_turn_sides(active)
    out: list[tuple[str, TurnStatus | None]] = []
    for turn_id, (status, _) in zip(active, sides, strict=True):
        try:
            out.append((turn_id, codec.parse_status(status)))
        except ValueError:
            out.append((turn_id, None))
    return out


# --- parking and control ---------------------------------------------------------------------------------


def park(orchestrator_id: str, turn_id: str, look_at: float, control_after: str) -> Flow[ParkResult]:
    """`operations.park` on a cluster: into the parked set, then the lease given up (`park.lua`), and out of
    the set again unless that parked it."""
    yield RedisCommand(("ZADD", keys.TURNS_PARKED, repr(look_at), turn_id), parse_reply)
    result: ParkResult = yield operations.park(orchestrator_id, turn_id, look_at, control_after)
    if result is not ParkResult.PARKED:
        yield RedisCommand(("ZREM", keys.TURNS_PARKED, turn_id), parse_reply)
    return result


def unpark(turn_id: str) -> ScriptCall[bool]:
    """Queue a parked turn an answer came for (`unpark.lua`)."""
    return ScriptCall(
        scripts.UNPARK, (keys.TURNS_PARKED, keys.TURN_QUEUE), (turn_id,), lambda r: bool(int(r))
    )


def tell_owner(turn_id: str, told: operations.OwnerToTell) -> Flow[ControlResult]:
    """After `control.lua` on a cluster: the owner it read told in its inbox (the fields control.lua writes
    on one Redis), or the turn woken when it had none (parked; or between owners, when `unpark.lua` finds
    nothing to do and the next owner reads the control stream as it adopts the turn)."""
    if told.owner is not None:
        fields = {"kind": "control", "turn": turn_id, "control": told.kind, "call": told.call_id}
        fields |= {"approved": told.approved, "id": told.entry_id}
        yield RedisCommand(build_notify_command(told.owner, fields), parse_reply)
    else:
        yield unpark(turn_id)
    return ControlResult.RECORDED
