"""Every Redis key toolloop uses, with its TTL and stream cap, in one place.

Workers are the leaf package, so the storage layout lives here and the orchestrator imports it; no other
module spells a key. Keys share the prefix `toolloop:` so that one Redis can hold several apps. The atomic
scripts over these keys are `.lua` files (`workers.scripts`), which get every key and cap below as KEYS/ARGV.

Two layouts, one per process (`use_cluster_layout`, from `TOOLLOOP_REDIS_CLUSTER` at import). On one Redis
(or Sentinel) keys are named as every earlier release named them, so that releases mix during a deploy. On a
Redis Cluster a key carries a hash tag (`{…}`: only that part picks the slot) so that what one script touches
lies in one slot: every key of a turn, its calls' keys included, is tagged with the turn id; a direct call's
keys with its call id; a conversation's with the conversation id; the turn queue's structures (queues, lanes,
the active, parked, claiming and recent indexes, the tenants' running sets) share their shard's tag; a
concurrency-limited tool's slots its tool name; an idempotency record and its lock their digest; the model and
tenant budgets `{limits}`; the catalogue's hashes (workers, tools served, agents) `{catalogue}`. Everything
else is a key of its own.

On a cluster the turn queue is cut in `QUEUE_SHARDS` shards (`QueueShard`), each with its own queues, lanes,
indexes and running sets under a tag of its own, so that no one slot carries every submit, claim and end: a
named tenant's turns all go to its tenant's shard (its `max_running_turns` is counted there, exactly), the
default tenant's are spread by their turn id (`queue_shard`). The ready tokens that wake idle claimers stay in
`{turns}` (one list per lane), each naming the shard of the turn it announces.
"""

from __future__ import annotations

import functools
import hashlib
import os
import zlib
from dataclasses import dataclass

from workers.contract import DEFAULT_TENANT

PREFIX = "toolloop:"
CLUSTER_VARIABLE = "TOOLLOOP_REDIS_CLUSTER"
_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
# Whether this process names keys for a Redis Cluster (hash tags). Set once, before any key is built.
_cluster = os.environ.get(CLUSTER_VARIABLE, "").strip().lower() in _TRUE_WORDS


def use_cluster_layout(on: bool) -> None:
    """Name keys for a Redis Cluster (`on`) or for one Redis, from now on in this process."""
    global _cluster  # noqa: PLW0603  # one layout per process, chosen before any key is named
    _cluster = on
    _bind_shared_keys()


def is_cluster_layout() -> bool:
    """Whether this process names keys for a Redis Cluster."""
    return _cluster


def _tag(value: str) -> str:
    # The part of a key that picks its slot on a cluster; as it is on one Redis.
    return _cluster_tag(value) if _cluster else value


def _cluster_tag(value: str) -> str:
    # "{value}": Redis hashes what lies between the "{" and the first "}" after it, the same part for every
    # key of the value. A value starting with "}" would leave that empty (each key then hashed whole, in a
    # slot of its own): its digest is the tag, the value kept after it.
    if value.startswith("}"):
        return "{" + hashlib.blake2b(value.encode(), digest_size=8).hexdigest() + "}" + value
    return "{" + value + "}"


def _call_tag(call_id: str, turn_id: str | None) -> str:
    # On a cluster a call's keys sit in its turn's slot (a direct call's in its own); on one Redis: the id.
    return call_id if not _cluster else _cluster_tag(turn_id or call_id) + ":" + call_id


# --- retention -------------------------------------------------------------------------------------------
OUTCOME_TTL_S = 7 * 24 * 3600  # one call's outcome envelope (and its late duplicates, for audit)
FULL_RESULT_TTL_S = 24 * 3600  # the untruncated result of an oversized call
IDEMPOTENCY_TTL_S = 24 * 3600  # a stored success that replays
CATALOGUE_STALE_S = 60.0  # a worker's catalogue entry older than this is ignored
CATALOGUE_REFRESH_S = 15.0  # how often a worker republishes its catalogue entry
# A tool no live worker serves is still dispatched (its call waits in its queue) while a worker served it
# within this window: a restart or a deploy is not taken for a tool that is gone (TOOLLOOP_TOOL_GONE_AFTER_S).
TOOL_GONE_AFTER_S = 60.0
TOOLS_SERVED_TTL_S = 24 * 3600  # when a tool was last served: kept this long after the last worker of it
TURN_TTL_S = 7 * 24 * 3600  # a turn's request, state, events and outcome after it ends
CONVERSATION_TTL_S = 30 * 24 * 3600  # a conversation's history list and head, from its last turn's end
AUDIT_TTL_S = 7 * 24 * 3600  # a consumed outcome's stub, and late outcomes
INBOX_MAXLEN = 100_000  # approximate cap of an orchestrator's inbox stream
# A worker's heartbeat (`worker_seen`): written every WORKER_BEAT_S, gone WORKER_SEEN_TTL_S after its last.
WORKER_BEAT_S = 1.0
WORKER_SEEN_TTL_S = 300
INBOX_OUTCOME_MAX_BYTES = 8192  # an outcome notification carries the outcome itself up to this size
EVENTS_MAXLEN = 10_000  # approximate cap of one turn's event stream


