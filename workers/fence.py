"""The fence: which execution of a call is its current one, so that a hung worker cannot answer twice.

Every execution of a call (a delivery run by a pool process) carries a token unique to it,
`<dispatch attempt>|<worker>:<pid>:<suffix>`. Its start script (`start.lua`) stores the token in
`keys.fence(call_id)`, and refuses outright a delivery of an older dispatch attempt once a newer one has
started there (SUPERSEDED). From then on an execution whose token is no longer the fence's was superseded —
its worker froze (SIGSTOP, a VM paused) past the hard limit and the orchestrator dispatched the call again,
say — and it does nothing more: it checks the fence before the tool's body (`CallStore.is_current`), and
`write_outcome.lua` checks it atomically with the write, refusing it as FENCED.

The worker's parent answers for a pool process it killed or lost without knowing that process's suffix: it
names the execution by the prefix `<dispatch attempt>|<worker>:<pid>:` (`build_process_holder`), which only
that process's execution of that delivery can match. A revoked delivery that never started names its dispatch
attempt alone (holder ''): it is fenced only by a newer dispatch.
"""

from __future__ import annotations

import uuid

from workers.scripts import Fence


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
