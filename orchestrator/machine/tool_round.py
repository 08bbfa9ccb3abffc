"""The tool half of the loop: one round of calls from request to answers.

`plan_round` sorts a model response's calls: rejected before dispatch (validation, policy hook), refused by
a limit or the repeat guard, waiting for a person, or dispatched in parallel. The other handlers take the
events of a round (waiting for a worker, started, finished, approval, lost-call timer); `complete_round`
appends the assistant message and one tool message per call, in call order, once every call is answered.

Lost work: when a worker reports that a call started, `on_tool_started` arms a lost-call timer at the tool's
hard limit plus a grace; if no outcome came by then, the worker died with it (`on_lost_timer` dispatches it
again while retries allow, else answers `worker_lost`) — unless that worker has not reported in since the
call's hard limit: cut off from Redis, it may hold the call's result in its spool, so the call waits up to
TOOLLOOP_LOST_CALL_WAIT_S more for it (`on_worker_checked`). A dispatched call that never reports a start
gets no such timer: only the turn's deadline ends it. That is on purpose. A task may wait in its queue
behind busy workers for any time, and its limits only count once it runs; from here a queued task cannot be
told from a lost message, so any timer counted from dispatch would either answer `worker_lost` for calls about
to run (and then run them anyway) or fire no earlier than the deadline. What a new owner cannot know either is
whether a dispatch persisted by its dead predecessor was ever published, or whether a start reported to it
was lost with it: `machine.resume` sends every dispatched call with no recorded start once more, as the
same task (same task id and attempt). That is a redelivery, which workers already make harmless:
a call that has an outcome is skipped, one that is running is waited for, so the tool never runs
twice, and a call that was never published runs instead of waiting for the deadline.

Waiting for a worker: a call the runtime sent while no live worker served its tool, though one did within
TOOLLOOP_TOOL_GONE_AFTER_S (`validation.classify_tool`), is marked so (`on_tool_waiting_for_worker`) until
a worker reports its start. Its limits count from that start, as always: the wait is queue time, ended only
by the turn's deadline.

Waiting for a person: a call of a tool that requires confirmation is not dispatched; it waits (`CallWait`,
`machine.waits`) with a limit of its own, announced once (`call_waiting`, `AskAttention`). A person's answer
(`on_approval`) runs it, edited or not, or denies it; past the limit `on_wait_timeout` denies it (synthetic:
no stop policy counts it) or runs it, as the wait's `on_timeout` says. Either way the answer, who gave it and
why go into the turn's `approvals`.

Waiting for the caller: a call of a client-side tool (`TurnState.client_tools`) is never dispatched either;
it waits the same way for the result its caller runs it for (`on_client_result`), or past its limit is
answered `timeout` (synthetic).

Design notes: docs/design/tool-calls.md, "Time limits and lost work"; docs/design/approvals.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.machine.agents import hand_off, on_child_timeout, on_child_turn_finished, start_child
from orchestrator.machine.budgets import check_budget
from orchestrator.machine.draft import Draft, build_dispatch, build_task_id, round_of
from orchestrator.machine.events import (
    ApprovalGiven,
    AskAttention,
    AwaitApproval,
    CheckWorker,
    ChildTurnFinished,
    ClientResultGiven,
    ToolFinished,
    ToolStarted,
    ToolWaitingForWorker,
    WaitingCall,
    WorkerChecked,
)
from orchestrator.machine.state import (
    LOST_TIMER_PREFIX,
    CallState,
    LateOutcome,
    RoundState,
    TurnState,
    find_call,
    lost_timer_id,
    wait_timer_id,
)
from orchestrator.machine.stopping import begin_stop
from orchestrator.machine.validation import validate_call
from orchestrator.machine.waits import build_client_wait, build_wait, keep_clock
from orchestrator.model import (
    ApprovalDecision,
    AssistantMessage,
    StopReason,
    ToolCall,
    ToolMessage,
    Turn,
    TurnStatus,
    assistant_message_from_turn,
)
from workers.contract import FailureKind, ToolOutcome, ToolSpec, derive_content, redact

# Outcomes that say the turn (or an operator) stopped a call, not that the tool failed: no stop policy
# counts them (a call revoked from Flower is just an outcome).
_NOT_TOOL_FAILURES = frozenset({FailureKind.CANCELLED, FailureKind.SKIPPED, FailureKind.DEADLINE_EXCEEDED})
_DEFAULT_TIME_LIMIT_S = 60.0

Policy = Callable[[ToolCall, TurnState], str | None]
"""A pure stop-policy hook: a denial reason for a call before dispatch, or None to allow it."""


def plan_round(draft: Draft, turn: Turn, at: float, policy: Policy | None) -> None:
    """Start a round for a response with tool calls: answer, refuse, park or dispatch each call."""
    state = draft.state
    tool_calls = _unique_ids(state, turn.tool_calls)
    assistant = assistant_message_from_turn(turn).model_copy(update={"tool_calls": tool_calls})
    calls = [
        CallState(call_id=c.id, tool=c.name, arguments=c.arguments, index=i) for i, c in enumerate(tool_calls)
    ]
    streaks = _next_streaks(state, tool_calls)
    draft.update(
        current=RoundState(index=state.rounds + 1, assistant=assistant, calls=calls),
        rounds=state.rounds + 1,
        repeat_streaks=streaks,
    )
    valid = _reject_invalid(draft, tool_calls, at, policy)
    spent = check_budget(draft.state)
    if spent is not None:
        # The answer that asked for these calls spent a budget: none runs, each is answered `skipped`.
        begin_stop(draft, spent.reason, at, status=spent.status, message=spent.message)
        return
    stop = _round_stop(draft, state, [tool_calls[i] for i in valid], streaks, at)
    if stop is not None:
        begin_stop(draft, stop[0], at, detail=stop[1])
        return
    slots = state.limits.max_tool_executions - state.tool_executions
    waiting: list[CallState] = []
    for index in valid[: max(slots, 0)]:
        call = round_of(draft.state).calls[index]
        if call.tool in state.client_tools:
            call = call.replace(waiting_approval=True, wait=build_client_wait(state, at))
            draft.replace_call(call)
            waiting.append(call)
        elif call.tool in state.sub_agents:
            child = start_child(draft, call, at)
            if child is not None:
                waiting.append(child)
        elif call.tool in state.handoffs:
            hand_off(draft, call, at)
        elif state.offered[call.tool].requires_confirmation:
            call = call.replace(waiting_approval=True, wait=build_wait(state, call.tool, at))
            draft.replace_call(call)
            waiting.append(call)
        else:
            dispatch_call(draft, call, 1, at)
    if len(valid) > slots:
        # No overshoot: the calls past the limit are answered `skipped` and the turn stops.
        begin_stop(draft, "max_tool_executions", at)
    if waiting and draft.state.stop is None:
        _start_waits(draft, waiting)


def _start_waits(draft: Draft, calls: Sequence[CallState]) -> None:
    """Calls start waiting outside the turn: arm each wait's timer and say so on the turn's stream
    (`call_waiting`); for those that wait for a person, ask the runtime to tell someone — once:
    `machine.resume` never asks again. A client-side tool's caller follows its turn: no one else is told."""
    waiting = [
        WaitingCall(
            call_id=call.call_id,
            tool=call.tool,
            arguments=redact(call.arguments),
            waiting_for=call.wait.waiting_for,
            wait_deadline=call.wait.deadline_at,
            on_timeout=call.wait.on_timeout,
        )
        for call in calls
        if call.wait is not None
    ]
    for shown in waiting:
        draft.arm(wait_timer_id(shown.call_id), shown.wait_deadline)
    people = [shown for shown in waiting if shown.waiting_for == "approval"]
    # A child turn's wait is shown (`call_waiting`) like the others; the child itself says what it does.
    call_ids = [shown.call_id for shown in people]
    if call_ids:
        draft.commands.append(AwaitApproval(call_ids=call_ids))
        draft.emit("approval_requested", call_ids=call_ids)
    for shown in waiting:
        draft.emit("call_waiting", **shown.model_dump(mode="json"))
    if people:
        draft.commands.append(AskAttention(calls=people, tenant=draft.state.tenant))