@dataclass(frozen=True)
class Retention:
    """How long finished things are kept (seconds): the settings `TOOLLOOP_TURN_TTL_S`,
    `TOOLLOOP_CONVERSATION_TTL_S`, `TOOLLOOP_OUTCOME_TTL_S` and `TOOLLOOP_AUDIT_TTL_S`, whose defaults are the
    constants above."""

    turn_ttl_s: int = TURN_TTL_S
    conversation_ttl_s: int = CONVERSATION_TTL_S
    outcome_ttl_s: int = OUTCOME_TTL_S
    audit_ttl_s: int = AUDIT_TTL_S


DEFAULT_RETENTION = Retention()

# --- tools -----------------------------------------------------------------------------------------------
CATALOGUE = PREFIX + "catalogue"  # hash: worker id -> {"seen_at": epoch, "tools": [ToolSpec…]}
TOOLS_SERVED = PREFIX + "tools:served"  # hash: tool name -> {"served_at": epoch, "spec": ToolSpec}
# --- agents ----------------------------------------------------------------------------------------------
AGENTS = PREFIX + "agents"  # hash: agent name -> AgentSpec JSON (workers publish, clients register)


def outcome(call_id: str, turn_id: str | None = None) -> str:
    """The one outcome of a call: first writer wins (SET NX)."""
    return f"{PREFIX}outcome:{_call_tag(call_id, turn_id)}"


def late_outcomes(call_id: str, turn_id: str | None = None) -> str:
    """Outcomes that lost the race for `outcome(call_id)`: kept for audit, never shown to a model."""
    return f"{PREFIX}outcome:{_call_tag(call_id, turn_id)}:late"


def full_result(call_id: str, turn_id: str | None = None) -> str:
    return f"{PREFIX}result:{_call_tag(call_id, turn_id)}"


def attempts(call_id: str, turn_id: str | None = None) -> str:
    """Where workers kept a call's count of executions before the fence held it (`workers.fence`): read only,
    for a call whose fence an older worker wrote."""
    return f"{PREFIX}attempts:{_call_tag(call_id, turn_id)}"


def running(call_id: str, turn_id: str | None = None) -> str:
    """Held while one execution runs, so a redelivered copy of the message does not run it in parallel."""
    return f"{PREFIX}running:{_call_tag(call_id, turn_id)}"


def fence(call_id: str, turn_id: str | None = None) -> str:
    """The token of the call's current execution and the call's count of executions, `<token>#<count>`
    (`workers.fence`), set by its start script: an execution that finds another's token here was superseded
    and neither starts its tool nor writes an outcome."""
    return f"{PREFIX}fence:{_call_tag(call_id, turn_id)}"


def idempotency(tool: str, key_digest: str, tenant: str) -> str:
    """A stored success of `tool` under `key_digest`, one tenant's: a replay never crosses tenants. The
    default tenant's keep the layout they had before tenants, so their replays outlive an upgrade."""
    scope = f"{tool}:{key_digest}" if tenant == DEFAULT_TENANT else f"{tenant}:{tool}:{key_digest}"
    return f"{PREFIX}idem:{scope}" if not _cluster else f"{PREFIX}idem:{{{scope}}}"


def idempotency_lock(idempotency_key: str) -> str:
    """Held (value: the execution's token) while a call runs under `idempotency_key`; an identical call, or
    another execution of the same call, waits for it."""
    return f"{idempotency_key}:lock"


