"""The turn scripts (`orchestrator/store/lua/*.lua`) and the typed result of each.

Loaded with the workers' loader (`workers.scripts.load_script`), which also gives the two scripts both sides
share: `write_outcome.lua` (first writer wins) and `release.lua` (a turn's lease is released like a call's
running guard). Each file's header states its KEYS, ARGV and reply; the builders of those KEYS/ARGV are in
`orchestrator.store.operations`, which passes every constant (statuses, event names, stream caps) as ARGV.

| script              | result                                                  |
| ------------------- | ------------------------------------------------------- |
| `submit.lua`        | `SubmitResult`: EXISTS / QUEUED / WAITING                |
| `claim.lua`         | skipped, or leased with its request                      |
| `take_over.lua`     | `TakeOverResult`: TAKEN / REFUSED                        |
| `find_orphans.lua`  | the orphaned turn ids                                    |
| `renew.lua`         | the 1-based indexes of the leases no longer held         |
| `keep_inbox.lua`    | 1 when the inbox was missing (created empty), else 0     |
| `save_step.lua`     | `SaveResult`: SAVED / TERMINAL / LEASE_LOST / HISTORY_GAP|
| `save_outcome.lua`  | `FinishResult`: FINISHED / ALREADY_TERMINAL              |
| `finish_step`       | `SaveResult`: SAVED (and finished) or the step's refusal |
| `read_history.lua`  | the values read, then the history they reference        |
| `append_events.lua` | the stream id of the last event added                   |
| `control.lua`       | `ControlResult`: UNKNOWN / TERMINAL / RECORDED           |
| `park.lua`          | `ParkResult`: PARKED / UNREAD / LEASE_LOST               |
| `wake.lua`          | the parked turn ids queued                               |
| `read_statuses.lua` | each active turn id and its status ('' when it has none) |
| `write_tasks.lua`   | the number of broker commands run                        |
| `rate_limit.lua`    | admit: (held by, ms to wait); settle: 1                 |
| `enqueue.lua`       | 1 QUEUED, 0 queued already (a Redis Cluster's, as all below) |
| `pick.lua`          | 0 none, 2 again, or the id picked                        |
| `lease.lua`         | leased with its request, or ended, or held elsewhere     |
| `unpick.lua`        | 1                                                        |
| `leave.lua`         | 1 when the turn was still active                         |
| `unpark.lua`        | 1 when the turn was parked (now queued)                  |
| `write_outcome.lua` | `workers.scripts.WriteResult`: WON / LOST                |
| `release.lua`       | `workers.scripts.ReleaseResult`: RELEASED / NOT_HELD     |
"""

from __future__ import annotations

from enum import IntEnum

from workers.scripts import RELEASE, WRITE_OUTCOME, ReleaseResult, Script, WriteResult, load_script

__all__ = [
    "APPEND_EVENTS",
    "CLAIM",
    "CONTROL",
    "ENQUEUE",
    "FIND_ORPHANS",
    "FINISH_STEP",
    "KEEP_INBOX",
    "LEASE",
    "LEAVE",
    "PARK",
    "PICK",
    "RATE_LIMIT",
    "READ_HISTORY",
    "READ_QUEUE",
    "READ_STATUSES",
    "RELEASE",
    "RENEW",
    "SAVE_OUTCOME",
    "SAVE_STEP",
    "SUBMIT",
    "TAKE_OVER",
    "UNPARK",
    "UNPICK",
    "WAKE",
    "WRITE_OUTCOME",
    "WRITE_TASKS",
    "ControlResult",
    "FinishResult",
    "ParkResult",
    "ReleaseResult",
    "SaveResult",
    "Script",
    "SubmitResult",
    "TakeOverResult",
    "WriteResult",
]

_PACKAGE = "orchestrator.store"

