"""A final answer: a blank one is retried, a typed one is validated, the rest complete.

With an `output_schema`, the answer's text is parsed as JSON and checked against it (Draft 2020-12). One
that fits completes the turn with `output`, the parsed value. One that does not stays in the history, and a
user message listing what is wrong (bounded: at most 10 errors of 300 characters) asks for another: each is
a model call of its own, counted against `max_llm_calls` and the budgets, and at most
`limits.max_output_retries` of them are asked for in a turn (`output_invalid`, `retrying`). When they are used
up the turn fails with `invalid_output` and no `output`. A final answer completes the turn even when it spent
the turn's budget: it is paid for, and the budgets are there to stop a turn that would call on.

Design notes: docs/design/model-calls.md, "Final answers".
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.machine.draft import Draft
from orchestrator.machine.stopping import begin_stop, finish_turn
from orchestrator.machine.validation import check_output_schema, validate_output
from orchestrator.model import ProviderError, Turn, UserMessage, assistant_message_from_turn
from orchestrator.providers.traits import provider_of

_BLANK_FINISH_REASONS = {"length": "its output token limit", "content_filter": "a content filter"}


def on_final_answer(draft: Draft, turn: Turn, at: float, llm_call_index: int | None) -> None:
    """A response without tool calls: retry a blank one, check a typed one, or complete the turn."""
    if not (turn.text or "").strip():
        _on_blank_answer(draft, turn, at)
        return
    draft.update(history=[*draft.state.history, assistant_message_from_turn(turn)])
    schema = draft.state.output_schema
    if schema is None:
        finish_turn(draft, at)
        return
    problem = check_output_schema(schema)
    if problem is not None:
        # Refused at submit and at start; guarded all the same: asking again could not help.
        begin_stop(draft, "invalid_output", at, message=problem)
        return
    value, errors = validate_output(schema, turn.text)
    if not errors:
        finish_turn(draft, at, output=value)
        return
    state = draft.state
    retrying = state.output_retries < state.limits.max_output_retries
    retries = state.output_retries + 1 if retrying else state.output_retries
    draft.emit(
        "output_invalid", llm_call_index=llm_call_index, errors=errors, retrying=retrying, retries=retries
    )
    if not retrying:
        detail = f"{state.output_retries + 1} answer(s) did not fit; the last: {'; '.join(errors[:3])}"
        begin_stop(draft, "invalid_output", at, detail=detail)
        return
    feedback = UserMessage(content=build_output_feedback(errors))
    draft.update(output_retries=retries, history=[*state.history, feedback])


def build_output_feedback(errors: Sequence[str]) -> str:
    """The user message that sends an answer back: what does not fit, and what to do."""
    listed = "\n".join(f"- {error}" for error in errors)
    return (
        "Your answer does not match the required output schema:\n"
        f"{listed}\n"
        "Answer again with only a JSON value that matches the schema."
    )


def _on_blank_answer(draft: Draft, turn: Turn, at: float) -> None:
    state = draft.state
    why = _BLANK_FINISH_REASONS.get(turn.finish_reason or "")
    if why is not None:
        # Retrying would hit the same wall; say what happened instead of reporting success.
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