def reply(call_id: str, turn_id: str | None = None) -> str:
    """A list a direct caller (no orchestrator) blocks on for one call's outcome."""
    return f"{PREFIX}reply:{_call_tag(call_id, turn_id)}"


# --- concurrency slots (workers.concurrency) ------------------------------------------------------------
# A slot entry lives as long as its execution's running guard (the hard limit and a margin), unless released.
SLOT_WAITING_TOLD_TTL_S = 3600  # how long a waiting call remembers its turn was told (once per dispatch)


def tool_slots(tool: str) -> str:
    """Zset of the executions holding one of `@tool(max_concurrency=N)`'s N slots: token -> expiry (ms)."""
    return f"{PREFIX}slots:{_tag(tool)}"


def tenant_slots(tool: str, tenant: str) -> str:
    """Zset of a tenant's executions holding one of `@tool(max_concurrency_per_tenant=N)`'s N slots."""
    return f"{PREFIX}slots:{_tag(tool)}:tenant:{tenant}"


def slot_waiting_told(call_id: str, turn_id: str | None = None) -> str:
    """The dispatch attempt of a call whose turn was told it waits for a slot (`tool_waiting_for_slot`)."""
    return f"{PREFIX}slot_waiting:{_call_tag(call_id, turn_id)}"


# --- turns -----------------------------------------------------------------------------------------------
# list of turn ids waiting for an orchestrator: the queue of the previous releases, and today the queue of the
# "default" tenant's "normal" turns (`turn_queue`); ids of other tenants pushed here (a woken parked turn, a
# release that knows no tenants) are moved to their own queue by the claim (`claim.lua`)
TURN_QUEUE = PREFIX + "turns:pending"  # rebound by `_bind_shared_keys`
# The queue lanes, claimed in this order (`TurnRequest.priority`).
TURN_LANES = ("interactive", "normal", "batch")
# list: one token per turn queued or running turn ended, capped at READY_TOKENS_MAX; claimers with nothing to
# claim block on it (BLPOP), so that a submit or a freed place wakes one at once
TURNS_READY = PREFIX + "turns:ready"
READY_TOKENS_MAX = 1000
ORCHESTRATORS = PREFIX + "orchestrators"  # zset: orchestrator id -> last heartbeat (epoch)
INBOX_PREFIX = PREFIX + "inbox:"  # + orchestrator id: stream of outcome/started notifications


def turn_queue(lane: str, tenant: str) -> str:
    """List of a tenant's queued turn ids in one lane (FIFO); `TURN_QUEUE` for the default tenant's normal
    turns, so that a release that knows neither reads and writes the same queue. On a cluster each shard has
    its own (`QueueShard.turn_queue`): these are shard 0's."""
    return QueueShard(0).turn_queue(lane, tenant)


def lane_tenants(lane: str) -> str:
    """List of the tenants with turns queued in `lane`, each once, in the order the claim visits them (the
    one served goes to the back: round robin)."""
    return QueueShard(0).lane_tenants(lane)


def tenant_running(tenant: str) -> str:
    """Set of a tenant's turn ids claimed and not ended, counted against its `max_running_turns`; ended or
    expired ones are removed by the turn's terminal write, or by the claim when it counts."""
    return QueueShard(0).tenant_running(tenant)


def tenant_tokens_day(tenant: str, day: str) -> str:
    """The tokens a tenant's model calls used on `day` (UTC, YYYY-MM-DD), against its `tokens_per_day`."""
    return f"{PREFIX}tenant:{tenant}:tokens:{day}"


def api_wake(reader_id: str) -> str:
    """The stream that wakes one API process's events reader (`api.fanout`) when a stream subscribes to a turn
    its blocking read does not cover yet: one entry at most, expiring with `API_WAKE_TTL_S`."""
    return f"{PREFIX}api:wake:{reader_id}"


API_WAKE_TTL_S = 3600  # a wake stream outlives its API process by at most this


def inbox(orchestrator_id: str) -> str:
    """An orchestrator's notifications; its expiry (`build_inbox_ttl_s`) is pushed back while it lives."""
    return INBOX_PREFIX + orchestrator_id


def build_inbox_ttl_s(lease_ttl_s: float) -> float:
    """How long an inbox outlives its orchestrator's last lease renewal: longer than its leases, so that
    no notification reaches the inbox of a dead orchestrator after it expired (the lease names the inbox)."""
    return 2 * lease_ttl_s + 10


