"""The model half of the loop: each model call with its view, fitted to the context budget,
its tool choice, the turn's model controls and budgets; what an answer or a failure leads
to is decided in `answers` (final answers: blank, typed) and `model_errors` (retries, fallback).

Every call carries the turn's instructions, model settings and output schema, all from the state, so that
the call made again after a restart is the same request. A compaction call carries none of them: its summary
is prose for the turn's own later views, not an answer — the turn's system prompt would steer it (a persona, a
format), the schema would make it JSON, and `stop`, `max_output_tokens` or `parallel_tool_calls` (it offers
no tools, which OpenAI then refuses) could cut it or be refused; the rest of the settings (sampling,
reasoning, `extra` fields a server may need) apply. The budgets (`budgets`) are checked before every call.

The context budget: each view is fitted to the turn's budget (`view.fit_view`), and says what it trimmed in
its diagnostics and a `context_trimmed` event. A provider's over-long-context error shrinks the budget — to
the window the error states, else to a fraction of the request's estimate — and the call is made again at
once, one time; a second such error in a row fails the turn. With compaction on, a view that would drop
exchanges first has them summarised by a model call (`compacting` while it is in flight).
"""

from __future__ import annotations

from typing import Any, Unpack

from orchestrator.context.budget import BudgetChanges, ContextSummary
from orchestrator.context.compaction import build_compaction_messages
from orchestrator.machine.answers import on_final_answer
from orchestrator.machine.budgets import add_usage, check_budget
from orchestrator.machine.draft import Draft
from orchestrator.machine.events import CallModel, ModelResponded, ModelThrottled, QuotaExceeded
from orchestrator.machine.model_errors import give_up_compaction, is_current
from orchestrator.machine.state import MODEL_RETRY_TIMER_PREFIX, TurnState, ViewDiagnostic, ViewRecord
from orchestrator.machine.stopping import begin_stop
from orchestrator.machine.tool_round import Policy, plan_round
from orchestrator.machine.view import View, build_budget_tokens, build_view, fit_view
from orchestrator.model import LLMCallRecord, ModelSettings
from orchestrator.providers.traits import provider_of

# Settings a compaction call leaves out (see the module).
_NOT_FOR_SUMMARIES = frozenset({"stop", "max_output_tokens", "parallel_tool_calls"})


def build_tool_choice(state: TurnState) -> str | None:
    """The tool choice of the next model call: a forced one applies until the model first answers."""
    choice = state.tool_choice
    if choice is None or choice in ("auto", "none") or state.responses == 0:
        return choice
    return "auto"


def call_model_or_stop(draft: Draft, at: float) -> None:
    """Call the model with the view of the history, unless the deadline, max_llm_calls or a budget forbids
    it."""
    state = draft.state
    if at >= state.deadline_at:
        begin_stop(draft, "deadline", at)
        return
    if state.llm_calls >= state.limits.max_llm_calls:
        begin_stop(draft, "max_llm_calls", at)
        return
    spent = check_budget(state)
    if spent is not None:
        begin_stop(draft, spent.reason, at, status=spent.status, message=spent.message)
        return
    index = state.llm_calls
    provider = provider_of(state.model)
    view = build_fitted_view(state)
    if _compacts(state, view):
        _call_compaction(draft, index, view.dropped_through)
        return
    records = state.view_diagnostics
    if view.diagnostics:
        records = [
            *records,
            ViewRecord(llm_call_index=index, target_provider=provider, diagnostics=view.diagnostics),
        ]
    draft.update(llm_calls=index + 1, awaiting_model=index, view_diagnostics=records)
    _update_budget(draft, view_tokens=view.tokens)
    draft.commands.append(build_call_model(state, index, view))
    draft.emit(
        "model_called",
        llm_call_index=index,
        model=state.model,
        messages=len(view.messages),
        estimated_tokens=view.tokens,
        view_diagnostics=[d.kind for d in view.diagnostics],
    )
    removed = [d for d in view.diagnostics if d.kind in _TRIM_KINDS]
    if removed:
        draft.emit(
            "context_trimmed",
            llm_call_index=index,
            estimated_tokens_before=view.tokens_before,
            estimated_tokens_after=view.tokens,
            budget_tokens=view.budget_tokens,
            elided_tool_results=sum(d.kind == "elided_tool_result" for d in removed),
            dropped_exchanges=sum(d.kind == "dropped_exchange" for d in removed),
            removed=[_describe(d) for d in removed[:REMOVED_SHOWN]],
        )


