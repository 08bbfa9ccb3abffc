"""The fence: which execution of a call is its current one, so that a hung worker cannot answer twice.

Every execution of a call (a delivery run by a pool process) carries a token unique to it,
`<dispatch attempt>|<worker>:<pid>:<suffix>`. Its start script (`start.lua`) stores the token in
`keys.fence(call_id, turn_id)`, followed by the call's count of executions (`<token>#<count>`,
`parse_fence`), and refuses outright a delivery of an older dispatch attempt once a newer
one has started there (SUPERSEDED). From then on an execution whose token is no longer the fence's was
superseded — its worker froze (SIGSTOP, a VM paused) past the hard limit and the orchestrator dispatched
the call again, say — and it does nothing more: it checks the fence before the tool's body
(`CallStore.is_current`), and `write_outcome.lua` checks it atomically with the write, refusing it as FENCED.

The worker's parent answers for a pool process it killed or lost without knowing that process's suffix: it
names the execution by the prefix `<dispatch attempt>|<worker>:<pid>:` (`build_process_holder`), which only
that process's execution of that delivery can match. A revoked delivery that never started names its dispatch
attempt alone (holder ''): it is fenced only by a newer dispatch.

A dead worker's call is taken over by the next delivery of the same dispatch (`is_takeover_due`). A broker
that redelivers at once — RabbitMQ requeues a consumer's unacked messages the moment its connection closes
— hands the call to another worker while the dead execution's running guard still holds it (it outlives the
hard limit), so the delivery would only wait and retry ("another execution holds the call") until the
orchestrator sent the call again. It takes the guard over, and the idempotency lock the dead execution held,
once the holder's worker has not beaten (`keys.worker_seen`, every `keys.WORKER_BEAT_S`) for
`TAKEOVER_SILENCE_S`, and still has not after `TAKEOVER_CONFIRM_S` more — a worker whose beat only waited for
Redis to come back beats again within that time. Only a delivery of the same dispatch attempt takes over: a
later dispatch (the orchestrator found the call lost) waits for the guard as before, so that a frozen worker
is never run beside by the orchestrator's own retry.
"""

from __future__ import annotations

import uuid

from workers import keys
from workers.scripts import Fence

# A holder's worker silent this long (no heartbeat), and still after the confirmation, is taken for dead:
# two missed beats, then two more. Both together stay well inside the running guard's margin past the hard
# limit (`workers.execution.RUNNING_MARGIN_S`), so the guard is still there to take over.
TAKEOVER_SILENCE_S = 2 * keys.WORKER_BEAT_S
TAKEOVER_CONFIRM_S = 2 * keys.WORKER_BEAT_S
# Between a fence's token and the call's count of executions (`parse_fence`): no token holds it.
FENCE_COUNT_SEPARATOR = "#"


def build_execution_token(attempt: int, worker: str, pid: int) -> str:
    """A fresh token for one execution of dispatch attempt `attempt` in pool process `pid` of `worker`."""
    return f"{build_process_holder(attempt, worker, pid)}{uuid.uuid4().hex[:12]}"


def build_process_holder(attempt: int, worker: str, pid: int) -> str:
    """The prefix of the tokens pool process `pid` of `worker` gives executions of dispatch `attempt`."""
    return f"{attempt}|{worker}:{pid}:"


def build_execution_fence(attempt: int, token: str) -> Fence:
    """The fence of a write by the execution holding `token`."""
    return Fence(attempt, token)


def build_delivery_fence(attempt: int, worker: str, pid: int | None) -> Fence:
    """The fence of a write by the worker's parent for a delivery it ran in pool process `pid` (None: the
    delivery never started, and only a newer dispatch attempt fences it)."""
    return Fence(attempt, build_process_holder(attempt, worker, pid) if pid else "")


def parse_token(token: str) -> tuple[int, str] | None:
    """(dispatch attempt, worker) of an execution token (`build_execution_token`); None for another value."""
    attempt, sep, rest = token.partition("|")
    worker, _, suffix = rest.rpartition(":")
    worker = worker.rpartition(":")[0]
    if not sep or not attempt.isdigit() or not worker or not suffix:
        return None
    return int(attempt), worker


def parse_fence(value: str) -> tuple[str, int | None]:
    """(token, count of executions) of a fence's value, `<token>#<count>` as `start.lua` writes it; the count
    is None for a fence an older worker wrote (the token alone, its count in `keys.attempts`)."""
    token, sep, count = value.rpartition(FENCE_COUNT_SEPARATOR)
    if not sep or not count.isdigit():
        return value, None
    return token, int(count)


def build_worker_silence_s(seen_pttl_ms: int) -> float:
    """How long a worker has not beaten, from the remaining life of its heartbeat key (its PTTL: -2 when
    gone). Read as the key's age, not its value, so that no two machines' clocks are compared."""
    if seen_pttl_ms < 0:
        return float("inf")
    return max(keys.WORKER_SEEN_TTL_S - seen_pttl_ms / 1000, 0.0)


def is_takeover_due(holder: str, attempt: int, worker: str, holder_silence_s: float) -> bool:
    """Whether an execution of dispatch `attempt` on `worker` may take the call over from `holder` (the
    running guard's token), its worker silent `holder_silence_s`: the same dispatch attempt on another
    worker that has been silent `TAKEOVER_SILENCE_S` (pure; the caller confirms it `TAKEOVER_CONFIRM_S`
    later)."""
    parsed = parse_token(holder)
    if parsed is None:
        return False
    holder_attempt, holder_worker = parsed
    return holder_attempt == attempt and holder_worker != worker and holder_silence_s >= TAKEOVER_SILENCE_S