def worker_seen(worker_id: str) -> str:
    """When a worker (its Celery hostname) last reported in, with its spool drained: epoch seconds of its
    clock (WORKER_SEEN_TTL_S). Written by its main process (`workers.spool.SpoolDrainer`)."""
    return f"{PREFIX}worker:{worker_id}:seen"


def turn_request(turn_id: str) -> str:
    return f"{PREFIX}turn:{_tag(turn_id)}:request"


def turn_state(turn_id: str) -> str:
    return f"{PREFIX}turn:{_tag(turn_id)}:state"


def turn_outcome(turn_id: str) -> str:
    return f"{PREFIX}turn:{_tag(turn_id)}:outcome"


def turn_events(turn_id: str) -> str:
    return f"{PREFIX}turn:{_tag(turn_id)}:events"


def turn_lease(turn_id: str) -> str:
    """Which orchestrator owns a turn (value: its id), with a TTL its heartbeat renews."""
    return f"{PREFIX}turn:{_tag(turn_id)}:lease"


def turn_trace(turn_id: str) -> str:
    """The trace context of the turn span of the turn's latest owner (JSON `{"traceparent": …}`), written
    when tracing is on: a later owner's turn span links to it (TURN_TTL_S)."""
    return f"{PREFIX}turn:{_tag(turn_id)}:trace"


def turn_control(turn_id: str) -> str:
    """Stream of cancel/approval requests for a turn, read by its owner."""
    return f"{PREFIX}turn:{_tag(turn_id)}:control"


def conversation_head(conversation_id: str) -> str:
    """Where the history of a conversation's last finished turn is: JSON {"turn_id", "history_key",
    "history_len"} (CONVERSATION_TTL_S); the next turn starts from it. Before the history lists, the value was
    the bare id of that turn, whose outcome held the messages (still read)."""
    return f"{PREFIX}conversation:{_tag(conversation_id)}:head"


def conversation_history(conversation_id: str) -> str:
    """List of a conversation's messages, one JSON each, appended once by the turns that make them
    (CONVERSATION_TTL_S from its last turn's end): a turn's history is the list's first `history_len`."""
    return f"{PREFIX}conversation:{_tag(conversation_id)}:history"


def turn_history(turn_id: str) -> str:
    """List of the messages of a turn without a conversation, as `conversation_history` (TURN_TTL_S)."""
    return f"{PREFIX}turn:{_tag(turn_id)}:history"


def turn_log(turn_id: str) -> str:
    """List of a turn's append-only audit entries (model call records, view diagnostics, late outcomes), one
    `[field, item]` JSON each, kept out of its state so that a step writes only what it added (TURN_TTL_S)."""
    return f"{PREFIX}turn:{_tag(turn_id)}:log"


def turn_forks(turn_id: str) -> str:
    """Sorted set of the forks made of a turn (`orchestrator.store.forks`): one member per fork, the JSON
    `{"at": k, "turn_id": fork id}`, scored by when it was made. It lives as long as the turn's other keys
    (TURN_TTL_S from the turn's end; for a fork of a running turn, TURN_TTL_S plus its deadline from the
    fork), and never less long than it already had."""
    return f"{PREFIX}turn:{_tag(turn_id)}:forks"


def history(turn_id: str, conversation_id: str | None) -> str:
    """The history list a turn appends to: its conversation's, else its own."""
    return conversation_history(conversation_id) if conversation_id else turn_history(turn_id)


# zset: non-terminal turn id -> submitted at (epoch); orphans are found here
TURNS_ACTIVE = PREFIX + "turns:active"
# list: ids moved out of TURN_QUEUE (BLMOVE) until their lease is set
TURNS_CLAIMING = PREFIX + "turns:claiming"
# zset: turn id -> when it must be looked at (epoch s: its earliest wait's deadline), for turns parked while
# every call they have left waits for a person: no lease, no orchestrator; an answer, or that time, queues it
TURNS_PARKED = PREFIX + "turns:parked"
# zset: turn id -> submitted at (epoch), the newest RECENT_TURNS_MAX turns, for `GET /v1/turns` and `/ui`;
# ids whose turn has expired are removed by whoever lists them
TURNS_RECENT = PREFIX + "turns:recent"
RECENT_TURNS_MAX = 1000
# hash, on a Redis Cluster only: active turn id -> "<lane> <tenant>", what the claim reads in the queue's
# shard, where the turn's request is out of reach (`orchestrator/store/lua/enqueue.lua`)
TURNS_HOMES = PREFIX + "turns:homes"