def _unique_ids(state: TurnState, calls: Sequence[ToolCall]) -> list[ToolCall]:
    # Outcomes are keyed by call id: a provider that repeats an id within a turn would get one outcome for
    # two calls. The history is ours, so a repeated id is replaced by one derived from the turn.
    seen = {c.id for m in state.history if isinstance(m, AssistantMessage) for c in m.tool_calls}
    unique: list[ToolCall] = []
    for index, call in enumerate(calls):
        kept = call
        if call.id in seen:
            kept = call.model_copy(update={"id": f"{state.turn_id}-r{state.rounds + 1}-c{index}"})
        seen.add(kept.id)
        unique.append(kept)
    return unique


def _signature(call: ToolCall) -> str:
    arguments = call.raw_arguments if call.arguments_error else json.dumps(call.arguments, sort_keys=True)
    return f"{call.name}\0{arguments}"


def _next_streaks(state: TurnState, calls: Sequence[ToolCall]) -> dict[str, int]:
    return {sig: state.repeat_streaks.get(sig, 0) + 1 for sig in {_signature(c) for c in calls}}


def _reject_invalid(
    draft: Draft, tool_calls: Sequence[ToolCall], at: float, policy: Policy | None
) -> list[int]:
    """Ask for the outcome of every call refused before dispatch; the indices of the others."""
    state = draft.state
    catalogue = _catalogue(state)
    valid: list[int] = []
    for index, tool_call in enumerate(tool_calls):
        rejection = validate_call(
            tool_call.name, tool_call.arguments, tool_call.arguments_error, catalogue, state.offered
        )
        if rejection is None and policy is not None:
            reason = policy(tool_call, draft.state)
            if reason is not None:
                rejection_kind, message = FailureKind.POLICY_DENIED, f"denied by policy: {reason}"
            else:
                valid.append(index)
                continue
        elif rejection is None:
            valid.append(index)
            continue
        else:
            rejection_kind, message = rejection.kind, rejection.message
        draft.request_failure(
            round_of(draft.state).calls[index], rejection_kind, message, at, synthetic=False
        )
    return valid


