"""Agents in a turn: sub-agents as child turns, and handoffs (docs/design/agents.md).

A call of a sub-agent (`TurnState.sub_agents`: an agent named among another's tools) is never dispatched.
It starts a child turn — `StartChildTurn`, its id derived from the parent's turn and call
(`build_child_turn_id`), so that asking again after a takeover starts nothing new — and waits for it
(`CallWait` "child_turn") until the child ends (`ChildTurnFinished`: its answer is the call's result, its
usage is added into the parent's) or the parent's own deadline passes (the call's outcome is `timeout`, and
the child is cancelled). The child runs on the parent's time: its wait does not pause the parent's clock,
and its deadline and budgets are at most what the parent has left. A call one level deeper than
`max_agent_depth` starts nothing: its answer (`not_allowed`) says the depth limit was reached. Stopping the
parent cancels the children still running.

A call of a handoff tool (`transfer_to_<agent>`, `TurnState.handoffs`) continues the same turn as that agent:
from the next model call on, its instructions, models, settings, output schema and tools; the call itself is
answered at once (the history keeps it), and `agent_handoff` says who handed off to whom.
"""

from __future__ import annotations

from orchestrator.machine.budgets import used_tokens
from orchestrator.machine.draft import Draft
from orchestrator.machine.events import CancelChildTurns, ChildTurnFinished, StartChildTurn
from orchestrator.machine.state import CallState, CallWait, TurnState, build_child_turn_id
from orchestrator.model import ChildTurn
from workers.contract import FailureKind, ToolOutcome, derive_content

# The answer to a sub-agent call refused for depth (`not_allowed`): the model reads the message.
DEPTH_LIMIT_MESSAGE = (
    "the agent depth limit was reached (max_agent_depth {limit}): '{agent}' cannot be started from a turn "
    "already {depth} level(s) deep; answer without it"
)


def depth_of(state: TurnState) -> int:
    """How deep the turn is: 0 for a turn with no parent."""
    return state.parent.depth if state.parent is not None else 0


def start_child(draft: Draft, call: CallState, at: float) -> CallState | None:
    """A call of a sub-agent: start its child turn and wait for it (the call, now waiting); None when the
    depth limit answers the call instead."""
    state = draft.state
    depth = depth_of(state) + 1
    if depth > state.max_agent_depth:
        message = DEPTH_LIMIT_MESSAGE.format(limit=state.max_agent_depth, agent=call.tool, depth=depth - 1)
        draft.emit(
            "agent_depth_reached",
            call_id=call.call_id,
            agent=call.tool,
            max_agent_depth=state.max_agent_depth,
        )
        draft.request_failure(call, FailureKind.NOT_ALLOWED, message, at, synthetic=True)
        return None
    child_id = build_child_turn_id(state.turn_id, call.call_id)
    limits = state.limits
    tokens_left = None
    if limits.max_total_tokens is not None:
        tokens_left = max(limits.max_total_tokens - used_tokens(state.usage), 1)
    cost_left = None
    if limits.max_cost_usd is not None:
        cost_left = max(limits.max_cost_usd - (state.usage.cost_usd or 0.0), 1e-9)
    waiting = call.replace(
        waiting_approval=True,
        wait=CallWait(waiting_for="child_turn", since=at, deadline_at=state.deadline_at),
    )
    draft.replace_call(waiting)
    draft.commands.append(
        StartChildTurn(
            call_id=call.call_id,
            agent=call.tool,
            turn_id=child_id,
            arguments=call.arguments,
            depth=depth,
            deadline_at=state.deadline_at,
            max_total_tokens=tokens_left,
            max_cost_usd=cost_left,
            tenant=state.tenant,
            priority=state.priority,
        )
    )
    draft.update(
        children=[*state.children, ChildTurn(call_id=call.call_id, agent=call.tool, turn_id=child_id)]
    )
    draft.emit(
        "child_turn_started", call_id=call.call_id, agent=call.tool, child_turn_id=child_id, depth=depth
    )
    return waiting


