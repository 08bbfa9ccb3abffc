"""The turn queue on a Redis Cluster: what one script does on one Redis, done slot by slot (sans-IO).

On a cluster (`TOOLLOOP_REDIS_CLUSTER`, `workers.keys`) a script may touch the keys of one slot only. A
turn's keys share its slot (the turn id is their hash tag) and the turn queue is cut in shards
(`keys.QueueShard`), each in a slot of its own: its queues and lanes, its homes hash, its active, claiming,
parked and recent indexes and its tenants' running sets. A named tenant's turns all go to its tenant's shard,
where its cap is counted; the default tenant's are spread by turn id (`keys.queue_shard`). So every operation
that moves a turn through the queue is two scripts, one per side, run in an order that leaves nothing behind
when its caller dies between them:

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

Idle claimers block on ready tokens (`keys.ready_tokens`, one list per lane in `{turns}`, the first lane
first), each naming the shard of a turn queued or of a place freed, and pick in that shard; a claimer that
waited a step with no token looks over every shard (`find_queued_shards`), for a turn whose token was lost.
What the turn's own keys say decides; the queue side only points at turns, and whatever points at a turn
that ended or is leased is dropped when met. Conversations (their head, history and lock in a slot of their
own) do not run on a cluster yet: a submit naming one is refused before anything is stored.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.model import TurnRequest, TurnStatus
from orchestrator.store import codec, operations, scripts
from orchestrator.store.effects import Batch, Flow, RedisCommand, ScriptCall, Transaction, parse_reply
from orchestrator.store.operations import CLAIM_SKIP_BUDGET, LEASED_STATUSES, TERMINAL_STATUSES
from orchestrator.store.scripts import ControlResult, ParkResult, SubmitResult, TakeOverResult
from orchestrator.tenant_limits import NO_CAPS, RunningCaps
from workers import keys
from workers.contract import DEFAULT_TENANT
from workers.keys import QueueShard
from workers.scripts import build_notify_command

# --- submitting ------------------------------------------------------------------------------------------


def check_conversation_slot(request: TurnRequest, turn_id: str) -> None:
    """A turn of a conversation must share its conversation's slot (its history, head, lock and waiting
    list are written with the turn's keys): an id `codec.new_turn_id` made does; a caller's own id must have
    been made so too (`ValueError`, before anything is stored)."""
    conversation = request.conversation_id
    if conversation is not None and keys.turn_slot(turn_id) != keys.conversation_slot(conversation):
        raise ValueError(
            f"turn id {turn_id!r} cannot join conversation {conversation!r} on a Redis Cluster "
            "(TOOLLOOP_REDIS_CLUSTER): a conversation's turns share its slot, so leave turn_id out, or make "
            "it with orchestrator.new_turn_id(conversation_id)"
        )


def enqueue(request: TurnRequest, turn_id: str, now: float, *, queued: bool = True) -> ScriptCall[bool]:
    """The queue's side of a submit, in the turn's shard (`enqueue.lua`); False when the turn was queued
    already. Not `queued`: only indexed (active, recent), as a turn that waits behind its conversation's."""
    shard = keys.queue_shard(turn_id, request.tenant)
    keys_ = (
        shard.homes,
        shard.active,
        shard.recent,
        shard.turn_queue(request.priority, request.tenant),
        shard.lane_tenants(request.priority),
    )
    args = (turn_id, repr(now), str(keys.RECENT_TURNS_MAX), request.tenant, request.priority)
    return ScriptCall(scripts.ENQUEUE, keys_, (*args, "1" if queued else ""), lambda reply: bool(int(reply)))


def announce(shard: QueueShard, lane: str, count: int = 1) -> Flow[None]:
    """`count` ready tokens for `shard` in `lane`'s list, in one push: each wakes one idle claimer, which
    picks there. The list is trimmed to `READY_TOKENS_MAX` when a push finds it longer (tokens are hints: a
    sweep finds the rest)."""
    tokens = [str(shard.index)] * count
    length = yield RedisCommand(("RPUSH", keys.ready_tokens(lane), *tokens), parse_reply)
    if int(length) > keys.READY_TOKENS_MAX:
        yield RedisCommand(("LTRIM", keys.ready_tokens(lane), -keys.READY_TOKENS_MAX, -1), parse_reply)