def _catalogue(state: TurnState) -> dict[str, ToolSpec]:
    # The names of every catalogued tool, with the specs of those offered: enough to tell unknown from not
    # offered, without storing every spec.
    return {name: state.offered.get(name) or ToolSpec(name=name) for name in state.catalogue_names}


def _round_stop(
    draft: Draft, before: TurnState, valid: Sequence[ToolCall], streaks: dict[str, int], at: float
) -> tuple[StopReason, str | None] | None:
    """A stop that refuses every valid call of the round, checked before any dispatch."""
    limits = before.limits
    if at >= before.deadline_at:
        return "deadline", None
    denied = [o for o in draft.writes if o.failure_kind is FailureKind.POLICY_DENIED]
    if denied and limits.stop_on_policy_denied:
        return "policy_denied", f"'{denied[0].tool}': {denied[0].error}"
    if valid and limits.max_tool_rounds is not None and before.rounds >= limits.max_tool_rounds:
        return "max_tool_rounds", None
    guard = limits.repeat_guard_rounds
    if guard is not None:
        repeated = [c for c in valid if streaks.get(_signature(c), 0) >= guard]
        if repeated:
            return "repeat_guard", f"'{repeated[0].name}'"
    return None


def dispatch_call(draft: Draft, call: CallState, attempt: int, at: float) -> None:
    """Send attempt `attempt` of a call to the workers (batched into the step's DispatchTools)."""
    state = draft.state
    task_id = build_task_id(state, call, attempt)
    draft.end_wait(call)
    updated = call.replace(
        attempt=attempt,
        task_id=task_id,
        dispatched_at=at,
        started_at=None,
        worker=None,
        waiting_approval=False,
        wait=None,
        waiting_for_worker_since=None,
    )
    draft.replace_call(updated)
    if attempt == 1:
        draft.update(tool_executions=state.tool_executions + 1)
    # A call that waited for a person runs: the turn's clock runs again (its deadline moved out by the
    # pause) before that deadline goes with the task.
    keep_clock(draft, at)
    draft.dispatches.append(build_dispatch(draft.state, updated))
    draft.emit(
        "tool_dispatched",
        call_id=call.call_id,
        tool=call.tool,
        attempt=attempt,
        task_id=task_id,
        arguments=redact(call.arguments),
    )


