"""The table of pure operations on turns: each round trip's command or script call, and its reply parser.

Every Redis read and write of the stores is built here, once, as a value (`orchestrator.store.effects`); the
async `TurnStore`, the sync `SyncTurnStore` and direct tool calls only perform them (`runner`), alone or in
the multi-step flows of `orchestrator.store.flows`. No I/O and no clock here: the time of a write is an
argument. Every constant a script needs comes from Python as ARGV: statuses (`TurnStatus`), event names
(`codec`), stream caps and TTLs (`workers.keys`). A parser that leaves out a record it cannot read says so
once in the log (`workers.records.warn_once`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.errors import UnknownTurnError
from orchestrator.model import TurnOutcome, TurnRequest, TurnStatus
from orchestrator.store import codec, history, scripts, turn_view
from orchestrator.store.codec import ControlRequest, TurnEvent
from orchestrator.store.effects import Batch, RedisCommand, ScriptCall, Transaction, parse_reply
from orchestrator.store.history import Appended
from orchestrator.store.scripts import (
    ControlResult,
    FinishResult,
    ParkResult,
    ReleaseResult,
    SaveResult,
    SubmitResult,
    TakeOverResult,
    WriteResult,
)
from orchestrator.store.turn_view import TurnView
from orchestrator.tenant_limits import NO_CAPS, RunningCaps
from workers import keys, packing
from workers.contract import ToolOutcome, build_consumed_stub, dump_tool_outcome
from workers.records import warn_once
from workers.scripts import (
    build_notify_command,
    build_outcome_notification,
    build_write_outcome_call,
    parse_owner,
    parse_release_result,
    parse_write_reply,
)

T = TypeVar("T")
log = logging.getLogger("toolloop.store")


def build_status_set(statuses: Iterable[TurnStatus]) -> str:
    """Statuses as one ARGV: their values separated by spaces, which a script reads into a set."""
    return " ".join(status.value for status in statuses)


TERMINAL_STATUSES = build_status_set(s for s in TurnStatus if s.terminal)
# The statuses in which a turn has an owner holding its lease: without one, it is an orphan.
LEASED_STATUSES = build_status_set((TurnStatus.RUNNING, TurnStatus.WAITING))


def _text_or_none(reply: Any) -> str | None:
    return None if reply is None else codec.text(reply)


def _script(
    script: scripts.Script, keys_: Sequence[str], args: Sequence[str | bytes | int], parse: Callable[[Any], T]
) -> ScriptCall[T]:
    # Bytes go as they are: a compressed record (`workers.packing`) is not text.
    return ScriptCall(script, tuple(keys_), tuple(a if isinstance(a, bytes) else str(a) for a in args), parse)


# --- submitting, claiming, leases ------------------------------------------------------------------------


def submit(request: TurnRequest, turn_id: str, now: float) -> ScriptCall[SubmitResult]:
    """Store a checked request and queue it, or park it behind its conversation (`submit.lua`)."""
    conversation = request.conversation_id
    event = {"turn_id": turn_id, "conversation_id": conversation, "model": request.model}
    # On a cluster the queue's side is another slot's (`cluster.enqueue`): '' keys leave it out.
    queue_side = not keys.is_cluster_layout()
    keys_ = [keys.turn_request(turn_id), keys.turn_status(turn_id), keys.TURNS_ACTIVE if queue_side else ""]
    keys_ += [
        keys.turn_events(turn_id),
        keys.turn_queue(request.priority, request.tenant) if queue_side else "",
    ]
    keys_ += [keys.conversation_lock(conversation) if conversation else ""]
    keys_ += [keys.conversation_waiting(conversation) if conversation else "", keys.TURNS_RECENT]
    keys_ += [keys.lane_tenants(request.priority), keys.TURNS_READY]
    if not queue_side:  # the turn's keys and its conversation's (one slot) only
        keys_ = [k if i in (0, 1, 3, 5, 6) else "" for i, k in enumerate(keys_)]
    args: list[str | int] = [turn_id, codec.dump_request(request), repr(now), json.dumps(event)]
    args += [keys.EVENTS_MAXLEN, TurnStatus.QUEUED.value, codec.TURN_QUEUED, keys.RECENT_TURNS_MAX]
    args += [request.tenant, keys.READY_TOKENS_MAX]
    if not queue_side:
        args.append(
            keys.TURN_TTL_S
        )  # until it is queued (`cluster.submit`): a dead caller leaves no turn for good
    return _script(scripts.SUBMIT, keys_, args, lambda reply: SubmitResult(int(reply)))


def wait_ready(block_s: float) -> RedisCommand[bool]:
    """Block up to `block_s` for a ready token (a turn queued, a running turn ended); True when one came.

    By hand rather than redis-py's `blpop`, whose timeout the stubs type as int: Redis takes fractional
    seconds."""
    return RedisCommand(("BLPOP", keys.TURNS_READY, f"{block_s:.3f}"), lambda reply: reply is not None)


def _split(key_of: Callable[[str], str]) -> list[str | int]:
    # A key function's prefix and suffix around the id, for a script that builds the keys of many ids.
    prefix, suffix = key_of("\0").split("\0")
    return [prefix, suffix]


# The claim's bound on ids it moves or passes over in one call (claim.lua answers "again" past it).
CLAIM_SKIP_BUDGET = 100


def _lease_args(turn_id: str, orchestrator_id: str, ttl_ms: int) -> list[str | int]:
    # ARGV of claim.lua and take_over.lua: a queued turn leased becomes running; a terminal one never is.
    return [
        turn_id,
        orchestrator_id,
        ttl_ms,
        TurnStatus.QUEUED.value,
        TurnStatus.RUNNING.value,
        TERMINAL_STATUSES,
    ]


def claim(
    orchestrator_id: str, ttl_ms: int, caps: RunningCaps = NO_CAPS
) -> ScriptCall[codec.ClaimedTurn | codec.ClaimAgain | None]:
    """Lease the next queued turn to `orchestrator_id` — lanes in order, tenants in turn within a lane, a
    tenant at its cap (`caps`) passed over — with the request adopting it starts from; None when nothing is
    claimable, `CLAIM_AGAIN` when the script passed over many ended ids and should be called again now
    (`claim.lua`)."""
    keys_ = [keys.TURN_QUEUE, keys.TURNS_PARKED, *(keys.lane_tenants(lane) for lane in keys.TURN_LANES)]
    keys_.append(keys.TURNS_READY)
    args: list[str | int] = [orchestrator_id, ttl_ms, TurnStatus.QUEUED.value, TurnStatus.RUNNING.value]
    args += [TERMINAL_STATUSES, *_split(keys.turn_status), *_split(keys.turn_lease)]
    args += [*_split(keys.turn_request), *_split(keys.turn_state), " ".join(keys.TURN_LANES)]
    lane_queue_prefix = keys.turn_queue("batch", "\0").split("batch:\0")[0]
    args += [lane_queue_prefix, *_split(keys.tenant_running)]
    args += [" ".join(f"{t} {n}" for t, n in caps.by_tenant.items()), caps.others, CLAIM_SKIP_BUDGET]
    return _script(scripts.CLAIM, keys_, args, codec.parse_claim)


def take_over(
    orchestrator_id: str, turn_id: str, ttl_ms: int, *, claiming: bool | None = None
) -> ScriptCall[TakeOverResult]:
    """Lease an orphaned turn (`take_over.lua`); with `claiming` (a cluster's caller read the claiming list),
    the script does not read the list itself."""
    list_key = keys.TURNS_CLAIMING if claiming is None else ""
    keys_ = [keys.turn_lease(turn_id), keys.turn_status(turn_id), list_key]
    args = [*_lease_args(turn_id, orchestrator_id, ttl_ms), "1" if claiming else ""]
    return _script(scripts.TAKE_OVER, keys_, args, lambda reply: TakeOverResult(int(reply)))


def renew_leases(orchestrator_id: str, turn_ids: Sequence[str], ttl_ms: int) -> ScriptCall[set[str]]:
    """Extend these leases; the reply is the set of ids whose lease `orchestrator_id` no longer holds."""
    ids = list(turn_ids)
    return _script(
        scripts.RENEW,
        [keys.turn_lease(t) for t in ids],
        [orchestrator_id, ttl_ms],
        lambda lost: {ids[int(i) - 1] for i in lost},
    )


def keep_inbox(orchestrator_id: str, ttl_ms: int, now: float) -> ScriptCall[bool]:
    """Push back the expiry of a live orchestrator's inbox (created empty when missing) and forget the
    orchestrators not seen within `ttl_ms` (`keep_inbox.lua`); True when the inbox was missing."""
    return _script(
        scripts.KEEP_INBOX,
        # On a cluster the orchestrators' set is trimmed by a command of its own (`cluster.keep_inbox`).
        [keys.inbox(orchestrator_id), "" if keys.is_cluster_layout() else keys.ORCHESTRATORS],
        [ttl_ms, repr(now)],
        lambda created: bool(int(created)),
    )


def release(orchestrator_id: str, turn_id: str) -> ScriptCall[ReleaseResult]:
    """Delete the turn's lease if `orchestrator_id` holds it (`release.lua`, shared with the workers)."""
    if not orchestrator_id:
        raise ValueError("orchestrator_id must not be empty: release.lua reads '' as 'whoever holds it'")
    return _script(scripts.RELEASE, [keys.turn_lease(turn_id)], [orchestrator_id], parse_release_result)


def find_orphans(limit: int) -> ScriptCall[list[str]]:
    """Non-terminal turns nobody leases, at most `limit` (`find_orphans.lua`)."""
    status_prefix, status_suffix = keys.turn_status("\0").split("\0")
    lease_prefix, lease_suffix = keys.turn_lease("\0").split("\0")
    args: list[str | int] = [limit, status_prefix, status_suffix, lease_prefix, lease_suffix, LEASED_STATUSES]
    return _script(
        scripts.FIND_ORPHANS,
        [keys.TURNS_ACTIVE, keys.TURNS_CLAIMING, keys.TURNS_PARKED],
        args,
        lambda found: [codec.text(t) for t in found],
    )


def park(orchestrator_id: str, turn_id: str, look_at: float, control_after: str) -> ScriptCall[ParkResult]:
    """Give up the lease of a turn that only waits for people and put it in the parked set, to be queued by
    an answer or at `look_at` (epoch s); not when its control stream has a request past `control_after`
    (`park.lua`)."""
    parked = (
        "" if keys.is_cluster_layout() else keys.TURNS_PARKED
    )  # a cluster's caller adds it (cluster.park)
    keys_ = [keys.turn_lease(turn_id), parked, keys.turn_control(turn_id)]
    args: list[str | int] = [orchestrator_id, turn_id, repr(look_at), control_after]
    return _script(scripts.PARK, keys_, args, lambda reply: ParkResult(int(reply)))


def _parse_scored(reply: Any) -> list[tuple[str, float]]:
    # WITHSCORES: pairs (RESP3, or a client that pairs them) or a flat member, score, member, … list (RESP2).
    items = list(reply or [])
    if items and not isinstance(items[0], list | tuple):
        items = list(zip(items[::2], items[1::2], strict=True))
    return [(codec.text(member), float(score)) for member, score in items]


def wake_parked(
    due_by: float, limit: int, parked: str | None = None, queue: str | None = None
) -> ScriptCall[list[str]]:
    """Queue the parked turns to be looked at by `due_by` (epoch s), at most `limit` (`wake.lua`), each with
    a ready token; of one shard's parked set and queue on a cluster (where the caller announces them)."""
    script_keys = [parked or keys.TURNS_PARKED, queue or keys.TURN_QUEUE]
    if parked is None:
        script_keys.append(keys.TURNS_READY)
    return _script(
        scripts.WAKE,
        script_keys,
        [repr(due_by), limit, keys.READY_TOKENS_MAX],
        lambda woken: [codec.text(t) for t in woken],
    )


def read_active_statuses() -> ScriptCall[list[tuple[str, TurnStatus | None]]]:
    """Every non-terminal turn (oldest submitted first) with its status, in one round trip."""
    status_prefix, status_suffix = keys.turn_status("\0").split("\0")

    def status(raw: Any) -> TurnStatus | None:
        try:
            return codec.parse_status(raw or None)
        except ValueError:  # a status a newer release added: not one this listing looks for
            return None

    def parse(reply: Any) -> list[tuple[str, TurnStatus | None]]:
        items = list(reply or [])
        return [(codec.text(t), status(s)) for t, s in zip(items[::2], items[1::2], strict=True)]

    return _script(scripts.READ_STATUSES, [keys.TURNS_ACTIVE], [status_prefix, status_suffix], parse)


def list_parked() -> RedisCommand[list[tuple[str, float]]]:
    """Every parked turn and when it must be looked at (epoch s), soonest first."""
    return RedisCommand(
        ("ZRANGE", keys.TURNS_PARKED, 0, -1, "WITHSCORES"),
        _parse_scored,
    )


# --- state and outcome -----------------------------------------------------------------------------------


def get_request(turn_id: str) -> RedisCommand[TurnRequest | None]:
    """The submitted request."""
    return RedisCommand(("GET", keys.turn_request(turn_id)), codec.parse_request)


def get_request_text(turn_id: str) -> RedisCommand[str | None]:
    """The submitted request as stored, unparsed (for a turn whose records this release cannot read)."""
    return RedisCommand(("GET", keys.turn_request(turn_id)), _text_or_none)


def get_state(turn_id: str) -> RedisCommand[str | None]:
    """The serialised machine state last saved."""
    return RedisCommand(("GET", keys.turn_state(turn_id)), _text_or_none)


def get_status(turn_id: str) -> RedisCommand[TurnStatus | None]:
    """The turn's status; None for an unknown turn."""
    return RedisCommand(("GET", keys.turn_status(turn_id)), codec.parse_status)


# `read_history.lua` reads the view's keys and the history of the outcome, else of the state.
_VIEW_REFERENCES = (4, 3)


def get_view(turn_id: str) -> ScriptCall[TurnView | None]:
    """Status, request, transcript so far and outcome in one round trip; None for an unknown turn."""
    return _script(
        scripts.READ_HISTORY,
        turn_view.view_keys(turn_id),
        _VIEW_REFERENCES,
        lambda raw: turn_view.build_turn_view(turn_id, *raw[:4], history_raw=raw[4], log_raw=raw[5]),
    )


def require_view(turn_id: str) -> ScriptCall[TurnView]:
    """`get_view`, whose reply raises `UnknownTurnError` for an unknown turn (what the clients' `get` is)."""

    def parse(raw: Any) -> TurnView:
        view = turn_view.build_turn_view(turn_id, *raw[:4], history_raw=raw[4], log_raw=raw[5])
        if view is None:
            raise UnknownTurnError(turn_id)
        return view

    return _script(scripts.READ_HISTORY, turn_view.view_keys(turn_id), _VIEW_REFERENCES, parse)


def save_step(
    turn_id: str,
    state_json: str,
    status: TurnStatus,
    events: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    orchestrator_id: str | None,
    now: float,
    append: Appended | None = None,
    audit_ttl_s: int = keys.AUDIT_TTL_S,
    lists_kept: bool = False,
) -> ScriptCall[SaveResult]:
    """A step's state, status, new messages and events, fenced by the lease when `orchestrator_id` is given
    (`save_step.lua`). `turn_finished` is left out: only `save_outcome` publishes it.

    With `append`, its messages are appended to its history list (which must hold `append.start` before
    them), and the outcome keys of the calls they answer become stubs (`consumed`) kept `audit_ttl_s`.
    `lists_kept`: the caller saved into these lists before, as their owner (they hold no TTL to remove)."""
    add = append or Appended("", 0, ())
    args: list[str | bytes | int] = [state_json, status.value, orchestrator_id or "", keys.EVENTS_MAXLEN]
    args += [TERMINAL_STATUSES, audit_ttl_s, add.start, len(add.messages), add.log_start, len(add.log)]
    args += ["" if lists_kept else "1", *(packing.pack(m) for m in add.messages), *add.log]
    args += [build_consumed_stub(outcome) for outcome in add.consumed]
    # The step's events, one stream entry for them all (`codec.MORE_FIELD`).
    emitted = [(name, data) for name, data in events if name != codec.TURN_FINISHED]
    args.append(len(emitted))
    if emitted:
        args += codec.build_entry_fields(emitted, now)
    keys_ = [keys.turn_state(turn_id), keys.turn_status(turn_id), keys.turn_lease(turn_id)]
    keys_ += [
        keys.turn_events(turn_id),
        add.history_key if add.messages else "",
        add.log_key if add.log else "",
    ]
    keys_ += [keys.outcome(outcome.call_id, turn_id) for outcome in add.consumed]
    return _script(scripts.SAVE_STEP, keys_, args, lambda reply: SaveResult(int(reply)))


def finish_step(step: ScriptCall[SaveResult], end: ScriptCall[FinishResult]) -> ScriptCall[SaveResult]:
    """A turn's last step (`save_step`) and its outcome (`save_outcome`) in one script call: the step's
    refusal writes neither; SAVED means both are stored (`scripts.FINISH_STEP`). One Redis only: on a
    Redis Cluster the end has a queue shard's part (`cluster.end`)."""
    args = (str(len(step.keys)), str(len(step.args)), *step.args, *end.args)
    return ScriptCall(scripts.FINISH_STEP, step.keys + end.keys, args, step.parse)


def save_outcome(
    turn_id: str,
    outcome: TurnOutcome,
    conversation_id: str | None,
    now: float,
    retention: keys.Retention = keys.DEFAULT_RETENTION,
    *,
    orchestrator_id: str | None = None,
    tenant: str | None = None,
) -> ScriptCall[FinishResult]:
    """The terminal write, with `turn_finished` and the conversation's next turn (`save_outcome.lua`); with
    `orchestrator_id`, the lease that orchestrator holds on the turn is released in the same script. `tenant`:
    the turn's, when the caller knows it (else the script reads it from the request).

    The stored outcome and the conversation's head reference the turn's history list, whose first
    `len(outcome.messages)` entries are the outcome's messages (persisted by the steps before)."""
    history_key = keys.history(turn_id, conversation_id)
    # On a cluster the queue's side of the end is `cluster.end`'s, in the turn's queue shard: '' here.
    queue_side = not keys.is_cluster_layout()
    keys_ = [
        keys.turn_outcome(turn_id),
        keys.turn_status(turn_id),
        keys.TURNS_ACTIVE if queue_side else "",
        keys.turn_events(turn_id),
        keys.turn_request(turn_id),
        keys.turn_state(turn_id),
        keys.turn_control(turn_id),
        keys.TURN_QUEUE if queue_side else "",
        keys.conversation_head(conversation_id) if conversation_id else "",
        keys.conversation_lock(conversation_id) if conversation_id else "",
        keys.conversation_waiting(conversation_id) if conversation_id else "",
        history_key,
        keys.turn_log(turn_id),
        keys.turn_lease(turn_id) if orchestrator_id else "",
        keys.TURNS_READY if queue_side else "",
    ]
    summary = codec.build_turn_summary(turn_id, outcome)
    stored = history.dump_outcome(outcome, history_key)
    head = history.dump_head(turn_id, history_key, len(outcome.messages))
    args: list[str | int] = [turn_id, stored, outcome.status, retention.turn_ttl_s]
    args += [json.dumps(summary), keys.EVENTS_MAXLEN, repr(now), TERMINAL_STATUSES, codec.TURN_FINISHED]
    args += [retention.conversation_ttl_s, head, orchestrator_id or ""]
    lane_queue_prefix = keys.turn_queue("batch", "\0").split("batch:\0")[0]
    args += [*_split(keys.tenant_running), lane_queue_prefix, keys.lane_tenants(""), keys.READY_TOKENS_MAX]
    args += [*_split(keys.turn_request), tenant or ""]
    return _script(scripts.SAVE_OUTCOME, keys_, args, lambda reply: FinishResult(int(reply)))


# --- events and control ----------------------------------------------------------------------------------


def append_events(
    turn_id: str, events: Sequence[tuple[str, Mapping[str, Any]]], now: float
) -> ScriptCall[str]:
    """Add progress events (redacted), in order, in one round trip (`append_events.lua`); the reply is the
    last one's stream id. `turn_finished` is left out: only `save_outcome` publishes it."""
    args: list[str | int] = [keys.EVENTS_MAXLEN]
    for name, data in events:
        if name != codec.TURN_FINISHED:
            fields = codec.build_event_fields(name, data, now)
            args += [fields["name"], fields["at"], fields["data"]]
    return _script(scripts.APPEND_EVENTS, [keys.turn_events(turn_id)], args, codec.text)


def _xread(stream: str, after: str, block_ms: int | None, count: int | None) -> tuple[str | int, ...]:
    count_words: tuple[str | int, ...] = () if count is None else ("COUNT", count)
    block_words: tuple[str | int, ...] = () if block_ms is None else ("BLOCK", block_ms)
    return ("XREAD", *count_words, *block_words, "STREAMS", stream, after)


def read_events(
    turn_id: str, after: str, block_ms: int | None = None, count: int | None = None
) -> RedisCommand[list[TurnEvent]]:
    """Events after the stream id `after`; with `block_ms` (already capped), waits that long for one."""
    return RedisCommand(
        _xread(keys.turn_events(turn_id), after, block_ms, count),
        lambda reply: codec.parse_entries(turn_id, codec.parse_stream_reply(reply), after),
    )


@dataclass(frozen=True)
class OwnerToTell:
    """What `control.lua` recorded on a Redis Cluster, for its caller to tell: the owner (None: nobody holds
    the turn), the request's kind, call and approval ('1', '0', ''), and its control stream entry's id."""

    owner: str | None
    kind: str
    call_id: str
    approved: str
    entry_id: str


def control(
    turn_id: str,
    kind: str,
    call_id: str | None,
    approved: bool | None,
    now: float,
    *,
    arguments: Mapping[str, Any] | None = None,
    reason: str | None = None,
    decided_by: str | None = None,
    result: str | None = None,
) -> ScriptCall[ControlResult | OwnerToTell]:
    """A cancel (`kind="cancel"`) or an approval of `call_id`, told to the turn's owner, or waking the turn
    when it is parked (`control.lua`); an approval may carry edited `arguments` (stored as JSON), a `reason`
    (what a denial tells the model) and who decided (`decided_by`). A client-side tool's answer
    (`kind="client_result"`) carries its `result` (JSON text from `codec.dump_client_result`) or its error
    as the `reason`; a child turn's end (`kind="child_result"`) its report (`ChildReport` JSON) as the
    `result`."""
    if kind in {"approval", "client_result", "child_result"} and not call_id:
        raise ValueError("call_id must not be empty")
    # On a cluster the owner's inbox and the parked set are other slots': the caller tells or wakes
    # (`cluster.tell_owner`), from the owner the script returns.
    queue_side = not keys.is_cluster_layout()
    keys_ = [keys.turn_control(turn_id), keys.turn_lease(turn_id), keys.turn_status(turn_id)]
    keys_ += [keys.TURNS_PARKED, keys.TURN_QUEUE, keys.TURNS_READY] if queue_side else ["", "", ""]
    approved_arg = "" if approved is None else ("1" if approved else "0")
    inbox_prefix = keys.INBOX_PREFIX if queue_side else ""
    args: list[str | int] = [inbox_prefix, turn_id, kind, call_id or "", approved_arg, repr(now)]
    args += [keys.INBOX_MAXLEN, TERMINAL_STATUSES]
    args += [codec.dump_control_arguments(arguments), reason or "", decided_by or "", result or ""]
    args.append(keys.READY_TOKENS_MAX)

    def parse(reply: Any) -> ControlResult | OwnerToTell:
        if not isinstance(reply, list):
            return ControlResult(int(reply))
        return OwnerToTell(parse_owner(reply[1]), kind, call_id or "", approved_arg, codec.text(reply[2]))

    return _script(scripts.CONTROL, keys_, args, parse)


def read_control(turn_id: str, after: str) -> RedisCommand[list[ControlRequest]]:
    """Cancel and approval requests after the stream id `after`."""
    return RedisCommand(
        _xread(keys.turn_control(turn_id), after, None, None),
        lambda reply: [codec.parse_control(i, f) for i, f in codec.parse_stream_reply(reply)],
    )


# --- tool outcomes, the inbox, the orchestrator registry -------------------------------------------------


def read_outcomes(
    calls: Mapping[str, str | None],
) -> RedisCommand[dict[str, ToolOutcome]] | Batch[dict[str, ToolOutcome]]:
    """The stored outcomes of these calls (wire id -> its turn id; at least one), those that have one, in one
    MGET (on a Redis Cluster one per turn, each in its turn's slot, in one pipeline)."""
    if not keys.is_cluster_layout():
        return _mget_outcomes(list(calls.items()))
    by_turn: dict[str | None, list[tuple[str, str | None]]] = {}
    for call_id, turn_id in calls.items():
        by_turn.setdefault(turn_id, []).append((call_id, turn_id))
    mgets = tuple(_mget_outcomes(group) for group in by_turn.values())
    return Batch(mgets, lambda found: {c: o for part in found for c, o in part.items()})


def _mget_outcomes(calls: list[tuple[str, str | None]]) -> RedisCommand[dict[str, ToolOutcome]]:
    def parse(raw: list[Any]) -> dict[str, ToolOutcome]:
        found = {c: _read_outcome(c, v) for (c, _), v in zip(calls, raw, strict=True)}
        return {c: o for c, o in found.items() if o is not None}

    return RedisCommand(("MGET", *(keys.outcome(c, t) for c, t in calls)), parse)


def _read_outcome(call_id: str, raw: Any) -> ToolOutcome | None:
    # One outcome that does not parse (a release this one cannot read wrote it) is left out, as if not yet
    # written: its call is answered by its timers, and the other outcomes of the batch are read.
    try:
        return codec.parse_tool_outcome(raw)
    except ValueError as exc:
        warn_once(
            log, f"outcome:{call_id}", "outcome of %s left unread: it does not parse (%s)", call_id, exc
        )
        return None


def get_tool_outcome(call_id: str, turn_id: str | None) -> RedisCommand[ToolOutcome | None]:
    """The call's winning outcome, if any."""
    return RedisCommand(("GET", keys.outcome(call_id, turn_id)), codec.parse_tool_outcome)


def pack_outcome(outcome: ToolOutcome) -> str | bytes:
    """An outcome as it is stored and notified: its JSON, compressed when large (`packing.pack`)."""
    return packing.pack(dump_tool_outcome(outcome))


def write_outcome(
    outcome: ToolOutcome,
    retention: keys.Retention = keys.DEFAULT_RETENTION,
    stored: str | bytes | None = None,
) -> ScriptCall[tuple[WriteResult, str | None]]:
    """First writer wins, notifying the turn's owner (`write_outcome.lua`, the workers' own); with the owner
    still to notify (`notify_owner`) when the script could not, on a Redis Cluster. `stored`: the outcome
    packed already (`pack_outcome`), so that a caller that notifies too compresses it once."""
    ttls = (retention.outcome_ttl_s, retention.audit_ttl_s)
    packed = pack_outcome(outcome) if stored is None else stored
    keys_, args = build_write_outcome_call(outcome.call_id, outcome.turn_id, packed, ttls=ttls)
    return _script(scripts.WRITE_OUTCOME, keys_, args, parse_write_reply)


def notify_owner(owner: str, outcome: ToolOutcome, stored: str | bytes) -> RedisCommand[Any]:
    """The `outcome` notification `write_outcome.lua` writes on one Redis, into `owner`'s inbox (`stored`:
    the outcome as `write_outcome` stored it, `pack_outcome`)."""
    fields = build_outcome_notification(outcome.turn_id or "", outcome.call_id, stored)
    return RedisCommand(build_notify_command(owner, fields), parse_reply)


def pop_reply(reply_key: str, block_s: float) -> RedisCommand[bool]:
    """Block up to `block_s` on a direct call's reply list; True when the outcome was announced."""
    return RedisCommand(("BLPOP", reply_key, block_s), lambda reply: reply is not None)


def delete(key: str) -> RedisCommand[Any]:
    """Delete one key."""
    return RedisCommand(("DEL", key), parse_reply)


def read_inbox(
    orchestrator_id: str, after: str, block_ms: int, count: int
) -> RedisCommand[list[tuple[str, dict[str, str]]]]:
    """Notifications for this orchestrator after `after`, blocking up to `block_ms` (already capped)."""
    return RedisCommand(
        _xread(keys.inbox(orchestrator_id), after, block_ms, count),
        lambda reply: [(i, codec.parse_fields(f)) for i, f in codec.parse_stream_reply(reply)],
    )


def ack_inbox(orchestrator_id: str, up_to_id: str) -> RedisCommand[Any]:
    """Trim the inbox up to and including `up_to_id`."""
    words = ("XTRIM", keys.inbox(orchestrator_id), "MINID", "~", codec.build_inbox_ack_id(up_to_id))
    return RedisCommand(words, parse_reply)


def heartbeat(orchestrator_id: str, now: float) -> RedisCommand[Any]:
    """Record that the orchestrator is alive at `now`."""
    return RedisCommand(("ZADD", keys.ORCHESTRATORS, now, orchestrator_id), parse_reply)


def unregister(orchestrator_id: str) -> Transaction[Any]:
    """Remove a stopping orchestrator and its inbox, together."""
    commands = (("ZREM", keys.ORCHESTRATORS, orchestrator_id), ("DEL", keys.inbox(orchestrator_id)))
    return Transaction(commands, parse_reply)


def ping() -> RedisCommand[bool]:
    """True when Redis answers."""
    return RedisCommand(("PING",), bool)