def submit(request: TurnRequest, turn_id: str, now: float) -> Flow[SubmitResult]:
    """Store the turn in its slot (behind its conversation's turn, when another holds the conversation),
    then queue it in its shard and announce it. A submit retried after dying between the two queues the turn
    it left stored but not queued."""
    result: SubmitResult = yield operations.submit(request, turn_id, now)
    if result is SubmitResult.WAITING:
        # Listed and counted as on one Redis; queued by the end of the conversation's turn before it (`end`),
        # whose waiting list keeps it: its keys are kept too.
        yield enqueue(request, turn_id, now, queued=False)
        yield keep(turn_id)
        return result
    if result is SubmitResult.EXISTS and not (yield from _may_queue(request, turn_id)):
        return result
    yield from queue(request, turn_id, now)
    return result


def queue(request: TurnRequest, turn_id: str, now: float) -> Flow[None]:
    """Queue a stored turn in its shard (once) and announce it."""
    if (yield enqueue(request, turn_id, now)):
        yield from announce(keys.queue_shard(turn_id, request.tenant), request.priority)


def keep(turn_id: str) -> Transaction[Any]:
    """Keep the keys a submit gave an expiry until its turn was queued (`submit.lua`)."""
    names = (keys.turn_request(turn_id), keys.turn_status(turn_id), keys.turn_events(turn_id))
    return Transaction(tuple(("PERSIST", name) for name in names), parse_reply)


def _may_queue(request: TurnRequest, turn_id: str) -> Flow[bool]:
    # Whether a stored turn may go to the queue: still queued, and holding its conversation when it has one.
    status: TurnStatus | None = yield operations.get_status(turn_id)
    if status is not TurnStatus.QUEUED:
        return False
    if request.conversation_id is None:
        return True
    holder = yield RedisCommand(("GET", keys.conversation_lock(request.conversation_id)), parse_reply)
    return holder is not None and codec.text(holder) == turn_id


@dataclass(frozen=True)
class Home:
    """Where a turn belongs: its tenant and conversation. Its owner knows them; others read them from its
    request (`read_home`)."""

    tenant: str
    conversation_id: str | None


def parse_home(raw: Any) -> Home:
    """A turn's `Home` from its stored request (the default tenant and none when the request is gone: a sweep,
    which reads every shard, finds what that misses)."""
    try:
        request = json.loads(raw) if raw else {}
    except ValueError:
        request = {}
    tenant = request.get("tenant") if isinstance(request, dict) else None
    conversation = request.get("conversation_id") if isinstance(request, dict) else None
    return Home(
        tenant if isinstance(tenant, str) and tenant else DEFAULT_TENANT,
        conversation if isinstance(conversation, str) else None,
    )


def read_home(turn_id: str) -> RedisCommand[Home]:
    """A turn's `Home`, from its request."""
    return RedisCommand(("GET", keys.turn_request(turn_id)), parse_home)


def find_shard(turn_id: str) -> Flow[QueueShard]:
    """The shard of a turn the caller knows only by id: its tenant's, read from its request."""
    home: Home = yield read_home(turn_id)
    return keys.queue_shard(turn_id, home.tenant)


# --- claiming --------------------------------------------------------------------------------------------


def _parse_pick(reply: Any) -> str | codec.ClaimAgain | None:
    if not isinstance(reply, list):
        return codec.CLAIM_AGAIN if int(reply or 0) == 2 else None
    return codec.text(reply[1])


def build_shard_caps(caps: RunningCaps) -> RunningCaps:
    """The caps a shard's pick holds tenants to. A named tenant's turns are all in one shard: its cap as it
    is. The default tenant's are spread over every shard, which counts its own: its cap is shared out
    (rounded up, so a cap is never 0 in a shard)."""
    default_cap = caps.by_tenant.get(DEFAULT_TENANT, caps.others)
    if not default_cap or keys.queue_shard_count() == 1:
        return caps
    shared = math.ceil(default_cap / keys.queue_shard_count())
    return RunningCaps({**caps.by_tenant, DEFAULT_TENANT: shared}, caps.others)