def on_tool_started(draft: Draft, event: ToolStarted) -> None:
    """A worker started a call: arm the lost-work timer at its hard limit plus grace."""
    call = find_call(draft.state, event.call_id)
    if call is None or not call.in_flight or call.requested is not None or event.attempt < call.attempt:
        return
    if event.attempt == call.attempt and call.started_at is not None:
        return  # a duplicate notification
    _disarm_lost_timers(draft, call.call_id)
    draft.replace_call(
        call.replace(
            attempt=event.attempt, started_at=event.at, worker=event.worker, waiting_for_worker_since=None
        )
    )
    spec = draft.state.offered.get(call.tool)
    limit_s = spec.time_limit_s if spec is not None else _DEFAULT_TIME_LIMIT_S
    draft.arm(lost_timer_id(call.call_id, event.attempt), event.at + limit_s + draft.state.lost_grace_s)
    draft.emit(
        "tool_started", call_id=call.call_id, tool=call.tool, attempt=event.attempt, worker=event.worker
    )


def on_tool_waiting_for_worker(draft: Draft, event: ToolWaitingForWorker) -> None:
    """The runtime sent a call whose tool no live worker serves right now: mark it waiting for one.

    Ignored once the call started (a worker came up before this was stepped), was answered, or moved to
    another attempt; a second report of the same wait (a new owner sends the call again) keeps the first."""
    call = find_call(draft.state, event.call_id)
    if call is None or not call.in_flight or call.requested is not None or call.attempt != event.attempt:
        return
    if call.started_at is not None or call.waiting_for_worker_since is not None:
        return
    draft.replace_call(call.replace(waiting_for_worker_since=event.at))
    draft.emit(
        "tool_waiting_for_worker",
        call_id=call.call_id,
        tool=call.tool,
        attempt=event.attempt,
        last_served_at=event.last_served_at,
    )


def _disarm_lost_timers(draft: Draft, call_id: str) -> None:
    prefix = f"{LOST_TIMER_PREFIX}{call_id}:"
    for timer_id in [t for t in draft.state.timers if t.startswith(prefix)]:
        draft.disarm(timer_id)


def on_lost_timer(draft: Draft, call_id: str, attempt: int, at: float) -> None:
    """No outcome by hard limit + grace: the call is lost, unless its worker may still deliver.

    With `lost_wait_s` set, the first firing asks when the call's worker last reported in (`CheckWorker`)
    and waits for the answer with the timer re-armed at the end of the wait, so that a new owner still
    ends it; `on_worker_checked` decides. A firing at the end of the wait finds the call lost."""
    call = find_call(draft.state, call_id)
    if call is None or not call.in_flight or call.requested is not None or call.attempt != attempt:
        return
    wait_until = _lost_wait_until(draft.state, call)
    if wait_until is not None and at < wait_until:
        draft.arm(lost_timer_id(call_id, attempt), wait_until)
        if call.worker:
            draft.commands.append(CheckWorker(call_id=call_id, attempt=attempt, worker=call.worker))
        return
    _answer_lost(draft, call, at, waited=wait_until is not None)


