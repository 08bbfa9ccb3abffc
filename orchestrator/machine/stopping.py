"""The one stop path of a turn and its terminal shapes (docs/design/turns.md, "The one stop path").

Every stop — a limit, a stop policy, the deadline, a cancel, a provider error — goes through `begin_stop`:
calls that have no outcome get one asked for (synthetic when the call did not get to finish), in-flight
tasks are revoked on a hard stop (deadline, cancel), and the turn finishes once every call of the round is
answered. `finish_turn` builds the `TurnOutcome`; a stopped turn's last assistant message never carries
tool calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from orchestrator.machine.draft import Draft
from orchestrator.machine.events import CancelChildTurns, Finish
from orchestrator.machine.state import MODEL_RETRY_TIMER_PREFIX, PendingStop, build_child_turn_id
from orchestrator.model import (
    LIMIT_STOP_REASONS,
    AssistantMessage,
    Message,
    ProviderError,
    StopReason,
    ToolMessage,
    TurnOutcome,
    TurnStatus,
)
from workers.contract import FailureKind

# Stops that cannot wait for work in flight: its tasks are revoked and its calls answered at once.
HARD_STOPS: frozenset[str] = frozenset({"deadline", "cancelled"})
_HARD_KINDS = {"deadline": FailureKind.DEADLINE_EXCEEDED, "cancelled": FailureKind.CANCELLED}


def describe_stop(draft: Draft, reason: StopReason, detail: str | None = None) -> str:
    """The closing text of a turn that ended for `reason`."""
    limits = draft.state.limits
    texts: dict[str, str] = {
        "max_llm_calls": f"the limit of {limits.max_llm_calls} model calls was reached",
        "max_tool_executions": f"the limit of {limits.max_tool_executions} tool executions was reached",
        "max_tool_rounds": f"the limit of {limits.max_tool_rounds} tool rounds was reached",
        "deadline": f"the turn's deadline of {limits.deadline_s:g} s passed",
        "tool_failure": "a tool call failed",
        "confirmation_denied": "a tool call was denied by a person",
        "policy_denied": "a tool call was denied by policy",
        "repeated_failure": "the same tool failure happened twice",
        "repeat_guard": f"the same tool call was asked for {limits.repeat_guard_rounds} rounds in a row",
        "cancelled": "the turn was cancelled",
        "provider_error": "the model provider returned an error",
        "empty_answer": "the model gave no answer",
        "invalid_output": "the model's answer did not match the output schema",
        "max_total_tokens": f"the budget of {limits.max_total_tokens or 0:,} tokens was spent",
        "max_cost": f"the budget of ${limits.max_cost_usd or 0:g} was spent",
        "quota_exceeded": f"tenant {draft.state.tenant!r} has used up its quota",
    }
    text = texts[reason]
    return f"{text}: {detail}" if detail else text


def begin_stop(
    draft: Draft,
    reason: StopReason,
    at: float,
    *,
    detail: str | None = None,
    error: ProviderError | None = None,
    status: Literal["stopped", "failed"] | None = None,
    message: str | None = None,
) -> None:
    """Decide that the turn ends and answer what can be answered now; it finishes once nothing is pending.

    A hard stop (deadline, cancel) replaces a soft one already decided; otherwise the first stop wins.
    `status` and `message` replace the reason's own (a budget that cannot be kept fails the turn).
    """
    existing = draft.state.stop
    hard = reason in HARD_STOPS
    if existing is not None and (existing.reason in HARD_STOPS or not hard):
        return
    message = message or describe_stop(draft, reason, detail)
    draft.update(
        stop=PendingStop(status=status or _status_for(reason), reason=reason, message=message, error=error),
        awaiting_model=None,
    )
    for timer_id in [t for t in draft.state.timers if t.startswith(MODEL_RETRY_TIMER_PREFIX)]:
        draft.disarm(timer_id)
    _answer_pending_calls(draft, reason, at, hard=hard)
    draft.emit("turn_stopping", reason=reason, message=message)


def _status_for(reason: StopReason) -> Literal["stopped", "failed", "cancelled"]:
    if reason == "cancelled":
        return "cancelled"
    # The model could not give what was asked (an answer, one that fits the schema): the turn failed.
    if reason in ("provider_error", "empty_answer", "invalid_output"):
        return "failed"
    return "stopped"


def _answer_pending_calls(draft: Draft, reason: StopReason, at: float, *, hard: bool) -> None:
    current = draft.state.current
    if current is None:
        return
    kind = _HARD_KINDS.get(reason, FailureKind.SKIPPED)
    children = [
        build_child_turn_id(draft.state.turn_id, call.call_id)
        for call in current.calls
        if call.waiting and call.wait is not None and call.wait.waiting_for == "child_turn"
    ]
    if children:
        # A sub-agent's child runs on its parent's behalf: the parent stopping stops it too.
        draft.commands.append(CancelChildTurns(turn_ids=children, reason=f"its parent stopped ({reason})"))
    for call in current.calls:
        if call.finished or call.requested is not None:
            continue
        if call.in_flight and not hard:
            continue  # a soft stop lets running calls finish: they are bounded by their hard limits
        if call.in_flight and call.task_id is not None:
            draft.revokes.append(call.task_id)
        message = _call_stop_message(draft, reason, ran=call.in_flight)
        if call.waiting_for_worker_since is not None:
            message += f": it waited in its queue, and no worker of '{call.tool}' came up to run it"
        draft.request_failure(call, kind, message, at, synthetic=True)
        draft.emit("tool_synthesis_requested", call_id=call.call_id, tool=call.tool, failure_kind=kind.value)


def _call_stop_message(draft: Draft, reason: StopReason, *, ran: bool) -> str:
    if reason == "deadline":
        verb = "did not finish" if ran else "did not run"
        return f"the call {verb} before the turn's deadline of {draft.state.limits.deadline_s:g} s"
    if reason == "cancelled":
        return "the turn was cancelled" + (" while the call was running" if ran else " before the call ran")
    return f"not run: the turn stopped ({describe_stop(draft, reason)})"


def finish_turn(draft: Draft, at: float, output: Any = None) -> None:
    """End the turn with its pending stop, or as completed when none: build the outcome, emit Finish.

    `output`: a completed typed turn's answer, parsed and validated."""
    state = draft.state
    stop = state.stop
    history = list(state.history)
    if stop is not None and history and isinstance(history[-1], ToolMessage):
        # The conversation must not end on an assistant message that asks for tools.
        history.append(AssistantMessage(content=f"{_STATUS_WORD[stop.status]}: {stop.message}."))
    text = _final_text(history) if stop is None else f"{_STATUS_WORD[stop.status]}: {stop.message}."
    outcome = TurnOutcome(
        turn_id=state.turn_id,
        status="completed" if stop is None else stop.status,
        stop_reason=None if stop is None else stop.reason,
        # A limit stop, not a budget that could not be kept (a `failed` one).
        limit_reached=stop is not None and stop.status == "stopped" and stop.reason in LIMIT_STOP_REASONS,
        text=text,
        messages=history,
        usage=state.usage,
        llm_calls=state.llm_calls,
        tool_executions=state.tool_executions,
        model=state.model,
        error=None if stop is None else stop.error,
        llm_call_records=list(state.llm_call_records),
        output=output if stop is None else None,
        approvals=list(state.approvals),
        children=list(state.children),
        agent=state.agent,
    )
    for timer_id in list(state.timers):
        draft.disarm(timer_id)
    draft.flush()
    draft.update(history=history, status=TurnStatus(outcome.status), outcome=outcome, awaiting_model=None)
    draft.emit(
        "turn_finished",
        status=outcome.status,
        stop_reason=outcome.stop_reason,
        llm_calls=outcome.llm_calls,
        tool_executions=outcome.tool_executions,
        duration_ms=round((at - state.started_at) * 1000.0, 3),
    )
    draft.commands.append(Finish(outcome=outcome))


_STATUS_WORD = {"stopped": "Stopped", "failed": "Failed", "cancelled": "Cancelled"}


def _final_text(history: Sequence[Message]) -> str | None:
    last = history[-1] if history else None
    return last.content if isinstance(last, AssistantMessage) else None