def hand_off(draft: Draft, call: CallState, at: float) -> None:
    """A call of a handoff tool: the turn goes on as its agent from the next model call; the call is answered
    at once."""
    state = draft.state
    target = state.handoffs[call.tool]
    run = state.agents.get(target)
    if run is None:
        draft.request_failure(
            call, FailureKind.NOT_FOUND, f"no agent '{target}' to hand off to", at, synthetic=True
        )
        return
    client = {name: spec for name, spec in state.offered.items() if name in state.client_tools}
    draft.update(
        agent=target,
        instructions=run.instructions,
        models=run.models or state.models,
        model=(run.models or state.models)[0],
        model_index=0,
        model_settings=run.model_settings,
        output_schema=run.output_schema,
        offered={**run.offered, **client},
        sub_agents=run.sub_agents,
        handoffs=run.handoffs,
    )
    draft.emit("agent_handoff", call_id=call.call_id, from_agent=state.agent, to_agent=target)
    result = {"agent": target}
    draft.request_outcome(
        call,
        ToolOutcome(
            call_id=call.call_id,
            tool=call.tool,
            turn_id=state.turn_id,
            ok=True,
            result=result,
            content=f"Transferred to {target}: the {target} agent answers from here on.",
            attempts=0,
            duration_ms=0.0,
            finished_at=at,
        ),
    )


def on_child_turn_finished(draft: Draft, event: ChildTurnFinished) -> None:
    """A child turn ended: its answer becomes the call's outcome (its error a failed one), its usage is added
    into the parent's, and its record says how it ended."""
    state = draft.state
    if event.turn_id != build_child_turn_id(state.turn_id, event.call_id):
        # Only the call's own child reports for it: a turn that merely names this one its parent does not.
        return
    call = _waiting_call(state, event.call_id)
    running = [child.call_id == event.call_id and child.status is None for child in state.children]
    if any(running):
        ended = {"status": event.status, "usage": event.usage}
        children = [
            c.model_copy(update=ended) if r else c for c, r in zip(state.children, running, strict=True)
        ]
        draft.update(children=children, usage=state.usage + event.usage)
    if call is None:
        return
    draft.emit(
        "child_turn_finished",
        call_id=call.call_id,
        agent=call.tool,
        child_turn_id=event.turn_id,
        status=event.status,
        ok=event.error is None,
    )
    if event.error is not None:
        draft.request_failure(call, FailureKind.EXECUTION_ERROR, event.error, event.at, synthetic=False)
        return
    content = derive_content(event.result) or ""
    waited_ms = round(max(event.at - (call.wait.since if call.wait else event.at), 0.0) * 1000.0, 3)
    draft.request_outcome(
        call,
        ToolOutcome(
            call_id=call.call_id,
            tool=call.tool,
            turn_id=state.turn_id,
            ok=True,
            result=event.result,
            content=content,
            attempts=0,
            duration_ms=waited_ms,
            finished_at=event.at,
        ),
    )


def on_child_timeout(draft: Draft, call: CallState, at: float) -> None:
    """The parent's time ran out while a child ran: the call's outcome is `timeout`, and the child stops."""
    child_id = build_child_turn_id(draft.state.turn_id, call.call_id)
    draft.commands.append(CancelChildTurns(turn_ids=[child_id], reason="its parent's time ran out"))
    message = f"the sub-agent '{call.tool}' did not answer before the turn's deadline"
    draft.request_failure(call, FailureKind.TIMEOUT, message, at, synthetic=True)


def _waiting_call(state: TurnState, call_id: str) -> CallState | None:
    current = state.current
    if current is None:
        return None
    for call in current.calls:
        if call.call_id == call_id and call.waiting and call.wait is not None:
            return call if call.wait.waiting_for == "child_turn" else None
    return None