def on_worker_checked(draft: Draft, event: WorkerChecked) -> None:
    """The heartbeat of a call's worker, read when its lost-call timer first fired.

    A worker heard from after the call's hard limit has written, or spooled and drained, whatever that
    execution ended with (its spool drains before each heartbeat, `workers.spool`): nothing came, so the
    call is lost now. A worker not heard from since (partitioned from Redis, frozen, or dead: from here the
    three look alike) keeps the call waiting until the end of `lost_wait_s`, or until its outcome arrives."""
    call = find_call(draft.state, event.call_id)
    if call is None or not call.in_flight or call.requested is not None or call.attempt != event.attempt:
        return
    timer_id = lost_timer_id(call.call_id, event.attempt)
    if call.started_at is None or timer_id not in draft.state.timers:
        return
    if event.seen_at is not None and event.seen_at >= call.started_at + _time_limit_s(draft.state, call):
        draft.disarm(timer_id)
        _answer_lost(draft, call, event.at, waited=False)
        return
    draft.emit(
        "tool_worker_unreachable",
        call_id=call.call_id,
        tool=call.tool,
        attempt=event.attempt,
        worker=event.worker,
        last_seen_at=event.seen_at,
        wait_until=draft.state.timers[timer_id],
    )


def _time_limit_s(state: TurnState, call: CallState) -> float:
    spec = state.offered.get(call.tool)
    return spec.time_limit_s if spec is not None else _DEFAULT_TIME_LIMIT_S


def _lost_wait_until(state: TurnState, call: CallState) -> float | None:
    """When the wait for a call's unheard-from worker ends (epoch seconds); None without a wait."""
    if state.lost_wait_s <= 0 or call.started_at is None:
        return None
    return call.started_at + _time_limit_s(state, call) + state.lost_grace_s + state.lost_wait_s


def _answer_lost(draft: Draft, call: CallState, at: float, *, waited: bool) -> None:
    """The worker was lost: retry if attempts remain, else `worker_lost`."""
    state = draft.state
    spec = state.offered.get(call.tool)
    max_attempts = 1 + (spec.retries if spec is not None else 0)
    attempt = call.attempt
    if attempt < max_attempts and at < state.deadline_at and state.stop is None:
        # The old attempt is not revoked: the fence makes its deliveries harmless (one that starts after the
        # new attempt runs nothing, one that started first answers and the new one finds the outcome), and a
        # revoke would terminate a live delivery of it (a copy the broker redelivered) and answer `cancelled`.
        dispatch_call(draft, call, attempt + 1, at)
        draft.emit(
            "tool_redispatched",
            call_id=call.call_id,
            tool=call.tool,
            attempt=attempt + 1,
            reason="worker_lost",
        )
        return
    after_s = _time_limit_s(state, call) + state.lost_grace_s + (state.lost_wait_s if waited else 0.0)
    message = (
        f"the worker running '{call.tool}' was lost: no outcome {after_s:g} s after it started"
        + (", and its worker was not heard from since its hard limit" if waited else "")
        + f" (attempt {attempt} of {max_attempts})"
    )
    draft.request_failure(call, FailureKind.WORKER_LOST, message, at, synthetic=True)
    draft.emit("tool_synthesis_requested", call_id=call.call_id, tool=call.tool, failure_kind="worker_lost")


def on_answer(draft: Draft, event: ApprovalGiven | ClientResultGiven | ChildTurnFinished) -> None:
    """Someone answered a waiting call: a person (`on_approval`), the caller of a client-side tool
    (`on_client_result`), or a sub-agent's child turn (`machine.agents.on_child_turn_finished`)."""
    match event:
        case ApprovalGiven():
            on_approval(draft, event)
        case ClientResultGiven():
            on_client_result(draft, event)
        case ChildTurnFinished():
            on_child_turn_finished(draft, event)


