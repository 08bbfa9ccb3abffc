"""The Lua scripts as files: the loader, the scripts workers run, and the typed result of each.

Every atomic step toolloop takes in Redis is a `.lua` file beside the package that runs it (`workers/lua/`,
`orchestrator/store/lua/`), shipped as package data and read once with `importlib.resources`; each file's
header states its KEYS, ARGV and result. A script answers with small integers, and an `IntEnum` per script
names them, so no caller compares a reply with a bare number. Constants a script needs (stream caps, the
inline payload limit, statuses) come in as ARGV from Python (`workers.keys`), never spelled in Lua.

Scripts here, all run by workers; the orchestrator shares `WRITE_OUTCOME` (its timers and direct calls write
synthetic outcomes through the same first-writer-wins step) and `RELEASE` (a turn's lease):
- `write_outcome.lua` → `WriteResult`: WON / LOST / FENCED.
- `start.lua` → `StartResult`: STARTED / FINISHED / HELD / SUPERSEDED / TURN_GONE.
- `claim_idempotency.lua` → `IdempotencyClaim`: CLAIMED / STORED / BUSY.
- `release.lua` → `ReleaseResult`: RELEASED / NOT_HELD.
- `progress.lua` → `ProgressResult`: ADDED / ENDED / CALL_DONE (a tool's `ctx.progress`, `workers.progress`).
- `slots.lua` → `SlotResult`: ACQUIRED / TOOL_FULL / TENANT_FULL, and releases (`workers.concurrency`).
- `slot_waiting.lua` → `SlotWaitingResult`: ADDED / ENDED / CALL_DONE / TOLD (`tool_waiting_for_slot`).

On a Redis Cluster (`workers.keys.is_cluster_layout`) every key one script is given must be in one slot, and
the layout puts them there: a call's keys and its turn's in the turn's (a direct call's in its own), a tool's
slots in the tool's, an idempotency record and its lock in their digest's. Two things differ there. A key a
script goes without is given as another of its keys again instead of '' (which is a key of slot 0:
`build_absent_key`, `workers.concurrency.build_slot_script_keys`). And the owner's inbox, another slot, is
written by the caller, not by `start.lua` and `write_outcome.lua`: given an empty inbox prefix, they add
nothing to it and name the owner in their reply, and the caller adds the same notification
(`build_started_notification`, `build_outcome_notification`: the fields the scripts write on one Redis) with
`build_notify_command`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from importlib import resources
from typing import Any

from workers import keys, packing
from workers.settings import get_worker_settings


@dataclass(frozen=True)
class Script:
    """One Lua script: its name (the file's stem) and its source."""

    name: str
    source: str


def load_script(package: str, name: str) -> Script:
    """The script `lua/<name>.lua` shipped inside `package` (works from a wheel as from a checkout)."""
    source = resources.files(package).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")
    return Script(name, source)


WRITE_OUTCOME = load_script("workers", "write_outcome")
START = load_script("workers", "start")
CLAIM_IDEMPOTENCY = load_script("workers", "claim_idempotency")
RELEASE = load_script("workers", "release")
PROGRESS = load_script("workers", "progress")
SLOTS = load_script("workers", "slots")
SLOT_WAITING = load_script("workers", "slot_waiting")


class WriteResult(IntEnum):
    """What `write_outcome.lua` did: this outcome is the call's one outcome, or an earlier one was, or the
    writer was superseded by a later execution of the call (the fence) and wrote nothing."""

    LOST = 0
    WON = 1
    FENCED = 2


class StartResult(IntEnum):
    """How `start.lua` turned out. `CallStore.start` gives a started execution's attempt number (≥ 1) in place
    of STARTED, and FINISHED or HELD themselves otherwise."""

    STARTED = 0
    FINISHED = -1  # the call already has an outcome
    HELD = -2  # another execution holds the running guard
    SUPERSEDED = -3  # a later dispatch of the call has started (the fence): this delivery runs nothing
    TURN_GONE = -4  # the call's turn no longer exists in Redis: nobody waits for an answer


class IdempotencyClaim(IntEnum):
    """What `claim_idempotency.lua` found for an idempotency key."""

    CLAIMED = 0  # this call holds the key's lock: run the tool
    STORED = 1  # a stored success: replay it
    BUSY = 2  # another call holds the lock


class ReleaseResult(IntEnum):
    """What `release.lua` did."""

    NOT_HELD = 0
    RELEASED = 1


class ProgressResult(IntEnum):
    """What `progress.lua` did with a `tool_progress` event."""

    ENDED = 0  # the turn is gone or finished: nothing added, and nothing more will be
    ADDED = 1
    CALL_DONE = 2  # the call has its outcome, or a later execution superseded this one: nothing added


class SlotResult(IntEnum):
    """What `slots.lua` did with an acquire: a slot taken in each of the call's limits, or none."""

    TOOL_FULL = 0  # the tool's `max_concurrency` slots are all held
    ACQUIRED = 1
    TENANT_FULL = 2  # the tenant's `max_concurrency_per_tenant` slots of the tool are all held


class SlotWaitingResult(IntEnum):
    """What `slot_waiting.lua` did with a `tool_waiting_for_slot` event."""

    ENDED = 0  # the turn is gone or finished
    ADDED = 1
    CALL_DONE = 2  # the call has its outcome
    TOLD = 3  # this dispatch attempt of the call was told already


@dataclass(frozen=True)
class Fence:
    """Who writes an outcome, for the fence of `write_outcome.lua` (`workers.fence`): the dispatch attempt,
    and the execution's token or a prefix of it ('' stands for any execution of that attempt)."""

    attempt: int
    holder: str


def build_absent_key(first_key: str) -> str:
    """What a script is given for a key it goes without (a call's turn lease when it has no turn, say): ''
    on one Redis; on a Redis Cluster its first key again, since every key of a script must be in one slot and
    '' is a key of slot 0. The scripts take either as none."""
    return first_key if keys.is_cluster_layout() else ""


def fill_absent_keys(script_keys: Sequence[str]) -> list[str]:
    """A script's KEYS with each absent one ('') given as `build_absent_key` of its first key: what a caller
    that builds its KEYS with '' for none (the orchestrator's operations) sends."""
    if not script_keys:
        return []
    absent = build_absent_key(script_keys[0])
    return [key or absent for key in script_keys]


def build_inbox_prefix(notify: bool | None = None) -> str:
    """The inbox prefix `start.lua` and `write_outcome.lua` are given: `keys.INBOX_PREFIX` when they notify
    the owner themselves (`notify`; default: on one Redis), '' when the caller does (on a Redis Cluster,
    where the owner's inbox is in another slot than the call's keys)."""
    in_script = not keys.is_cluster_layout() if notify is None else notify
    return keys.INBOX_PREFIX if in_script else ""


def build_started_notification(
    turn_id: str, call_id: str, *, attempt: int, worker: str, at: str
) -> dict[str, str]:
    """The fields of a `started` notification in the owner's inbox, as `start.lua` writes them (in this
    order): the turn, the call's wire id, the execution's attempt count, the worker, when it started (the
    `at` the script was given)."""
    return {
        "kind": "started",
        "turn": turn_id,
        "call": call_id,
        "attempt": str(attempt),
        "worker": worker,
        "at": at,
    }


def build_outcome_notification(turn_id: str, call_id: str, stored: str | bytes) -> dict[str, str | bytes]:
    """The fields of an `outcome` notification in the owner's inbox, as `write_outcome.lua` writes them: the
    turn, the call's wire id and the outcome as stored (`packing.pack` of its JSON, as its writer packed it
    for `build_write_outcome_call`: compressed once) when that is at most `keys.INBOX_OUTCOME_MAX_BYTES`
    bytes ('' otherwise: the owner reads it from its key)."""
    small = packing.stored_size(stored) <= keys.INBOX_OUTCOME_MAX_BYTES
    return {"kind": "outcome", "turn": turn_id, "call": call_id, "outcome": stored if small else ""}


def build_notify_command(owner: str, fields: Mapping[str, str | bytes]) -> tuple[str | bytes | int, ...]:
    """The XADD of one notification into `owner`'s inbox, capped as the scripts cap it (MAXLEN ~
    `keys.INBOX_MAXLEN`). NOMKSTREAM: the scripts write only while the owner's lease lives, so its inbox
    exists (`keys.build_inbox_ttl_s`); a caller that writes a moment after reading the lease creates none
    that would never expire."""
    words: list[str | bytes | int] = [
        "XADD",
        keys.inbox(owner),
        "NOMKSTREAM",
        "MAXLEN",
        "~",
        keys.INBOX_MAXLEN,
        "*",
    ]
    for field, value in fields.items():
        words += [field, value]
    return tuple(words)


def build_write_outcome_call(
    call_id: str,
    turn_id: str | None,
    stored: str | bytes,
    reply_key: str | None = None,
    fence: Fence | None = None,
    *,
    ttls: tuple[int, int] | None = None,
    notify: bool | None = None,
    running_holder: str | None = None,
    running_holder_is_prefix: bool = False,
) -> tuple[list[str], list[str | bytes]]:
    """KEYS and ARGV of `write_outcome.lua`, so both sides write outcomes identically (`stored`: the
    outcome as stored, `packing.pack` of its JSON); with `fence`, the write is refused (FENCED) once a later
    execution of the call has started. `ttls`: how long the outcome and a late one are kept (default: the
    settings `TOOLLOOP_OUTCOME_TTL_S`, `TOOLLOOP_AUDIT_TTL_S`).

    `running_holder`: the token of the execution whose running guard goes with the write, whatever its
    result (with `running_holder_is_prefix`, any token starting with it; '': whoever holds it), as
    `release.lua` would drop it; None: the guard is left alone.

    `notify`: whether the script notifies the turn's owner itself (default: on one Redis). Without, its reply
    is `[result, owner]` (`parse_write_reply`), and the caller of a WON write with an owner adds
    `build_outcome_notification` to its inbox (`build_notify_command`)."""
    if ttls is None:
        settings = get_worker_settings()
        ttls = (settings.outcome_ttl_s, settings.audit_ttl_s)
    outcome_key = keys.outcome(call_id, turn_id)
    absent = build_absent_key(outcome_key)
    script_keys = [
        outcome_key,
        keys.late_outcomes(call_id, turn_id),
        keys.turn_lease(turn_id) if turn_id else absent,
        reply_key or absent,
    ]
    args: list[str | bytes] = [
        stored,
        str(ttls[0]),
        build_inbox_prefix(notify),
        call_id,
        turn_id or "",
        str(keys.INBOX_MAXLEN),
        str(keys.INBOX_OUTCOME_MAX_BYTES),
    ]
    if fence is not None or running_holder is not None:
        script_keys.append(keys.fence(call_id, turn_id) if fence is not None else absent)
    args += [str(fence.attempt), fence.holder] if fence is not None else ["0", ""]
    args.append(str(ttls[1]))
    if running_holder is not None:
        script_keys.append(keys.running(call_id, turn_id))
        args += [running_holder, "1" if running_holder_is_prefix else ""]
    return script_keys, args


def parse_owner(value: Any) -> str | None:
    """An owner a script's reply names (an orchestrator id); None for none."""
    if value is None or value is False or value in {b"", ""}:
        return None
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def parse_write_reply(reply: Any) -> tuple[WriteResult, str | None]:
    """The reply of `write_outcome.lua`, and the owner the caller must notify of a WON write when the
    script did not (its reply `[result, owner]`); None when the script notified, or there is no owner."""
    if isinstance(reply, list | tuple):
        return WriteResult(int(reply[0])), parse_owner(reply[1])
    return WriteResult(int(reply)), None


def parse_write_result(reply: Any) -> WriteResult:
    """The result of `write_outcome.lua`, whichever its reply's shape (`parse_write_reply`)."""
    return parse_write_reply(reply)[0]


def parse_release_result(reply: Any) -> ReleaseResult:
    """The reply of `release.lua`."""
    return ReleaseResult(int(reply))


def parse_start_reply(reply: Any) -> tuple[int, int]:
    """The reply of `start.lua` as `CallStore.start` gives it: (attempt, 0) for a started execution,
    (StartResult.FINISHED, 0), (StartResult.HELD, pttl ms), (StartResult.SUPERSEDED, current attempt) or
    (StartResult.TURN_GONE, 0)."""
    result, value = StartResult(int(reply[0])), int(reply[1])
    if result is StartResult.STARTED:
        return value, 0
    return result, value


def parse_start_owner(reply: Any) -> str | None:
    """The owner to notify of a started execution when `start.lua` did not (given an empty inbox prefix, its
    reply is `[0, attempt, owner]`); None otherwise."""
    return parse_owner(reply[2]) if len(reply) > 2 else None


def parse_idempotency_claim(reply: Any) -> tuple[IdempotencyClaim, str | None]:
    """The reply of `claim_idempotency.lua`: the claim, and the stored success JSON when STORED."""
    claim, value = IdempotencyClaim(int(reply[0])), reply[1]
    if claim is not IdempotencyClaim.STORED:
        return claim, None
    return claim, value.decode("utf-8") if isinstance(value, bytes) else value