_TRIM_KINDS = frozenset({"elided_tool_result", "dropped_exchange", "over_budget"})
# What one `context_trimmed` event lists at most: a long conversation trims more at every call, and the event
# stream must not grow with the square of it (the call's `view_diagnostics` keep the whole list).
REMOVED_SHOWN = 20


def _describe(diagnostic: ViewDiagnostic) -> dict[str, Any]:
    return {"kind": diagnostic.kind, "message_index": diagnostic.message_index, "detail": diagnostic.detail}


def _update_budget(draft: Draft, **changes: Unpack[BudgetChanges]) -> None:
    draft.update(context_budget=draft.state.context_budget.replace(**changes))


def build_fitted_view(state: TurnState) -> View:
    """The view of the history for the next model call, fitted to the turn's context budget."""
    view = build_view(state.history, provider_of(state.model))
    return fit_view(
        view,
        state.history,
        model=state.model,
        tools=list(state.offered.values()),
        budget_tokens=build_budget_tokens(state.model, state.context_budget),
        summary=state.context_budget.summary,
        instructions=state.instructions,
        output_schema=state.output_schema,
    )


def _compacts(state: TurnState, view: View) -> bool:
    """True when compaction is on and the view drops exchanges that no summary stands for yet.

    Not right after a compaction: the call that follows it drops what still does not fit, rather than
    spending another model call on a summary.
    """
    summary = state.context_budget.summary
    if summary is not None and summary.llm_call_index == state.llm_calls - 1:
        return False
    summarised = summary.through if summary is not None else 0
    return state.context_budget.compaction and view.dropped_through > summarised


def _call_compaction(draft: Draft, index: int, through: int) -> None:
    state = draft.state
    draft.update(llm_calls=index + 1, awaiting_model=index)
    _update_budget(draft, compacting=through)
    draft.commands.append(build_compaction_call(draft.state, index))
    draft.emit("model_called", llm_call_index=index, model=state.model, purpose="compaction", through=through)


def build_compaction_call(state: TurnState, index: int) -> CallModel:
    """The model call summarising the history before `compacting` (and the summary it extends)."""
    context = state.context_budget
    assert context.compacting is not None, "only a compacting turn calls for a summary"
    previous = context.summary
    start = previous.through if previous is not None else 0
    budget = build_budget_tokens(state.model, context)
    messages = build_compaction_messages(
        state.history[start : context.compacting], previous.text if previous else None, budget
    )
    return CallModel(
        model=state.model,
        messages=messages,
        tools=[],
        id_prefix=f"{state.turn_id}-m{index}",
        llm_call_index=index,
        # A summary of older history is not the answer: nothing of it goes to a page.
        stream=False,
        shown=False,
        settings=build_summary_settings(state.model_settings),
        tenant=state.tenant,
    )


def build_summary_settings(settings: ModelSettings) -> ModelSettings:
    """The turn's model settings as a compaction call uses them (see the module)."""
    return settings.model_copy(update=dict.fromkeys(_NOT_FOR_SUMMARIES))


def build_call_model(state: TurnState, index: int, view: View | None = None) -> CallModel:
    """The command for model call `index`, made from `state` as it stands before that call is answered.

    Everything comes from the state (history, offered tools, responses so far), so building it again for
    the call in flight after a restart (`machine.resume`) gives the very same request.
    """
    if view is None:
        if state.context_budget.compacting is not None:
            return build_compaction_call(state, index)
        view = build_fitted_view(state)
    return CallModel(
        model=state.model,
        messages=view.messages,
        tools=list(state.offered.values()),
        tool_choice=build_tool_choice(state),
        id_prefix=f"{state.turn_id}-m{index}",
        llm_call_index=index,
        stream=state.stream,
        instructions=state.instructions,
        settings=state.model_settings,
        tenant=state.tenant,
        output_schema=state.output_schema,
        estimated_tokens=view.tokens,
    )