def on_approval(draft: Draft, event: ApprovalGiven) -> None:
    """A person approved (dispatch now), maybe with edited arguments, or denied (`confirmation_denied`, with
    what they said for the model to read) a waiting call; who and why go into the turn's `approvals`."""
    call = find_call(draft.state, event.call_id)
    if call is None or not call.waiting or _waits_for_client(call) or _waits_for_child(call):
        return
    edited = event.approved and event.arguments is not None
    decision = ApprovalDecision(
        call_id=call.call_id,
        tool=call.tool,
        approved=event.approved,
        decided_by=event.decided_by,
        reason=event.reason,
        edited=edited,
        at=event.at,
        waited_s=_waited_s(call, event.at),
    )
    draft.update(approvals=[*draft.state.approvals, decision])
    draft.emit(
        "approval_given",
        call_id=call.call_id,
        tool=call.tool,
        approved=event.approved,
        edited=edited,
        decided_by=event.decided_by,
        reason=event.reason,
        waited_s=decision.waited_s,
    )
    if not event.approved:
        message = "the call was denied by a person" + (f": {event.reason}" if event.reason else "")
        draft.request_failure(call, FailureKind.CONFIRMATION_DENIED, message, event.at, synthetic=False)
        return
    if event.arguments is not None:
        edited_call = _edit_arguments(draft, call, event.arguments, event.at)
        if edited_call is None:
            return
        call = edited_call
    dispatch_call(draft, call, 1, event.at)


def on_wait_timeout(draft: Draft, call_id: str, at: float) -> None:
    """No one answered a waiting call within its wait's limit: its `on_timeout` does. "deny" answers it
    `confirmation_denied`, synthetic (toolloop said no, not a person: no stop policy counts it) with a
    message the model reads; "approve" runs it as if a person had approved it."""
    call = find_call(draft.state, call_id)
    if call is None or not call.waiting or call.wait is None:
        return
    wait = call.wait
    if wait.waiting_for == "child_turn":
        on_child_timeout(draft, call, at)
        return
    if wait.waiting_for == "client_result":
        draft.emit("client_result_timed_out", call_id=call.call_id, tool=call.tool, timeout_s=wait.timeout_s)
        message = f"the caller sent no result for '{call.tool}' within {wait.timeout_s:g} s"
        draft.request_failure(call, FailureKind.TIMEOUT, message, at, synthetic=True)
        return
    approved = wait.on_timeout == "approve"
    decision = ApprovalDecision(
        call_id=call.call_id,
        tool=call.tool,
        approved=approved,
        timed_out=True,
        at=at,
        waited_s=_waited_s(call, at),
    )
    draft.update(approvals=[*draft.state.approvals, decision])
    draft.emit(
        "approval_timed_out",
        call_id=call.call_id,
        tool=call.tool,
        approved=approved,
        timeout_s=round(wait.timeout_s, 3),
    )
    if approved:
        dispatch_call(draft, call, 1, at)
        return
    message = f"no one approved the call within {wait.timeout_s:g} s; it was not run"
    draft.request_failure(call, FailureKind.CONFIRMATION_DENIED, message, at, synthetic=True)


def _waits_for_client(call: CallState) -> bool:
    return call.wait is not None and call.wait.waiting_for == "client_result"


def _waits_for_child(call: CallState) -> bool:
    return call.wait is not None and call.wait.waiting_for == "child_turn"