def pick(shard: QueueShard, caps: RunningCaps = NO_CAPS) -> ScriptCall[str | codec.ClaimAgain | None]:
    """The next queued turn's id in `shard`, put in its claiming list and its tenant's running set
    (`pick.lua`)."""
    caps = build_shard_caps(caps)
    keys_ = [shard.queue, shard.parked, shard.claiming, shard.homes]
    keys_ += [shard.lane_tenants(lane) for lane in keys.TURN_LANES]
    lane_queue_prefix = shard.turn_queue("batch", "\0").split("batch:\0")[0]
    running_prefix, running_suffix = shard.tenant_running("\0").split("\0")
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
        keys.turn_events(turn_id),
    )
    args = (
        orchestrator_id,
        str(ttl_ms),
        TurnStatus.QUEUED.value,
        TurnStatus.RUNNING.value,
        TERMINAL_STATUSES,
    )
    return ScriptCall(scripts.LEASE, keys_, args, _parse_lease(turn_id))


def unpick(shard: QueueShard, turn_id: str, tenant: str, ended: bool) -> ScriptCall[Any]:
    """Settle a pick (`unpick.lua`)."""
    keys_ = (shard.claiming, shard.tenant_running(tenant))
    return ScriptCall(scripts.UNPICK, keys_, (turn_id, "1" if ended else ""), parse_reply)


def claim_in(
    shard: QueueShard, orchestrator_id: str, ttl_ms: int, caps: RunningCaps = NO_CAPS
) -> Flow[codec.ClaimedTurn | None]:
    """The next turn of `shard`, leased: pick, lease, settle, again while what was picked could not be leased
    (it ended, or another orchestrator holds it); None when the shard has nothing claimable."""
    while True:
        picked: str | codec.ClaimAgain | None = yield pick(shard, caps)
        if picked is None:
            return None
        if not isinstance(picked, str):
            continue
        leased: codec.ClaimedTurn | int = yield lease(orchestrator_id, picked, ttl_ms)
        request = leased.request if isinstance(leased, codec.ClaimedTurn) else None
        tenant = request.tenant if request is not None else (yield home_tenant(shard, picked))
        yield unpick(shard, picked, tenant, ended=leased == 0)
        if isinstance(leased, codec.ClaimedTurn):
            return leased


def home_tenant(shard: QueueShard, turn_id: str) -> RedisCommand[str]:
    """The tenant the homes hash has for an active turn (the default tenant's when it has none)."""

    def parse(raw: Any) -> str:
        value = codec.text(raw) if raw is not None else ""
        return value.split(" ", 1)[1] if " " in value else DEFAULT_TENANT

    return RedisCommand(("HGET", shard.homes, turn_id), parse)


def wait_ready(block_s: float) -> RedisCommand[QueueShard | None]:
    """Block up to `block_s` for a ready token, the first lane's first: the shard it names, None when none
    came (or it names no shard of this layout)."""

    def parse(reply: Any) -> QueueShard | None:
        if reply is None:
            return None
        try:
            index = int(codec.text(reply[1]))
        except ValueError:
            return None
        return QueueShard(index) if 0 <= index < keys.queue_shard_count() else None

    lists = (keys.ready_tokens(lane) for lane in keys.TURN_LANES)
    return RedisCommand(("BLPOP", *lists, f"{block_s:.3f}"), parse)


def find_queued_shards() -> Batch[list[QueueShard]]:
    """The shards with a lane or a queue to look at, from a random one on (claimers spread), in one round
    trip: what a claimer reads when a step passed with no token."""
    shards = keys.all_queue_shards()
    first = random.randrange(len(shards))
    shards = shards[first:] + shards[:first]
    exists = tuple(
        RedisCommand(("EXISTS", s.queue, *(s.lane_tenants(lane) for lane in keys.TURN_LANES)), int)
        for s in shards
    )
    return Batch(exists, lambda found: [s for s, n in zip(shards, found, strict=True) if n])


# --- a turn's end ----------------------------------------------------------------------------------------