def on_model_throttled(draft: Draft, event: ModelThrottled) -> None:
    """A model call held back by a rate limit: it was never sent, so it is not a model call of the turn —
    the same call is made again once the wait is over (a model retry timer), unless that is past the
    deadline, which stops the turn now.

    The wait is a timer of the persisted state, not of a process: an owner that dies while it runs leaves it
    to the next one (`resume` re-arms it), and the call, not in flight meanwhile, is made once.
    """
    state = draft.state
    index = state.awaiting_model
    if index is None or not is_current(state, event.llm_call_index):
        return
    go_at = event.at + event.wait_s
    draft.update(
        awaiting_model=None,
        llm_calls=index,
        # Decided again when the call is made: the view, and whether it is a summary, may differ by then.
        view_diagnostics=[r for r in state.view_diagnostics if r.llm_call_index != index],
        context_budget=state.context_budget.replace(compacting=None),
    )
    draft.emit(
        "model_throttled",
        llm_call_index=index,
        model=state.model,
        limit=event.limit,
        wait_ms=round(event.wait_s * 1000),
    )
    if go_at >= state.deadline_at:
        detail = f"{state.model} is held by its rate limit ({event.limit}) for {event.wait_s:.1f} s"
        begin_stop(draft, "deadline", event.at, detail=detail)
        return
    draft.arm(f"{MODEL_RETRY_TIMER_PREFIX}{index}", go_at)


def on_quota_exceeded(draft: Draft, event: QuotaExceeded) -> None:
    """A model call its tenant's quota held back: never sent, so not a model call of the turn; the turn
    stops as `quota_exceeded`, its message naming the tenant and the quota."""
    state = draft.state
    index = state.awaiting_model
    if index is None or not is_current(state, event.llm_call_index):
        return
    draft.update(
        awaiting_model=None,
        llm_calls=index,
        view_diagnostics=[r for r in state.view_diagnostics if r.llm_call_index != index],
        context_budget=state.context_budget.replace(compacting=None),
    )
    message = (
        f"tenant {event.tenant!r} has used {event.used:,} tokens today, past its quota of {event.limit:,} "
        f"({event.quota}, TOOLLOOP_TENANT_LIMITS)"
    )
    begin_stop(draft, "quota_exceeded", event.at, message=message)


def on_model_responded(draft: Draft, event: ModelResponded, policy: Policy | None) -> None:
    """A model response: start a round of tool calls, or take the final answer (`answers`)."""
    state = draft.state
    if not is_current(state, event.llm_call_index):
        return  # a duplicate, or the answer to a call the turn gave up on
    turn = event.turn
    record = LLMCallRecord(
        # The model that answered: as the provider names it, else as the turn called it.
        model=turn.model or state.model.partition(":")[2] or state.model,
        provider=turn.provider,
        usage=turn.usage,
        duration_ms=event.duration_ms,
        finish_reason=turn.finish_reason,
    )
    if state.context_budget.compacting is not None:
        _on_compacted(draft, event, record)
        return
    draft.update(
        awaiting_model=None,
        responses=state.responses + 1,
        model_retries=0,
        context_budget=state.context_budget.replace(retries=0),
        usage=add_usage(state, turn.usage),
        llm_call_records=[*state.llm_call_records, record],
    )
    draft.emit(
        "model_responded",
        llm_call_index=state.awaiting_model,
        type=turn.type,
        tool_calls=len(turn.tool_calls),
        finish_reason=turn.finish_reason,
        duration_ms=event.duration_ms,
        # Counts a provider did not give are left out; the cost is always there, null when no price is known.
        usage={**turn.usage.model_dump(exclude_none=True), "cost_usd": turn.usage.cost_usd},
    )
    if turn.tool_calls:
        plan_round(draft, turn, event.at, policy)
    else:
        on_final_answer(draft, turn, event.at, state.awaiting_model)


def _on_compacted(draft: Draft, event: ModelResponded, record: LLMCallRecord) -> None:
    """The summary came back: later views show it instead of the history it summarises."""
    state = draft.state
    through = state.context_budget.compacting
    assert through is not None and state.awaiting_model is not None
    turn = event.turn
    draft.update(
        awaiting_model=None,
        context_budget=state.context_budget.replace(compacting=None),
        usage=add_usage(state, turn.usage),
        llm_call_records=[*state.llm_call_records, record],
    )
    text = (turn.text or "").strip()
    if turn.tool_calls or not text:
        give_up_compaction(draft, "the summary came back empty")
        return
    summary = ContextSummary(through=through, text=text, llm_call_index=state.awaiting_model)
    _update_budget(draft, summary=summary)
    draft.emit(
        "context_compacted",
        llm_call_index=state.awaiting_model,
        through=through,
        summary_chars=len(text),
        # Counts a provider did not give are left out; the cost is always there, null when no price is known.
        usage={**turn.usage.model_dump(exclude_none=True), "cost_usd": turn.usage.cost_usd},
    )