def on_client_result(draft: Draft, event: ClientResultGiven) -> None:
    """The caller answered a call of a client-side tool: its result becomes the call's outcome (shown to the
    model as a worker's would be), its error a failed one (`execution_error`, the message for the model). A
    result over the tool's `max_result_bytes`, or one JSON cannot carry, is answered `invalid_result`."""
    call = find_call(draft.state, event.call_id)
    if call is None or not call.waiting or not _waits_for_client(call):
        return
    waited_s = _waited_s(call, event.at)
    draft.emit(
        "client_result_given", call_id=call.call_id, tool=call.tool, ok=event.error is None, waited_s=waited_s
    )
    if event.error is not None:
        draft.request_failure(call, FailureKind.EXECUTION_ERROR, event.error, event.at, synthetic=False)
        return
    content = derive_content(event.result)
    spec = draft.state.offered.get(call.tool)
    limit = spec.max_result_bytes if spec is not None else ToolSpec(name=call.tool).max_result_bytes
    if content is None or len(content.encode()) > limit:
        problem = "is not JSON" if content is None else f"is over {limit} bytes"
        message = f"the result the caller sent for '{call.tool}' {problem}"
        draft.request_failure(call, FailureKind.INVALID_RESULT, message, event.at, synthetic=False)
        return
    outcome = ToolOutcome(
        call_id=call.call_id,
        tool=call.tool,
        turn_id=draft.state.turn_id,
        ok=True,
        result=event.result,
        content=content,
        attempts=0,
        duration_ms=round(waited_s * 1000.0, 3),
        finished_at=event.at,
    )
    draft.request_outcome(call, outcome)


def _waited_s(call: CallState, at: float) -> float:
    # How long a call waited for its answer (0 for a state written before waits were recorded).
    return max(round(at - call.wait.since, 3), 0.0) if call.wait is not None else 0.0


def _edit_arguments(draft: Draft, call: CallState, arguments: dict[str, Any], at: float) -> CallState | None:
    """The call with the arguments a person edited, validated as the model's were; None when they are refused
    (the call is then answered with the validation failure, never run).

    The round's assistant message shows the edited arguments: the history holds what ran, so that the model
    reasons from the call as it was made (the `approval_given` event says it was edited)."""
    state = draft.state
    rejection = validate_call(call.tool, arguments, None, _catalogue(state), state.offered)
    if rejection is not None:
        message = f"the arguments a person gave when approving were refused: {rejection.message}"
        draft.request_failure(call, rejection.kind, message, at, synthetic=False)
        return None
    edited = call.replace(arguments=dict(arguments))
    draft.replace_call(edited)
    current = round_of(draft.state)
    tool_calls = [
        c.model_copy(update={"arguments": dict(arguments), "raw_arguments": None, "arguments_error": None})
        if c.id == call.call_id
        else c
        for c in current.assistant.tool_calls
    ]
    assistant = current.assistant.model_copy(update={"tool_calls": tool_calls})
    draft.update(current=current.replace(assistant=assistant))
    return edited


def on_tool_finished(draft: Draft, event: ToolFinished) -> None:
    """The winning outcome of a call: record it, apply the stop policies. Others are late or duplicates."""
    outcome = event.outcome
    call = find_call(draft.state, outcome.call_id)
    if call is None or call.finished:
        record_late(draft, outcome, event.at)
        return
    draft.end_wait(call)
    draft.replace_call(call.replace(outcome=outcome, waiting_approval=False, wait=None))
    _disarm_lost_timers(draft, call.call_id)
    draft.emit(
        "tool_synthesized" if outcome.synthetic else "tool_finished",
        call_id=call.call_id,
        tool=call.tool,
        ok=outcome.ok,
        failure_kind=outcome.failure_kind.value if outcome.failure_kind else None,
        attempts=outcome.attempts,
        duration_ms=outcome.duration_ms,
        worker=outcome.worker,
        error=build_error_line(outcome),
    )
    if not outcome.ok:
        _apply_failure_policies(draft, call, outcome, event.at)


# The first line of a failed call's error, for a watcher to see why (the whole of it is the call's answer in
# the history): an event stays small.
ERROR_LINE_MAX = 200


def build_error_line(outcome: ToolOutcome) -> str | None:
    """What a failed call's `tool_finished` event says of its error: its first line, cut to `ERROR_LINE_MAX`
    characters; None for a call that succeeded, or failed saying nothing."""
    lines = [] if outcome.ok else (outcome.error or outcome.content or "").strip().splitlines()
    if not lines:
        return None
    return lines[0] if len(lines[0]) <= ERROR_LINE_MAX else lines[0][: ERROR_LINE_MAX - 1] + "…"


