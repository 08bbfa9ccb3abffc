"""The loop of one turn as a pure, resumable state machine: `(state, event) -> (state, commands)`.

`start` creates a turn's state and its first commands; `step` applies one event; `resume` gives a new owner
of a persisted state the commands it must (re)issue. None does I/O, reads a clock or draws a random number:
time comes in as arguments and on events, ids derive from the turn id and counters. The runtime performs the
commands (`machine.events`), persists `dump_state` after every step, and feeds back what happened. Any
event may arrive twice or late; it then changes nothing but the audit record.

This module routes each event to its handler and moves the turn on; the rules live below it, in
`model_calls` (model calls, errors, empty answers, tool choice), `tool_round` (a round of tool calls:
validation, limits, dispatch, approvals, lost work, outcomes) and `stopping` (the one stop path and the
terminal shapes). After each event `_settle` moves the turn on: a round whose calls are all answered enters
the history, then the turn finishes or calls the model again.

Design notes: docs/design/turns.md, "The state machine".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import assert_never

from orchestrator.context.budget import ContextBudget
from orchestrator.machine.budgets import unknown_cost_message
from orchestrator.machine.draft import Draft, build_dispatch
from orchestrator.machine.events import (
    ApprovalGiven,
    ArmTimer,
    AwaitApproval,
    CancelRequested,
    ChildTurnFinished,
    ClientResultGiven,
    Command,
    DispatchTools,
    Emit,
    Event,
    Finish,
    ModelFailed,
    ModelResponded,
    ModelThrottled,
    QuotaExceeded,
    Revoke,
    TimerFired,
    ToolFinished,
    ToolStarted,
    ToolWaitingForWorker,
    WorkerChecked,
    WriteOutcomes,
)
from orchestrator.machine.model_calls import (
    build_call_model,
    call_model_or_stop,
    on_model_responded,
    on_model_throttled,
    on_quota_exceeded,
)
from orchestrator.machine.model_errors import on_model_failed
from orchestrator.machine.state import (
    DEADLINE_TIMER,
    MODEL_RETRY_TIMER_PREFIX,
    WAIT_TIMER_PREFIX,
    AgentRun,
    CallState,
    TurnState,
    parse_lost_timer_id,
)
from orchestrator.machine.stopping import HARD_STOPS, begin_stop, finish_turn
from orchestrator.machine.tool_round import (
    Policy,
    complete_round,
    on_answer,
    on_lost_timer,
    on_tool_finished,
    on_tool_started,
    on_tool_waiting_for_worker,
    on_wait_timeout,
    on_worker_checked,
    record_late,
)
from orchestrator.machine.validation import check_output_schema, offered_tools
from orchestrator.machine.waits import keep_clock, parkable
from orchestrator.model import Message, ProviderError, TurnRequest, TurnStatus, UserMessage
from workers.contract import ToolSpec

__all__ = ["Policy", "parkable", "resume", "start", "step"]


def start(
    turn_id: str,
    request: TurnRequest,
    *,
    model: str | Sequence[str],
    catalogue: Mapping[str, ToolSpec],
    at: float,
    lost_grace_s: float = 5.0,
    lost_wait_s: float = 0.0,
    prior_history: Sequence[Message] = (),
    context_budget: ContextBudget | None = None,
    unpriced: Collection[str] = (),
    refused: Sequence[str] = (),
    agents: Mapping[str, AgentRun] | None = None,
    max_agent_depth: int = 3,
) -> tuple[TurnState, list[Command]]:
    """A new turn: its state and first commands (arm the deadline, call the model).

    `model` is the resolved `provider:model` (`providers.base.resolve_model`), or several: the fallback order;
    `catalogue` the live tool catalogue, snapshotted into the state; `prior_history` the stored history of the
    conversation the turn continues; `unpriced` the turn's models the price table has no price for;
    `refused` what the turn's models' providers cannot honour of its request (`find_refusals`, asked by the
    runtime once it has resolved a model the submitting process could not). A turn that runs as an agent
    (`request.agent`) gets `agents`, resolved by the runtime (`orchestrator.agents`): its own run (the tools
    it offers, sub-agents and handoffs included) and every agent a handoff may reach.

    A turn that cannot do what it asks fails at once, before any model call: an output schema that is not a
    valid JSON Schema (`invalid_output`), a budget in dollars with a model of unknown price (`max_cost`), a
    setting a model's provider cannot honour (`provider_error`: never dropped, never sent to be refused).
    """
    models = [model] if isinstance(model, str) else list(model)
    history: list[Message] = [*prior_history, *request.messages]
    if request.prompt is not None:
        history.append(UserMessage(content=request.prompt))
    # A client-side tool is offered beside the catalogue's (the submit refused a name clash; one a catalogue
    # published since is the caller's here: the turn asked for its own).
    client = {
        tool.name: ToolSpec(name=tool.name, description=tool.description, parameters=tool.parameters)
        for tool in request.client_tools
    }
    run = (agents or {}).get(request.agent) if request.agent else None
    own = run.offered if run is not None else offered_tools(catalogue, request.tools)
    offered = {**own, **client}
    state = TurnState(
        turn_id=turn_id,
        model=models[0],
        # Kept only with a fallback: a state without one stays readable by an orchestrator that predates it.
        models=models if len(models) > 1 else [],
        instructions=request.instructions,
        model_settings=request.model_settings,
        output_schema=request.output_schema,
        limits=request.limits,
        context=dict(request.context),
        tenant=request.tenant,
        priority=request.priority,
        tools_allowed=None if request.tools is None else list(request.tools),
        tool_choice=request.tool_choice,
        stream=request.stream,
        offered=offered,
        # Sub-agents and handoffs are tools the model may call too: known, not unknown (every agent's, so
        # that a handoff finds its tools known).
        catalogue_names=sorted(
            {*catalogue, *client, *(t for r in (agents or {}).values() for t in r.offered)}
        ),
        client_tools=sorted(client),
        agent=run.name if run is not None else None,
        agents=dict(agents or {}) if run is not None else {},
        sub_agents=run.sub_agents if run is not None else [],
        handoffs=run.handoffs if run is not None else {},
        parent=request.parent,
        max_agent_depth=request.limits.max_agent_depth
        if request.limits.max_agent_depth is not None
        else max_agent_depth,
        history=history,
        status=TurnStatus.RUNNING,
        started_at=at,
        deadline_at=at + request.limits.deadline_s,
        lost_grace_s=lost_grace_s,
        lost_wait_s=lost_wait_s,
        timers={DEADLINE_TIMER: at + request.limits.deadline_s},
        context_budget=context_budget or ContextBudget(),
    )
    draft = Draft(state)
    draft.emit(
        "turn_started",
        model=models[0],
        models=models,
        tools=sorted(offered),
        deadline_at=state.deadline_at,
        tenant=request.tenant,
        **({"agent": run.name} if run is not None else {}),
        **({"parent": request.parent.model_dump()} if request.parent is not None else {}),
    )
    draft.commands.append(ArmTimer(timer_id=DEADLINE_TIMER, at=state.deadline_at))
    _refuse(draft, sorted({m for m in models if m in unpriced}), refused, at)
    _settle(draft, at)
    draft.flush()
    return draft.state, draft.commands


def step(state: TurnState, event: Event, *, policy: Policy | None = None) -> tuple[TurnState, list[Command]]:
    """Apply one event; the new state and the commands for the runtime, in order.

    `policy` is the stop-policy hook, consulted before each dispatch; pass the same one on every
    step of a turn (a callable cannot be persisted with the state).
    """
    draft = Draft(state)
    if state.terminal:
        if isinstance(event, ToolFinished):
            record_late(draft, event.outcome, event.at)
        return draft.state, draft.commands
    match event:
        case ModelResponded() | ModelFailed() | ModelThrottled() | QuotaExceeded():
            _on_model_event(draft, event, policy)
        case ToolStarted():
            on_tool_started(draft, event)
        case ToolWaitingForWorker():
            on_tool_waiting_for_worker(draft, event)
        case ToolFinished():
            on_tool_finished(draft, event)
        case TimerFired():
            _on_timer(draft, event)
        case WorkerChecked():
            on_worker_checked(draft, event)
        case ApprovalGiven() | ClientResultGiven() | ChildTurnFinished():
            on_answer(draft, event)
        case CancelRequested():
            begin_stop(draft, "cancelled", event.at, detail=event.reason)
        case _:
            assert_never(event)
    _settle(draft, event.at)
    draft.flush()
    return draft.state, draft.commands


def _on_model_event(
    draft: Draft,
    event: ModelResponded | ModelFailed | ModelThrottled | QuotaExceeded,
    policy: Policy | None,
) -> None:
    match event:
        case ModelResponded():
            on_model_responded(draft, event, policy)
        case ModelFailed():
            on_model_failed(draft, event)
        case ModelThrottled():
            on_model_throttled(draft, event)
        case QuotaExceeded():
            on_quota_exceeded(draft, event)
        case _:
            assert_never(event)


def resume(state: TurnState, at: float) -> tuple[TurnState, list[Command]]:
    """What a new owner of a persisted turn must (re)issue, in order; `at` is the time of the take-over.

    The previous owner may have died after persisting any step and before (or while) performing its
    commands. Whatever lived only in that process is rebuilt from the state:

    - `ArmTimer` for every saved timer (timers live in one process's heap; a past one fires at once);
    - `WriteOutcomes` for every outcome the machine asked for and has not seen come back: the write is
      first-writer-wins, so one that did land, or a real outcome that beat it, simply comes back as the
      winner — nothing is answered twice;
    - `CallModel` again for the model call in flight, with the same `llm_call_index` and the same request:
      it is the same call, not a new one nor a retry (`llm_calls` and `model_retries` do not move), and the
      first response for that index is accepted, any other ignored. None starts past the deadline (the
      deadline timer, re-armed here, stops the turn at once);
    - `AwaitApproval` for the calls still waiting for a person, and `Revoke` again for tasks a hard stop
      (deadline, cancel) revoked, in case that revocation died with the process;
    - `DispatchTools` again for every dispatched call whose start the state never recorded, as the very
      same task (task id, attempt), before the deadline and unless a stop already answers it. The old owner
      persisted the dispatch before publishing it and may have died in between; or the worker's `started`
      went to the dead owner's inbox, and no lost-call timer watches the call. Sent again, the task is a
      redelivery, which workers make harmless: skipped when the call has an outcome, waited out
      while another delivery runs it — so no tool runs twice, and no call waits for the deadline because its
      message was never sent. A call whose start was recorded has its lost-call timer re-armed instead.

    An outcome written while nobody owned the turn is read from Redis by the runtime right after this (the
    worker's notification went to nobody); otherwise it arrives as usual. A terminal state only needs its
    `Finish` performed (the owner died between persisting the end and storing the outcome). The state itself
    is returned unchanged: resuming is not a step and leaves no trace in it.
    """
    if state.outcome is not None:
        return state, [Finish(outcome=state.outcome)]
    commands: list[Command] = [ArmTimer(timer_id=t, at=when) for t, when in sorted(state.timers.items())]
    calls = state.current.calls if state.current is not None else []
    unanswered = [c for c in calls if not c.finished]
    hard_stop = state.stop is not None and state.stop.reason in HARD_STOPS
    revoke = [c.task_id for c in unanswered if hard_stop and c.in_flight and c.task_id is not None]
    if revoke:
        commands.append(Revoke(task_ids=revoke))
    resend = [c for c in unanswered if _unconfirmed(c)] if at < state.deadline_at else []
    if resend:
        commands.append(DispatchTools(calls=[build_dispatch(state, c) for c in resend]))
    rewrites = [c.requested for c in unanswered if c.requested is not None]
    if rewrites:
        commands.append(WriteOutcomes(outcomes=rewrites))
    waiting = [c.call_id for c in unanswered if c.waiting_approval and c.requested is None]
    if waiting:
        commands.append(AwaitApproval(call_ids=waiting))
    recall = state.awaiting_model if at < state.deadline_at else None
    if recall is not None:
        if state.stream:
            # The dead owner may have streamed part of this call's answer: pages drop it, the call restarts.
            commands.append(Emit(event_name="model_stream_reset", data={"llm_call": recall}))
        commands.append(build_call_model(state, recall))
    data = {
        "turn_id": state.turn_id,
        "timers": sorted(state.timers),
        "rewritten_call_ids": [o.call_id for o in rewrites],
        "redispatched_call_ids": [c.call_id for c in resend],
        "waiting_call_ids": waiting,
        "llm_call_index": recall,
    }
    # First, so that the turn's event stream tells why what follows happens again.
    commands.insert(0, Emit(event_name="turn_resumed", data=data))
    return state, commands


def _refuse(draft: Draft, unpriced: Sequence[str], refused: Sequence[str], at: float) -> None:
    state = draft.state
    problem = check_output_schema(state.output_schema) if state.output_schema is not None else None
    if problem is not None:
        begin_stop(draft, "invalid_output", at, message=problem)
    elif refused:
        message = "the request asks what its model cannot do: " + "; ".join(refused)
        error = ProviderError(
            provider=state.model.partition(":")[0], type="unsupported_setting", message=message
        )
        begin_stop(draft, "provider_error", at, status="failed", message=message, error=error)
    elif state.limits.max_cost_usd is not None and unpriced:
        message = unknown_cost_message(state.limits.max_cost_usd, unpriced)
        begin_stop(draft, "max_cost", at, status="failed", message=message)


def _unconfirmed(call: CallState) -> bool:
    """A dispatched call, not answered or answered-to-be, whose start no worker reported to the state."""
    return call.in_flight and call.requested is None and call.started_at is None and call.task_id is not None


def _on_timer(draft: Draft, event: TimerFired) -> None:
    timer_id = event.timer_id
    if timer_id not in draft.state.timers:
        return  # cancelled, replaced or already handled
    draft.forget_timer(timer_id)
    if timer_id == DEADLINE_TIMER:
        begin_stop(draft, "deadline", event.at)
        return
    lost = parse_lost_timer_id(timer_id)
    if lost is not None:
        on_lost_timer(draft, lost[0], lost[1], event.at)
    elif timer_id.startswith(WAIT_TIMER_PREFIX):
        on_wait_timeout(draft, timer_id.removeprefix(WAIT_TIMER_PREFIX), event.at)
    # A model retry timer needs nothing here: with it gone, _settle calls the model again.


def _settle(draft: Draft, at: float) -> None:
    """Move the turn on as far as it can go without a new event."""
    if draft.state.terminal:
        return
    keep_clock(draft, at)
    state = draft.state
    if state.current is not None:
        if not state.current.complete:
            waiting = any(call.waiting_approval for call in state.current.calls)
            draft.update(status=TurnStatus.WAITING if waiting else TurnStatus.RUNNING)
            return
        complete_round(draft)
    if draft.state.awaiting_model is not None or _retry_pending(draft.state):
        return
    if draft.state.stop is None:
        call_model_or_stop(draft, at)
    if draft.state.stop is not None and draft.state.current is None:
        finish_turn(draft, at)


def _retry_pending(state: TurnState) -> bool:
    return any(timer_id.startswith(MODEL_RETRY_TIMER_PREFIX) for timer_id in state.timers)
