"""The model half of the loop: each model call with its view (SPEC §5.1, §6), tool choice (§5.10), model
errors with capped backoff and empty answers (§5.7)."""

from __future__ import annotations

from orchestrator.machine.draft import Draft
from orchestrator.machine.events import CallModel, ModelFailed, ModelResponded
from orchestrator.machine.state import MODEL_RETRY_TIMER_PREFIX, TurnState, ViewRecord
from orchestrator.machine.stopping import begin_stop, finish_turn
from orchestrator.machine.tool_round import Policy, plan_round
from orchestrator.machine.view import View, build_view
from orchestrator.model import LLMCallRecord, ProviderError, Turn, assistant_message_from_turn
from orchestrator.providers.traits import provider_of

_BLANK_FINISH_REASONS = {"length": "its output token limit", "content_filter": "a content filter"}


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
    view = build_view(state.history, provider)
    records = state.view_diagnostics
    if view.diagnostics:
        records = [
            *records,
            ViewRecord(llm_call_index=index, target_provider=provider, diagnostics=view.diagnostics),
        ]
    draft.update(llm_calls=index + 1, awaiting_model=index, view_diagnostics=records)
    draft.commands.append(build_call_model(state, index, view))
    draft.emit(
        "model_called",
        llm_call_index=index,
        model=state.model,
        messages=len(view.messages),
        view_diagnostics=[d.kind for d in view.diagnostics],
    )


def build_call_model(state: TurnState, index: int, view: View | None = None) -> CallModel:
    """The command for model call `index`, made from `state` as it stands before that call is answered.

    Everything comes from the state (history, offered tools, responses so far), so building it again for
    the call in flight after a restart (`machine.resume`) gives the very same request.
    """
    if view is None:
        view = build_view(state.history, provider_of(state.model))
    return CallModel(
        model=state.model,
        messages=view.messages,
        tools=list(state.offered.values()),
        tool_choice=build_tool_choice(state),
        id_prefix=f"{state.turn_id}-m{index}",
        llm_call_index=index,
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
    draft.update(
        awaiting_model=None,
        responses=state.responses + 1,
        model_retries=0,
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