def _failure_signature(tool: str, outcome: ToolOutcome) -> str:
    return f"{tool}\0{(outcome.error or outcome.content).strip().lower()}"


def _apply_failure_policies(draft: Draft, call: CallState, outcome: ToolOutcome, at: float) -> None:
    kind = outcome.failure_kind
    if kind in _NOT_TOOL_FAILURES:
        return
    if kind is FailureKind.CONFIRMATION_DENIED and outcome.synthetic:
        return  # a wait that timed out: no person denied the call, and the model was told
    tool = call.tool
    signature = _failure_signature(tool, outcome)
    seen = signature in draft.state.failure_signatures
    if seen and outcome.synthetic and _answered_alike_this_round(draft.state, call, signature):
        # toolloop's own answer (a lost worker) to calls of one round that one event took down together:
        # the model has not tried again yet, so the failure has not repeated.
        seen = False
    if not seen:
        draft.update(failure_signatures=[*draft.state.failure_signatures, signature])
    limits = draft.state.limits
    reason: StopReason | None = None
    if kind is FailureKind.CONFIRMATION_DENIED:
        reason = "confirmation_denied" if limits.stop_on_confirmation_denied else None
    elif kind is FailureKind.POLICY_DENIED:
        reason = "policy_denied" if limits.stop_on_policy_denied else None
    if reason is None and seen and limits.stop_on_repeated_failure:
        reason = "repeated_failure"
    if reason is None and limits.stop_on_tool_failure:
        reason = "tool_failure"
    if reason is not None:
        begin_stop(draft, reason, at, detail=f"'{tool}': {outcome.error or outcome.content}")


def _answered_alike_this_round(state: TurnState, call: CallState, signature: str) -> bool:
    # Another call of the current round has an outcome toolloop made up with the same signature.
    siblings = state.current.calls if state.current is not None else []
    return any(
        other.call_id != call.call_id
        and other.outcome is not None
        and other.outcome.synthetic
        and not other.outcome.ok
        and _failure_signature(other.tool, other.outcome) == signature
        for other in siblings
    )


def record_late(draft: Draft, outcome: ToolOutcome, at: float) -> None:
    """Keep an outcome that lost the race (or came after the turn moved on) for audit: first writer wins."""
    if _same_as_answer(draft.state, outcome) or any(
        late.outcome == outcome for late in draft.state.late_outcomes
    ):
        return  # a duplicate delivery of what is already recorded
    draft.update(late_outcomes=[*draft.state.late_outcomes, LateOutcome(outcome=outcome, at=at)])
    draft.emit(
        "late_outcome", call_id=outcome.call_id, tool=outcome.tool, ok=outcome.ok, synthetic=outcome.synthetic
    )


def _same_as_answer(state: TurnState, outcome: ToolOutcome) -> bool:
    call = find_call(state, outcome.call_id)
    if call is not None and call.outcome is not None:
        return call.outcome == outcome
    for message in reversed(state.history):
        if isinstance(message, ToolMessage) and message.tool_call_id == outcome.call_id:
            return message.content == outcome.content and message.synthetic == outcome.synthetic
    return False


def complete_round(draft: Draft) -> None:
    """Append the round's assistant message, then one tool message per call in call order."""
    current = round_of(draft.state)
    messages: list[AssistantMessage | ToolMessage] = [current.assistant]
    for call in current.calls:
        assert call.outcome is not None
        messages.append(
            ToolMessage(
                tool_call_id=call.call_id,
                name=call.tool,
                content=call.outcome.content,
                is_error=not call.outcome.ok,
                failure_kind=call.outcome.failure_kind,
                synthetic=call.outcome.synthetic,
            )
        )
    draft.update(history=[*draft.state.history, *messages], current=None, status=TurnStatus.RUNNING)