def turn_status(turn_id: str) -> str:
    """The turn's `TurnStatus` value (queued, running, waiting, or terminal)."""
    return f"{PREFIX}turn:{_tag(turn_id)}:status"


def conversation_waiting(conversation_id: str) -> str:
    """List of a conversation's turns submitted while another of its turns was not yet terminal (FIFO)."""
    return f"{PREFIX}conversation:{_tag(conversation_id)}:waiting"


def conversation_lock(conversation_id: str) -> str:
    """Held by the running turn of a conversation, so two of its turns never run at once."""
    return f"{PREFIX}conversation:{_tag(conversation_id)}:lock"


# --- the turn queue's shards, on a Redis Cluster ------------------------------------------------------------
# How many shards the queue is cut in on a cluster: every process must agree, so it is not a setting. Twelve
# spreads evenly over 2, 3, 4 or 6 masters of a cluster made by `redis-cli --cluster create`.
QUEUE_SHARDS = 12
_SLOTS = 16384


@dataclass(frozen=True)
class QueueShard:
    """The turn queue's keys of one shard: on one Redis the one queue (shard 0), named as every earlier
    release named it; on a cluster one hash tag per shard, chosen so that the shards' slots lie evenly over
    the slot space (`_shard_tag`)."""

    index: int

    @property
    def prefix(self) -> str:
        return PREFIX + "{" + _shard_tag(self.index) + "}:" if _cluster else PREFIX + "turns:"

    @property
    def queue(self) -> str:
        """The default tenant's normal queue (`turn_queue`), where a woken turn goes first."""
        return self.prefix + "pending"

    @property
    def active(self) -> str:
        return self.prefix + "active"

    @property
    def claiming(self) -> str:
        return self.prefix + "claiming"

    @property
    def parked(self) -> str:
        return self.prefix + "parked"

    @property
    def recent(self) -> str:
        return self.prefix + "recent"

    @property
    def homes(self) -> str:
        return self.prefix + "homes"

    def turn_queue(self, lane: str, tenant: str) -> str:
        if lane == "normal" and tenant == DEFAULT_TENANT:
            return self.queue
        return f"{self.prefix}queue:{lane}:{tenant}"

    def lane_tenants(self, lane: str) -> str:
        return f"{self.prefix}lane:{lane}"

    def tenant_running(self, tenant: str) -> str:
        if _cluster:
            return f"{self.prefix}tenant:{tenant}:running"
        return f"{PREFIX}tenant:{tenant}:running"


def queue_shard_count() -> int:
    """How many shards the turn queue has: `QUEUE_SHARDS` on a cluster, 1 on one Redis."""
    return QUEUE_SHARDS if _cluster else 1


def queue_shard(turn_id: str, tenant: str) -> QueueShard:
    """The shard a turn is queued in: its named tenant's (every turn of a tenant in one shard, where its
    running turns are counted), else its own id's; shard 0 on one Redis."""
    if not _cluster:
        return QueueShard(0)
    spread_by = turn_id if tenant == DEFAULT_TENANT else "tenant:" + tenant
    return QueueShard(zlib.crc32(spread_by.encode()) % QUEUE_SHARDS)


def all_queue_shards() -> list[QueueShard]:
    """Every shard of the turn queue."""
    return [QueueShard(index) for index in range(queue_shard_count())]


def ready_tokens(lane: str) -> str:
    """On a cluster, the ready tokens of one lane (`{turns}`): each names the shard of a turn queued, or of a
    place freed; idle claimers block on the three lanes' lists at once, the first lane first."""
    return f"{PREFIX}{{turns}}:ready:{lane}"


@functools.cache
def _shard_tag(index: int) -> str:
    # The first tag "turns-<index>-<n>" whose slot lies near the middle of the shard's twelfth of the slot
    # space: a cluster's masters own even runs of slots, so the shards (and their load) spread evenly.
    from redis.crc import key_slot  # only a cluster names shards: one Redis never loads it

    width = _SLOTS / QUEUE_SHARDS
    middle = int(width * index + width / 2)
    n = 0
    while True:
        tag = f"turns-{index}-{n}"
        if abs(key_slot(tag.encode()) - middle) <= width / 8:
            return tag
        n += 1


