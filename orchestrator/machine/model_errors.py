"""A failed model call: shrink the view, back off and retry, fall back to the next model,
or fail the turn.

In that order. An over-long-context error shrinks the context budget and calls again at once, one time
(`orchestrator.context`). A transient error is retried on the same model with capped exponential backoff
(honouring Retry-After), `limits.max_model_retries` times. Then, when the turn's `model` is a list, the next
model takes the call at once, with retries of its own (`model_fallback`), and keeps the rest of the turn: a
model that failed this way is likely to fail the next call too. It takes over after a transient error, and
after errors that say this model cannot be used from here whatever is asked — no key for its provider
(`missing_api_key`), a name no client serves (`invalid_model`), HTTP 401, 403, 404 — which another model need
not share. Any other error (a request the provider refuses, a client bug) would fail the same way on the next
model: it ends the turn `provider_error`, as does the last model's failure. Every attempt counts against
`max_llm_calls` and the deadline.

Design notes: docs/design/model-calls.md, "Retries and fallback".
"""

from __future__ import annotations

from orchestrator.context.windows import CONTEXT_LENGTH_EXCEEDED, PROMPT_DETAIL, WINDOW_DETAIL
from orchestrator.machine.draft import Draft
from orchestrator.machine.events import ModelFailed
from orchestrator.machine.state import MODEL_RETRY_TIMER_PREFIX, TurnState
from orchestrator.machine.stopping import begin_stop
from orchestrator.machine.view import build_budget_tokens
from orchestrator.model import LLMCallRecord, ProviderError

# After an over-long-context error that states no window (or one the estimate already fitted), the next
# view is capped at this share of the failed request's estimate.
CONTEXT_SHRINK = 0.7
# Over-long-context errors answered by shrinking and calling again, per model call.
MAX_CONTEXT_RETRIES = 1
# Errors that say the model cannot be used from here (no key, no such model, no access): another may be.
UNUSABLE_MODEL_ERRORS = frozenset({"missing_api_key", "invalid_model"})
UNUSABLE_MODEL_STATUSES = frozenset({401, 403, 404})


def is_current(state: TurnState, llm_call_index: int | None) -> bool:
    """True when an answer for `llm_call_index` answers the model call in flight."""
    awaiting = state.awaiting_model
    return awaiting is not None and (llm_call_index is None or llm_call_index == awaiting)


def give_up_compaction(draft: Draft, why: str) -> None:
    """Views drop exchanges for the rest of the turn instead: a summary that failed once would likely fail
    again, and each try is a model call the turn pays for."""
    draft.update(context_budget=draft.state.context_budget.replace(compaction=False, compacting=None))
    draft.emit("context_compaction_failed", reason=why)


def on_model_failed(draft: Draft, event: ModelFailed) -> None:
    """A failed model call: shrink, retry, fall back while limits allow, else fail the turn."""
    state = draft.state
    if not is_current(state, event.llm_call_index):
        return
    error = event.error
    # Named as an answered call's record is: the model without its provider, which `provider` says.
    model = state.model.partition(":")[2] or state.model
    record = LLMCallRecord(model=model, provider=error.provider, duration_ms=event.duration_ms, error=error)
    draft.update(awaiting_model=None, llm_call_records=[*state.llm_call_records, record])
    if state.context_budget.compacting is not None:
        give_up_compaction(draft, f"{error.provider}: {error.message}")
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
    if delay_s is not None:
        return
    fallback = select_fallback(state, error, event.at)
    if fallback is not None:
        _fall_back(draft, fallback, error)
        return
    status = f" {error.status}" if error.status is not None else ""
    begin_stop(
        draft, "provider_error", event.at, detail=f"{error.provider}{status}: {error.message}", error=error
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


def select_fallback(state: TurnState, error: ProviderError, at: float) -> int | None:
    """The index of the model that takes the failed call over, or None when none does (see the module)."""
    following = state.model_index + 1
    if following >= len(state.models):
        return None
    unusable = (
        error.type in UNUSABLE_MODEL_ERRORS
        or error.code in UNUSABLE_MODEL_ERRORS
        or error.status in UNUSABLE_MODEL_STATUSES
    )
    if not (error.retryable or unusable):
        return None
    if state.llm_calls >= state.limits.max_llm_calls or at >= state.deadline_at:
        return None
    return following


def _fall_back(draft: Draft, index: int, error: ProviderError) -> None:
    # No timer: with the call answered and none armed, the loop calls the next model at once.
    state = draft.state
    following = state.models[index]
    context = state.context_budget
    draft.update(
        model=following,
        model_index=index,
        model_retries=0,
        # The view is fitted to the new model's window; what the old one's errors taught does not carry over.
        context_budget=context.replace(
            window_tokens=context.model_windows.get(following), cap_tokens=None, retries=0
        ),
    )
    draft.emit(
        "model_fallback",
        llm_call_index=state.llm_calls - 1,
        **{"from": state.model, "to": following},
        error={"status": error.status, "type": error.type, "code": error.code, "message": error.message},
    )


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
