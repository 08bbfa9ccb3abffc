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
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from importlib import resources
from typing import Any

from workers import keys
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


def build_write_outcome_call(
    call_id: str,
    turn_id: str | None,
    outcome_json: str,
    reply_key: str | None = None,
    fence: Fence | None = None,
    *,
    ttls: tuple[int, int] | None = None,
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of `write_outcome.lua`, so both sides write outcomes identically; with `fence`, the
    write is refused (FENCED) once a later execution of the call has started. `ttls`: how long the outcome
    and a late one are kept (default: the settings `TOOLLOOP_OUTCOME_TTL_S`, `TOOLLOOP_AUDIT_TTL_S`)."""
    if ttls is None:
        settings = get_worker_settings()
        ttls = (settings.outcome_ttl_s, settings.audit_ttl_s)
    script_keys = [
        keys.outcome(call_id),
        keys.late_outcomes(call_id),
        keys.turn_lease(turn_id) if turn_id else "",
        reply_key or "",
    ]
    args = [
        outcome_json,
        str(ttls[0]),
        keys.INBOX_PREFIX,
        call_id,
        turn_id or "",
        str(keys.INBOX_MAXLEN),
        str(keys.INBOX_OUTCOME_MAX_BYTES),
    ]
    if fence is not None:
        script_keys.append(keys.fence(call_id))
    args += [str(fence.attempt), fence.holder] if fence is not None else ["0", ""]
    args.append(str(ttls[1]))
    return script_keys, args


def parse_write_result(reply: Any) -> WriteResult:
    """The reply of `write_outcome.lua`."""
    return WriteResult(int(reply))


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


def parse_idempotency_claim(reply: Any) -> tuple[IdempotencyClaim, str | None]:
    """The reply of `claim_idempotency.lua`: the claim, and the stored success JSON when STORED."""
    claim, value = IdempotencyClaim(int(reply[0])), reply[1]
    if claim is not IdempotencyClaim.STORED:
        return claim, None
    return claim, value.decode("utf-8") if isinstance(value, bytes) else value
