"""The model half of the loop: each model call with its view (SPEC §5.1, §6), fitted to the context budget
(§11.3), tool choice (§5.10), model errors with capped backoff and empty answers (§5.7).

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
from orchestrator.context.windows import CONTEXT_LENGTH_EXCEEDED, PROMPT_DETAIL, WINDOW_DETAIL
from orchestrator.machine.draft import Draft
from orchestrator.machine.events import CallModel, ModelFailed, ModelResponded
from orchestrator.machine.state import (
    MODEL_RETRY_TIMER_PREFIX,
    TurnState,
    ViewDiagnostic,
    ViewRecord,
)
from orchestrator.machine.stopping import begin_stop, finish_turn
from orchestrator.machine.tool_round import Policy, plan_round
from orchestrator.machine.view import View, build_budget_tokens, build_view, fit_view
from orchestrator.model import LLMCallRecord, ProviderError, Turn, assistant_message_from_turn
from orchestrator.providers.traits import provider_of

_BLANK_FINISH_REASONS = {"length": "its output token limit", "content_filter": "a content filter"}
# After an over-long-context error that states no window (or one the estimate already fitted), the next
# view is capped at this share of the failed request's estimate.
CONTEXT_SHRINK = 0.7
# Over-long-context errors answered by shrinking and calling again, per model call.
MAX_CONTEXT_RETRIES = 1


def build_tool_choice(state: TurnState) -> str | None:
    """The tool choice of the next model call: a forced one applies until the model first answers."""
    choice = state.tool_choice
    if choice is None or choice in ("auto", "none") or state.responses == 0:
        return choice
    return "auto"


def call_model_or_stop(draft: Draft, at: float) -> None:
    """Call the model with the view of the history, unless the deadline or max_llm_calls forbids it."""
    state = draft.state
    if at >= state.deadline_at:
        begin_stop(draft, "deadline", at)
        return
    if state.llm_calls >= state.limits.max_llm_calls:
        begin_stop(draft, "max_llm_calls", at)
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
    )


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
    )


def _is_current(state: TurnState, llm_call_index: int | None) -> bool:
    awaiting = state.awaiting_model
    return awaiting is not None and (llm_call_index is None or llm_call_index == awaiting)


def on_model_responded(draft: Draft, event: ModelResponded, policy: Policy | None) -> None:
    """A model response: start a round of tool calls, retry a blank answer, or complete the turn."""
    state = draft.state
    if not _is_current(state, event.llm_call_index):
        return  # a duplicate, or the answer to a call the turn gave up on
    turn = event.turn
    record = LLMCallRecord(
        model=turn.model,
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
        usage=state.usage + turn.usage,
        llm_call_records=[*state.llm_call_records, record],
    )
    draft.emit(
        "model_responded",
        llm_call_index=state.awaiting_model,
        type=turn.type,
        tool_calls=len(turn.tool_calls),
        finish_reason=turn.finish_reason,
        duration_ms=event.duration_ms,
        usage=turn.usage.model_dump(exclude_none=True),
    )
    if turn.tool_calls:
        plan_round(draft, turn, event.at, policy)
    elif not (turn.text or "").strip():
        _on_blank_answer(draft, turn, event.at)
    else:
        draft.update(history=[*draft.state.history, assistant_message_from_turn(turn)])
        finish_turn(draft, event.at)


def _on_blank_answer(draft: Draft, turn: Turn, at: float) -> None:
    state = draft.state
    why = _BLANK_FINISH_REASONS.get(turn.finish_reason or "")
    if why is not None:
        # Retrying would hit the same wall; say what happened instead of reporting success (SPEC §5.7).
        error = ProviderError(
            provider=turn.provider or provider_of(state.model),
            type=turn.finish_reason,
            message=f"the model stopped at {why} before writing any text",
        )
        begin_stop(draft, "empty_answer", at, detail=f"finish_reason {turn.finish_reason}", error=error)
        return
    if state.empty_answer_retries < state.limits.max_empty_answer_retries:
        draft.update(empty_answer_retries=state.empty_answer_retries + 1)
        draft.emit("model_empty_answer", retrying=True, retries=state.empty_answer_retries + 1)
        return
    begin_stop(draft, "empty_answer", at, detail=f"blank text {state.empty_answer_retries + 1} times")


def _on_compacted(draft: Draft, event: ModelResponded, record: LLMCallRecord) -> None:
    """The summary came back: later views show it instead of the history it summarises."""
    state = draft.state
    through = state.context_budget.compacting
    assert through is not None and state.awaiting_model is not None
    turn = event.turn
    draft.update(
        awaiting_model=None,
        context_budget=state.context_budget.replace(compacting=None),
        usage=state.usage + turn.usage,
        llm_call_records=[*state.llm_call_records, record],
    )
    text = (turn.text or "").strip()
    if turn.tool_calls or not text:
        _give_up_compaction(draft, "the summary came back empty")
        return
    summary = ContextSummary(through=through, text=text, llm_call_index=state.awaiting_model)
    _update_budget(draft, summary=summary)
    draft.emit(
        "context_compacted",
        llm_call_index=state.awaiting_model,
        through=through,
        summary_chars=len(text),
        usage=turn.usage.model_dump(exclude_none=True),
    )


def _give_up_compaction(draft: Draft, why: str) -> None:
    # Views drop exchanges for the rest of the turn instead: a summary that failed once would likely fail
    # again, and each try is a model call the turn pays for.
    _update_budget(draft, compaction=False, compacting=None)
    draft.emit("context_compaction_failed", reason=why)


def on_model_failed(draft: Draft, event: ModelFailed) -> None:
    """A failed model call: back off and retry a transient error while limits allow, else fail the turn."""
    state = draft.state
    if not _is_current(state, event.llm_call_index):
        return
    error = event.error
    record = LLMCallRecord(
        model=state.model, provider=error.provider, duration_ms=event.duration_ms, error=error
    )
    draft.update(awaiting_model=None, llm_call_records=[*state.llm_call_records, record])
    if state.context_budget.compacting is not None:
        _give_up_compaction(draft, f"{error.provider}: {error.message}")
        return
    if _shrinks(draft, error, event.at):
        draft.emit(
            "model_failed",
            status=error.status,
            error_type=error.type,
            code=error.code,
            message=error.message,
            retryable=True,
            retry_in_s=0.0,
            duration_ms=event.duration_ms,
        )
        return
    delay_s = build_retry_delay_s(state, error, event.at)
    if delay_s is not None:
        draft.update(model_retries=state.model_retries + 1)
        draft.arm(f"{MODEL_RETRY_TIMER_PREFIX}{state.llm_calls}", event.at + delay_s)
    draft.emit(
        "model_failed",
        status=error.status,
        error_type=error.type,
        message=error.message,
        retryable=error.retryable,
        retry_in_s=delay_s,
        duration_ms=event.duration_ms,
    )
    if delay_s is None:
        status = f" {error.status}" if error.status is not None else ""
        begin_stop(
            draft,
            "provider_error",
            event.at,
            detail=f"{error.provider}{status}: {error.message}",
            error=error,
        )


def build_retry_delay_s(state: TurnState, error: ProviderError, at: float) -> float | None:
    """Seconds to wait before retrying a failed model call, or None when it must not be retried.

    Capped exponential backoff; a provider's Retry-After is honoured even above the cap. No retry when the
    error is permanent, the retries or the model calls are used up, or it would start past the deadline.
    """
    limits = state.limits
    if not error.retryable or state.model_retries >= limits.max_model_retries:
        return None
    if state.llm_calls >= limits.max_llm_calls:
        return None
    delay_s = min(state.model_retry_cap_s, state.model_retry_base_s * 2**state.model_retries)
    if error.retry_after_s is not None:
        delay_s = max(delay_s, error.retry_after_s)
    return None if at + delay_s >= state.deadline_at else delay_s


def _shrinks(draft: Draft, error: ProviderError, at: float) -> bool:
    """For an over-long-context error, shrink the budget for a call made again at once; False: not that."""
    state = draft.state
    context = state.context_budget
    if error.code != CONTEXT_LENGTH_EXCEEDED or context.retries >= MAX_CONTEXT_RETRIES:
        return False
    if state.llm_calls >= state.limits.max_llm_calls or at >= state.deadline_at:
        return False
    window = _stated(error, WINDOW_DETAIL)
    if window is not None:
        context = context.replace(window_tokens=window)
    estimate = context.view_tokens
    if window is None or estimate <= build_budget_tokens(state.model, context.replace(cap_tokens=None)):
        # The estimate already fitted what the provider refused: it counts low for this model.
        context = context.replace(cap_tokens=max(1, int(estimate * CONTEXT_SHRINK)))
    draft.update(context_budget=context.replace(retries=context.retries + 1))
    draft.emit(
        "context_exceeded",
        llm_call_index=state.llm_calls - 1,
        estimated_tokens=estimate,
        prompt_tokens=_stated(error, PROMPT_DETAIL),
        window_tokens=window,
        budget_tokens=build_budget_tokens(state.model, context),
        retrying=True,
    )
    return True


def _stated(error: ProviderError, key: str) -> int | None:
    value = (error.details or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