SUBMIT = load_script(_PACKAGE, "submit")
CLAIM = load_script(_PACKAGE, "claim")
TAKE_OVER = load_script(_PACKAGE, "take_over")
FIND_ORPHANS = load_script(_PACKAGE, "find_orphans")
RENEW = load_script(_PACKAGE, "renew")
KEEP_INBOX = load_script(_PACKAGE, "keep_inbox")
SAVE_STEP = load_script(_PACKAGE, "save_step")
SAVE_OUTCOME = load_script(_PACKAGE, "save_outcome")
CONTROL = load_script(_PACKAGE, "control")
RECORD_LOST = load_script(_PACKAGE, "record_lost")
READ_HISTORY = load_script(_PACKAGE, "read_history")
PARK = load_script(_PACKAGE, "park")
WAKE = load_script(_PACKAGE, "wake")
READ_STATUSES = load_script(_PACKAGE, "read_statuses")
APPEND_EVENTS = load_script(_PACKAGE, "append_events")
WRITE_TASKS = load_script(_PACKAGE, "write_tasks")
RATE_LIMIT = load_script(_PACKAGE, "rate_limit")
# A Redis Cluster's halves of submit.lua, claim.lua and save_outcome.lua in a turn queue shard's slot, the
# lease in the turn's, and a shard's read for the sweep (`orchestrator.store.cluster`).
ENQUEUE = load_script(_PACKAGE, "enqueue")
PICK = load_script(_PACKAGE, "pick")
LEASE = load_script(_PACKAGE, "lease")
UNPICK = load_script(_PACKAGE, "unpick")
LEAVE = load_script(_PACKAGE, "leave")
UNPARK = load_script(_PACKAGE, "unpark")
READ_QUEUE = load_script(_PACKAGE, "read_queue")


def build_finish_step(step: Script, end: Script) -> Script:
    """A turn's last step and its outcome as one script: `step` (save_step.lua) and, once it saved, `end`
    (save_outcome.lua), each file's body run whole as a function of its own KEYS and ARGV — one source for
    each rule, one round trip for the turn's end.

    KEYS: the step's, then the outcome's. ARGV: how many of the KEYS and of the ARGV are the step's, then the
    step's ARGV, then the outcome's. Returns the step's `SaveResult`: a refusal writes nothing (the outcome
    neither), SAVED means the outcome is stored too (the step found the turn live, so its terminal write is
    the first)."""
    source = f"""-- {step.name}.lua, then {end.name}.lua when the step saved: one round trip (built by
-- orchestrator.store.scripts.build_finish_step, whose docstring gives KEYS, ARGV and the reply).
local function save_step(KEYS, ARGV)
{step.source}
end
local function save_outcome(KEYS, ARGV)
{end.source}
end
local step_keys, step_args, end_keys, end_args = {{}}, {{}}, {{}}, {{}}
local nk, na = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 1, #KEYS do
  if i <= nk then step_keys[#step_keys + 1] = KEYS[i] else end_keys[#end_keys + 1] = KEYS[i] end
end
for i = 3, #ARGV do
  if i <= na + 2 then step_args[#step_args + 1] = ARGV[i] else end_args[#end_args + 1] = ARGV[i] end
end
local saved = save_step(step_keys, step_args)
if saved ~= 1 then return saved end
save_outcome(end_keys, end_args)
return 1
"""
    return Script("finish_step", source)


FINISH_STEP = build_finish_step(SAVE_STEP, SAVE_OUTCOME)


class SubmitResult(IntEnum):
    """What `submit.lua` did with a turn."""

    EXISTS = 0  # a turn with this id was stored before: a retried submit
    QUEUED = 1
    WAITING = 2  # parked behind its conversation's queued-or-running turn


class TakeOverResult(IntEnum):
    """What `take_over.lua` did with an orphan."""

    REFUSED = 0  # terminal, still queued normally, or already leased
    TAKEN = 1


class SaveResult(IntEnum):
    """What `save_step.lua` did with a step."""

    HISTORY_GAP = -2  # the history list lacks messages the state had: save again from its start
    LEASE_LOST = -1  # another orchestrator holds the lease: drop the turn
    TERMINAL = 0  # the turn already ended
    SAVED = 1


class FinishResult(IntEnum):
    """What `save_outcome.lua` did with a terminal outcome."""

    ALREADY_TERMINAL = 0  # an earlier terminal write won
    FINISHED = 1


class ParkResult(IntEnum):
    """What `park.lua` did with a turn that only waits for people."""

    LEASE_LOST = -1  # another orchestrator holds the lease: drop the turn
    UNREAD = 0  # a control request came that its owner has not read: read it, the turn stays
    PARKED = 1  # lease given up, in the parked set: forget the turn


class ControlResult(IntEnum):
    """What `control.lua` did with a cancel, an approval or a client-side tool's answer."""

    UNKNOWN = -1  # no such turn
    TERMINAL = 0  # the turn already ended
    RECORDED = 1
    DECIDED = 2  # an answer of this kind about this call was recorded already