def leave(turn_id: str, shard: QueueShard) -> ScriptCall[tuple[bool, bool]]:
    """The queue's side of a turn's end (`leave.lua`): whether the turn was still active there, and whether
    it freed a place in its tenant's running set."""
    running_prefix, running_suffix = shard.tenant_running("\0").split("\0")
    keys_ = (shard.homes, shard.active, shard.claiming)
    args = (turn_id, running_prefix, running_suffix)
    return ScriptCall(scripts.LEAVE, keys_, args, lambda reply: (bool(int(reply[0])), bool(int(reply[1]))))


def end(turn_id: str, now: float, shard: QueueShard | None = None, home: Home | None = None) -> Flow[bool]:
    """A turn's end on the queue's side, after its terminal write: the next turn of its conversation queued
    (it holds the conversation from that write on), then the turn out of its shard, and a ready token pushed
    when that freed a place. True when the turn was still active there. Run again by the sweep for a turn
    still active (its owner died in between): each step is done once. `home`: the turn's, when the caller
    knows it (its owner), else read from its request."""
    if home is None:
        home = yield read_home(turn_id)
    if home.conversation_id is not None:
        yield from hand_over(turn_id, home.conversation_id, now)
    shard = shard or keys.queue_shard(turn_id, home.tenant)
    removed, freed = yield leave(turn_id, shard)
    if freed:
        yield from announce(shard, "normal")
    return bool(removed)


def hand_over(turn_id: str, conversation_id: str, now: float) -> Flow[None]:
    """Queue the turn holding the conversation after `turn_id`'s end, if it is still to be queued."""
    raw = yield RedisCommand(("GET", keys.conversation_lock(conversation_id)), parse_reply)
    holder = codec.text(raw) if raw is not None else None
    if holder is None or holder == turn_id:
        return
    status: TurnStatus | None = yield operations.get_status(holder)
    if status is not TurnStatus.QUEUED:
        return
    request: TurnRequest | None = yield operations.get_request(holder)
    if request is not None:
        yield from queue(request, holder, now)


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


class QueueSide:
    """What one shard of the queue holds, read at one moment (`read_queue.lua`)."""

    def __init__(self, shard: QueueShard, reply: Any) -> None:
        claiming, active, parked = ([codec.text(i) for i in part or []] for part in reply)
        self.shard = shard
        self.claiming: list[str] = claiming
        self.active: list[str] = active
        self.parked: set[str] = set(parked)


def read_queue_sides() -> Batch[list[QueueSide]]:
    """Every shard's claiming list, active index and parked set (each shard at one moment), in one round
    trip."""
    shards = keys.all_queue_shards()
    reads = tuple(
        ScriptCall(scripts.READ_QUEUE, (s.claiming, s.active, s.parked), (), parse_reply) for s in shards
    )
    return Batch(reads, lambda replies: [QueueSide(s, r) for s, r in zip(shards, replies, strict=True)])


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


def find_orphans(limit: int, now: float) -> Flow[list[str]]:
    """`operations.find_orphans` on a cluster, which also sweeps the queue side: an ended turn still active
    there (its owner died before its end was done there) is ended now (`end`), and an ended id in a claiming
    list goes."""
    sides: list[QueueSide] = yield read_queue_sides()
    shard_of: dict[str, QueueShard] = {}
    in_claiming: set[str] = set()
    for side in sides:
        for turn_id in side.claiming:
            shard_of.setdefault(turn_id, side.shard)
            in_claiming.add(turn_id)
        for turn_id in side.active:
            if turn_id not in side.parked:
                shard_of.setdefault(turn_id, side.shard)
    candidates = list(shard_of)
    if not candidates:
        return []
    turn_sides: list[tuple[str | None, bool]] = yield _read_turn_sides(candidates)
    terminal = set(TERMINAL_STATUSES.split())
    leased_statuses = set(LEASED_STATUSES.split())
    found: list[str] = []
    ended: list[str] = []
    for turn_id, (status, leased) in zip(candidates, turn_sides, strict=True):
        if status is None or status in terminal:
            ended.append(turn_id)
        elif not leased and (turn_id in in_claiming or status in leased_statuses) and len(found) < limit:
            found.append(turn_id)
    for turn_id in ended:
        yield from end(turn_id, now, shard_of[turn_id])
    return found


