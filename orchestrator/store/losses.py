"""What Redis lost, recorded in Redis: its identity, the notes of its data losses, lost turns' records.

Pure operations (`orchestrator.store.effects`), performed by either runner. The orchestrator's durability
watcher (`orchestrator.runtime.durability`) reads Redis's `run_id` (`INFO server`), which changes whenever
the server restarts or fails over, and a marker key that holds the run id under which it was written: when
the run id has changed, a marker written under an earlier run id means the data survived; a missing one,
or one written under the new run id (by a peer that saw the loss first), means Redis came back without
it. A loss is noted in one hash, one entry per new run id, for `toolloop show` to explain an unknown turn;
each lost turn this orchestrator held gets a terminal record (`record_lost.lua`).

Keys (`toolloop:redis:*`): `MARKER` (string, no TTL), `LOSSES` (hash: new run id -> JSON `RedisLoss`, kept
as long as a turn record, `keys.TURN_TTL_S`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import IntEnum
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from orchestrator.model import TurnOutcome, TurnRequest, TurnStatus
from orchestrator.store import codec
from orchestrator.store.effects import Batch, RedisCommand, ScriptCall, Transaction, parse_reply
from orchestrator.store.scripts import RECORD_LOST
from workers import keys

# How a lost turn's outcome says what happened: `error.provider` and `error.code` (`is_lost_outcome`).
LOST_PROVIDER = "redis"
LOST_CODE = "turn_lost"


class LostResult(IntEnum):
    """What `record_lost.lua` did with a turn."""

    PRESENT = 0  # the turn has its keys: not lost, or recorded already
    RECORDED = 1


class RedisLoss(BaseModel):
    """One time Redis came back without (some of) its data, as first noticed by an orchestrator.

    `kind` is `empty` when its data was gone (restarted without persistence, or from an older snapshot), and
    `partial` when it kept its data but turns an orchestrator held were missing (the last writes before a
    crash, with `appendfsync everysec`, or a failover to a replica that lagged).
    """

    detected_at: float
    old_run_id: str
    new_run_id: str
    kind: Literal["empty", "partial"]
    detected_by: str


def build_loss_line(loss: RedisLoss) -> str:
    """One line on a loss, for a person: when, what kind, and the run ids."""
    at = datetime.fromtimestamp(loss.detected_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    what = (
        "Redis came back without its data (restarted without persistence, or from an older snapshot)"
        if loss.kind == "empty"
        else "Redis came back without its latest writes (a crash or a failover)"
    )
    return f"{what}, noticed at {at} (run id {loss.old_run_id[:12]} -> {loss.new_run_id[:12]})"


def build_unknown_turn_message(unknown: str, known_losses: list[RedisLoss]) -> str:
    """What `show` says of an id Redis does not know: never submitted or expired — or, when Redis is known
    to have lost data, perhaps lost then (a turn queued at that time left no trace to tell it by)."""
    if not known_losses:
        return f"{unknown} (never submitted, or expired)"
    lines = "; ".join(build_loss_line(loss) for loss in known_losses[-3:])
    return (
        f"{unknown}: never submitted, expired, or lost with Redis's data — {lines}. A turn submitted before "
        "then and not shown is gone: submit it again"
    )


def is_lost_outcome(outcome: TurnOutcome | None) -> bool:
    """True for the outcome `record_lost` wrote: the turn was lost with Redis's data."""
    error = outcome.error if outcome is not None else None
    return error is not None and error.provider == LOST_PROVIDER and error.code == LOST_CODE


# --- operations ------------------------------------------------------------------------------------------


def _parse_run_id(reply: Any) -> str:
    if "run_id" in reply:
        return codec.text(reply["run_id"])
    # A Redis Cluster answers for each of its nodes: their run ids together change when any master restarts
    # or fails over.
    return ",".join(sorted(codec.text(info["run_id"]) for info in reply.values()))


def get_run_id() -> RedisCommand[str]:
    """The server's run id (a cluster's: its nodes' together): a new one after every restart or failover."""
    return RedisCommand(("INFO", "server"), _parse_run_id)


def get_marker() -> RedisCommand[str | None]:
    """The run id under which the marker was written; None when Redis has no marker."""
    marker = keys.REDIS_MARKER
    return RedisCommand(("GET", marker), lambda reply: None if reply is None else codec.text(reply))


def set_marker(run_id: str) -> RedisCommand[bool]:
    """Write the marker under `run_id` unless one is there (only its absence after a restart tells)."""
    words = ("SET", keys.REDIS_MARKER, run_id, "NX")
    return RedisCommand(words, lambda reply: reply is not None and bool(reply))


def note_loss(loss: RedisLoss) -> Transaction[bool]:
    """Note a loss (the first orchestrator to notice it writes the note) and mark the new run id."""
    commands: tuple[tuple[str | int | float, ...], ...] = (
        ("HSETNX", keys.REDIS_LOSSES, loss.new_run_id, loss.model_dump_json()),
        ("EXPIRE", keys.REDIS_LOSSES, keys.TURN_TTL_S),
        ("SET", keys.REDIS_MARKER, loss.new_run_id, "NX"),
    )
    return Transaction(commands, lambda replies: bool(replies[0]))


def _parse_losses(reply: Any) -> list[RedisLoss]:
    items = reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
    losses = []
    for _, raw in items:
        try:
            losses.append(RedisLoss.model_validate_json(codec.text(raw)))
        except ValidationError:
            continue  # a note this version cannot read explains nothing
    return sorted(losses, key=lambda loss: loss.detected_at)


def read_losses() -> RedisCommand[list[RedisLoss]]:
    """Every noted loss still kept, oldest first."""
    return RedisCommand(("HGETALL", keys.REDIS_LOSSES), _parse_losses)


def find_missing_turns(turn_ids: list[str]) -> RedisCommand[list[str]] | Batch[list[str]]:
    """Of `turn_ids`, those whose status key is gone (one MGET; on a cluster, one GET each in a pipeline, as
    each turn's keys are in their own slot): a held turn always has one."""
    ids = list(turn_ids)
    if keys.is_cluster_layout():
        gets = tuple(RedisCommand(("GET", keys.turn_status(t)), parse_reply) for t in ids)
        return Batch(gets, lambda raw: [t for t, value in zip(ids, raw, strict=True) if value is None])
    return RedisCommand(
        ("MGET", *(keys.turn_status(t) for t in ids)),
        lambda raw: [t for t, value in zip(ids, raw, strict=True) if value is None],
    )


def record_lost(
    turn_id: str, request: TurnRequest, outcome: TurnOutcome, now: float, ttl_s: int = keys.TURN_TTL_S
) -> ScriptCall[LostResult]:
    """The terminal record of a lost turn, unless the turn has its keys (`record_lost.lua`)."""
    summary = {
        **codec.build_turn_summary(turn_id, outcome),
        "lost": True,
        "error": outcome.error.message if outcome.error else None,
    }
    keys_ = (
        keys.turn_request(turn_id),
        keys.turn_status(turn_id),
        keys.turn_outcome(turn_id),
        keys.turn_events(turn_id),
        "" if keys.is_cluster_layout() else keys.TURNS_ACTIVE,  # a cluster's caller runs `cluster.leave`
    )
    args = (
        turn_id,
        request.model_dump_json(),
        TurnStatus.FAILED.value,
        outcome.model_dump_json(),
        str(ttl_s),
        json.dumps(summary),
        str(keys.EVENTS_MAXLEN),
        repr(now),
        codec.TURN_FINISHED,
    )
    return ScriptCall(RECORD_LOST, keys_, args, lambda reply: LostResult(int(reply)))
