"""Calls that wait outside the turn for a person, and the turn's running clock (pure).

A call of a tool that requires confirmation waits for a person's answer (`CallWait`), with a limit of its own:
the turn's `limits.approval_timeout_s`, else its tool's `approval_timeout_s`, else
DEFAULT_APPROVAL_TIMEOUT_S (24 hours), armed as the timer `wait:<call id>`. When it passes, the wait's
`on_timeout` answers the call (`tool_round.on_wait_timeout`): "deny" (the default: the model reads that no
one approved it) or "approve" (it runs).

Waiting is not running. While every call the turn has left waits for a person, its running clock is paused
(`paused_at`, the deadline timer disarmed); when the first of them is answered, the deadline moves out by the
pause (`keep_clock`), and the turn runs on with the running time it had left. Such a turn holds nothing
worth keeping in memory: `parkable` tells the runtime so, and when its earliest wait ends.

A call of a client-side tool (`TurnState.client_tools`) waits the same way for its caller's result
(`build_client_wait`: the turn's `limits.client_tool_timeout_s`, else DEFAULT_CLIENT_TOOL_TIMEOUT_S); when
its limit passes, its outcome is `timeout`.

A call waiting in a state written before waits had limits (no `wait`) keeps the old rule: the turn's clock
runs, and its deadline answers the call.

Design notes: docs/design/approvals.md, "Waiting is not running".
"""

from __future__ import annotations

from orchestrator.machine.draft import Draft
from orchestrator.machine.state import DEADLINE_TIMER, CallState, CallWait, TurnState
from orchestrator.model import DEFAULT_APPROVAL_TIMEOUT_S, DEFAULT_CLIENT_TOOL_TIMEOUT_S


def build_wait(state: TurnState, tool: str, at: float) -> CallWait:
    """The wait of a call of `tool` for a person's approval, from `at`: the turn's limits first, then the
    tool's own settings, then the defaults."""
    spec = state.offered.get(tool)
    limits = state.limits
    timeout_s = (
        limits.approval_timeout_s
        or (spec.approval_timeout_s if spec is not None else None)
        or DEFAULT_APPROVAL_TIMEOUT_S
    )
    action = limits.on_approval_timeout or (spec.on_approval_timeout if spec is not None else None) or "deny"
    return CallWait(waiting_for="approval", since=at, deadline_at=at + timeout_s, on_timeout=action)


def build_client_wait(state: TurnState, at: float) -> CallWait:
    """The wait of a call of a client-side tool for its caller's result, from `at`."""
    timeout_s = state.limits.client_tool_timeout_s or DEFAULT_CLIENT_TOOL_TIMEOUT_S
    return CallWait(waiting_for="client_result", since=at, deadline_at=at + timeout_s)


def waiting_calls(state: TurnState) -> list[CallState]:
    """The calls of the current round that wait for a person, in call order."""
    if state.current is None:
        return []
    return [call for call in state.current.calls if call.waiting]


def only_waiting(state: TurnState) -> bool:
    """True when the turn does nothing but wait for people: every call of its round still unanswered waits,
    with a limit of its own, and nothing else is under way (no model call, no stop decided)."""
    current = state.current
    if current is None or state.terminal or state.stop is not None or state.awaiting_model is not None:
        return False
    left = [call for call in current.calls if not call.finished]
    return bool(left) and all(call.waiting and call.wait is not None for call in left)


def waits_for_child(state: TurnState) -> bool:
    """True when a call of the round waits for a sub-agent's child turn, which runs on the turn's time."""
    return any(
        call.wait.waiting_for == "child_turn" for call in waiting_calls(state) if call.wait is not None
    )


def keep_clock(draft: Draft, at: float) -> None:
    """Pause the running clock when the turn starts doing nothing but wait (for people or a caller; a child
    turn runs on the parent's time, so a wait for one keeps it running), and when it runs again move its
    deadline out by the pause (re-arming the deadline timer)."""
    state = draft.state
    idle = only_waiting(state) and not waits_for_child(state)
    if idle and state.paused_at is None:
        draft.update(paused_at=at)
        draft.disarm(DEADLINE_TIMER)
    elif not idle and state.paused_at is not None:
        paused_s = max(0.0, at - state.paused_at)
        deadline_at = state.deadline_at + paused_s
        draft.update(paused_at=None, deadline_at=deadline_at)
        draft.arm(DEADLINE_TIMER, deadline_at)
        draft.emit("deadline_moved", deadline_at=deadline_at, paused_s=round(paused_s, 3))


def parkable(state: TurnState) -> float | None:
    """When a turn that does nothing but wait for people must next be looked at (the earliest of its waits'
    deadlines, epoch seconds); None for a turn that is doing something (it stays in its orchestrator)."""
    if not only_waiting(state):
        return None
    child = waits_for_child(state)
    if state.paused_at is None and not child:
        return None
    deadlines = [call.wait.deadline_at for call in waiting_calls(state) if call.wait is not None]
    if state.paused_at is None:
        deadlines.append(state.deadline_at)  # the clock runs while a child does: its deadline wakes it
    return min(deadlines) if deadlines else None