# --- a conversation's turns share its slot, on a Redis Cluster ------------------------------------------
# A conversation's scripts write its history, head, lock and waiting list together with its turns' keys (a
# step appends to the history; a turn's end hands the conversation to the next): on a cluster these must share
# a slot. Keys are named by turn id alone (the workers name a call's keys from its turn id), so a
# conversation's turns get ids whose slot is the conversation's: the id's last four hex digits are chosen for
# it (`fit_turn_id`), and the id looks as any other.
_SLOT_MASK = 0x3FFF  # a key's slot: the low 14 bits of the CRC16 (XMODEM) of its hash tag
_FIT_DIGITS = 4


def conversation_slot(conversation_id: str) -> int:
    """The cluster slot of a conversation's keys (as a cluster names them, whatever this process's layout)."""
    from redis.crc import key_slot  # only conversations on a cluster need it

    return int(key_slot(f"{PREFIX}conversation:{_cluster_tag(conversation_id)}:head".encode()))


def turn_slot(turn_id: str) -> int:
    """The cluster slot of a turn's keys (as a cluster names them, whatever this process's layout)."""
    from redis.crc import key_slot  # only conversations on a cluster need it

    return int(key_slot(f"{PREFIX}turn:{_cluster_tag(turn_id)}:state".encode()))


def fit_turn_id(stem: str, conversation_id: str) -> str | None:
    """`stem` and four hex digits making a turn id whose keys share `conversation_id`'s slot on a cluster;
    None when no four digits do (for about one stem in five: take another).

    The slot is the low 14 bits of the id's CRC16 (XMODEM), which is linear: the CRC of `stem + digits` is
    that of `stem + "0000"` XOR that of the digits' difference from "0000", itself the XOR of its two halves'
    (`_fit_halves`), so the digits are found among 256 × 256 pairs by 256 lookups."""
    import binascii  # only conversation turns need it

    base = binascii.crc_hqx((stem + "0000").encode(), 0)
    wanted = (conversation_slot(conversation_id) ^ base) & _SLOT_MASK
    first, second = _fit_halves()
    for value, digits in first.items():
        rest = second.get(wanted ^ value)
        if rest is not None:
            return stem + digits + rest
    return None


@functools.cache
def _fit_halves() -> tuple[dict[int, str], dict[int, str]]:
    # For the first two of four digits and for the last two: the slot bits of the CRC of their difference
    # from "00" placed in four zero bytes (at the front, or at the back) -> the digits (the first met).
    import binascii

    halves: tuple[dict[int, str], dict[int, str]] = ({}, {})
    for n in range(256):
        digits = f"{n:02x}"
        difference = bytes(ord(c) ^ ord("0") for c in digits)
        for half, placed in zip(halves, (difference + b"\0\0", b"\0\0" + difference), strict=True):
            half.setdefault(binascii.crc_hqx(placed, 0) & _SLOT_MASK, digits)
    return halves


# --- schedules (orchestrator.schedules) ------------------------------------------------------------------
# Kept until removed (`toolloop schedule rm`): a schedule is configuration, not a record that ages out.
SCHEDULES = PREFIX + "schedules"  # hash: schedule name -> JSON of its `Schedule`
SCHEDULE_RUNS_KEPT = 20  # how many of a schedule's last runs (turn ids) it keeps
# Which `toolloop beat` is the active one (value: its id), with a TTL it renews; the others stand by.
BEAT_LEASE = PREFIX + "beat:lease"
BEAT_LEASE_TTL_S = 15.0  # `toolloop beat --lease-ttl-s`: how soon a standby takes over from a dead beat


def schedule_state(name: str) -> str:
    """Hash of what the beat did with a schedule: when it last handled a tick (ran or skipped it), its last
    run (time, turn id), its skipped ticks, its last error."""
    return f"{_schedules()}schedule:{name}:state"


def schedule_runs(name: str) -> str:
    """List of a schedule's last runs' turn ids, newest first (SCHEDULE_RUNS_KEPT)."""
    return f"{_schedules()}schedule:{name}:runs"


# --- the keys several turns share, named by the layout --------------------------------------------------