def take_over(orchestrator_id: str, turn_id: str, ttl_ms: int) -> Flow[TakeOverResult]:
    """`operations.take_over` on a cluster: whether the id is in a shard's claiming list is read first (every
    shard, one round trip), and it is taken out after."""
    shards = keys.all_queue_shards()
    positions = yield Batch(
        tuple(RedisCommand(("LPOS", s.claiming, turn_id), parse_reply) for s in shards), list
    )
    claimed_in = [s for s, position in zip(shards, positions, strict=True) if position is not None]
    result: TakeOverResult = yield operations.take_over(
        orchestrator_id, turn_id, ttl_ms, claiming=bool(claimed_in)
    )
    if result is TakeOverResult.TAKEN and claimed_in:
        yield Batch(
            tuple(RedisCommand(("LREM", s.claiming, 0, turn_id), parse_reply) for s in claimed_in),
            parse_reply,
        )
    return result


def read_active_statuses() -> Flow[list[tuple[str, TurnStatus | None]]]:
    """`operations.read_active_statuses` on a cluster: every shard's active index, then each turn's status."""
    sides: list[QueueSide] = yield read_queue_sides()
    active = [turn_id for side in sides for turn_id in side.active]
    if not active:
        return []
    turn_sides: list[tuple[str | None, bool]] = yield _read_turn_sides(active)
    out: list[tuple[str, TurnStatus | None]] = []
    for turn_id, (status, _) in zip(active, turn_sides, strict=True):
        try:
            out.append((turn_id, codec.parse_status(status)))
        except ValueError:
            out.append((turn_id, None))
    return out


# --- parking and control ---------------------------------------------------------------------------------


def park(orchestrator_id: str, turn_id: str, look_at: float, control_after: str) -> Flow[ParkResult]:
    """`operations.park` on a cluster: into its shard's parked set, then the lease given up (`park.lua`), and
    out of the set again unless that parked it."""
    shard: QueueShard = yield from find_shard(turn_id)
    yield RedisCommand(("ZADD", shard.parked, repr(look_at), turn_id), parse_reply)
    result: ParkResult = yield operations.park(orchestrator_id, turn_id, look_at, control_after)
    if result is not ParkResult.PARKED:
        yield RedisCommand(("ZREM", shard.parked, turn_id), parse_reply)
    return result


def unpark(turn_id: str) -> Flow[bool]:
    """Queue a parked turn an answer came for, in its shard (`unpark.lua`), and announce it."""
    shard: QueueShard = yield from find_shard(turn_id)
    woken = yield ScriptCall(scripts.UNPARK, (shard.parked, shard.queue), (turn_id,), lambda r: bool(int(r)))
    if woken:
        yield from announce(shard, "normal")
    return bool(woken)


def wake_parked(due_by: float, limit: int) -> Flow[list[str]]:
    """`operations.wake_parked` on a cluster: every shard's due turns queued (`wake.lua`, one round trip),
    each announced."""
    shards = keys.all_queue_shards()
    calls = tuple(operations.wake_parked(due_by, limit, s.parked, s.queue) for s in shards)
    woken: list[list[str]] = yield Batch(calls, list)
    for shard, ids in zip(shards, woken, strict=True):
        if ids:
            yield from announce(shard, "normal", len(ids))
    return [turn_id for ids in woken for turn_id in ids][:limit]


def tell_owner(turn_id: str, told: operations.OwnerToTell) -> Flow[ControlResult]:
    """After `control.lua` on a cluster: the owner it read told in its inbox (the fields control.lua writes
    on one Redis), or the turn woken when it had none (parked; or between owners, when `unpark.lua` finds
    nothing to do and the next owner reads the control stream as it adopts the turn)."""
    if told.owner is not None:
        fields = {"kind": "control", "turn": turn_id, "control": told.kind, "call": told.call_id}
        fields |= {"approved": told.approved, "id": told.entry_id}
        yield RedisCommand(build_notify_command(told.owner, fields), parse_reply)
    else:
        yield from unpark(turn_id)
    return ControlResult.RECORDED