def _turns() -> str:
    # The ready tokens of one Redis; on a cluster the slot of the lanes' ready tokens (`ready_tokens`).
    return PREFIX + ("{turns}:" if _cluster else "turns:")


def _schedules() -> str:
    # The schedules' keys: one slot on a cluster, as adding or removing one writes the list and its state
    # together.
    return PREFIX + ("{schedules}:" if _cluster else "")


def _limits() -> str:
    # The model and tenant budgets: one slot on a cluster, as a model call's reservation checks several.
    return PREFIX + ("{limits}:" if _cluster else "")


def _bind_shared_keys() -> None:
    # The module's names of the turn queue's keys, for the layout in use (read as `keys.TURNS_ACTIVE`, …).
    # The layout is one per process, chosen before any key is named: the module's own names follow it.
    global TURN_QUEUE, TURNS_READY, TURNS_ACTIVE, TURNS_CLAIMING, TURNS_PARKED, TURNS_RECENT, TURNS_HOMES
    global CATALOGUE, TOOLS_SERVED, AGENTS, SCHEDULES, REDIS_MARKER, REDIS_LOSSES  # noqa: PLW0603
    # On a cluster each shard has its own (`QueueShard`): these are shard 0's, and the cluster's code names
    # its shard each time.
    first = QueueShard(0)
    TURN_QUEUE, TURNS_READY = first.queue, _turns() + "ready"
    TURNS_ACTIVE, TURNS_CLAIMING = first.active, first.claiming
    TURNS_PARKED, TURNS_RECENT, TURNS_HOMES = first.parked, first.recent, first.homes
    # The catalogue's three hashes are written together (one MULTI): one slot on a cluster.
    catalogue = PREFIX + ("{catalogue}:" if _cluster else "")
    CATALOGUE, TOOLS_SERVED, AGENTS = (
        catalogue + "catalogue",
        catalogue + "tools:served",
        catalogue + "agents",
    )
    SCHEDULES = _schedules() + "schedules"
    # A loss is noted and the marker set together (one MULTI).
    redis_keys = PREFIX + ("{redis}:" if _cluster else "") + "redis:"
    REDIS_MARKER, REDIS_LOSSES = redis_keys + "marker", redis_keys + "losses"


# --- Redis itself ------------------------------------------------------------------------------------------
# Written once under each Redis run id: a run id that changed without it means Redis came back empty.
REDIS_MARKER = PREFIX + "redis:marker"  # string, no TTL: the run id it was written under
REDIS_LOSSES = PREFIX + "redis:losses"  # hash: new run id -> JSON of one data loss (TURN_TTL_S)


# --- model rate limits (orchestrator.store.rate_limits) -----------------------------------------------------
# Each expires once its window or its pause is over: an idle model leaves nothing behind.


def model_pause(model: str) -> str:
    """A `provider:model` its provider asked the fleet to rest: the epoch ms (Redis's clock) it may go on."""
    return f"{_limits()}model_limits:paused:{model}"


def model_budget_calls(key: str) -> str:
    """Zset of the calls in the sliding window of TOOLLOOP_MODEL_LIMITS entry `key`: reservation id -> ms."""
    return f"{_limits()}model_limits:budget:{key}:calls"


def model_budget_tokens(key: str) -> str:
    """Hash of the tokens of the calls in entry `key`'s window (reservation id -> tokens, and their sum)."""
    return f"{_limits()}model_limits:budget:{key}:tokens"


def tenant_budget_calls(key: str) -> str:
    """Zset of the calls in the sliding window of a tenant's tokens budget (`key`: `tenant:<name>`)."""
    return f"{_limits()}tenant_limits:budget:{key}:calls"


def tenant_budget_tokens(key: str) -> str:
    """Hash of the tokens of the calls in a tenant's window (reservation id -> tokens, and their sum)."""
    return f"{_limits()}tenant_limits:budget:{key}:tokens"


def tenant_budget_line(key: str) -> str:
    """Zset of the calls a tenant's budget told to wait: call id -> the epoch ms it was told to come back."""
    return f"{_limits()}tenant_limits:budget:{key}:line"


def model_budget_line(key: str) -> str:
    """Zset of the calls entry `key` told to wait: call id -> the epoch ms it was told to come back."""
    return f"{_limits()}model_limits:budget:{key}:line"


# Last: every name above it rebinds is defined by now.
_bind_shared_keys()
