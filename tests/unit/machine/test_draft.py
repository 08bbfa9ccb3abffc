"""The typed draft: each change set mirrors its model's fields exactly, and a change is a plain copy."""

from __future__ import annotations

from typing import Any, get_type_hints

import pytest
from pydantic import BaseModel

from orchestrator.machine.draft import Draft
from orchestrator.machine.state import (
    CallChanges,
    CallState,
    RoundChanges,
    RoundState,
    TurnChanges,
    TurnState,
)
from orchestrator.model import AssistantMessage, TurnStatus

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("changes", "model"),
    [(TurnChanges, TurnState), (CallChanges, CallState), (RoundChanges, RoundState)],
    ids=["TurnState", "CallState", "RoundState"],
)
def test_each_change_set_mirrors_its_model_fields(changes: Any, model: type[BaseModel]) -> None:
    # A field added to the model and not here could not be set by the machine; a key here and not in the
    # model would be copied onto the state unchecked (model_copy does not validate).
    declared = get_type_hints(changes, include_extras=True)
    fields = {name: field.annotation for name, field in model.model_fields.items()}
    assert declared == fields
    assert changes.__required_keys__ == frozenset()


def _turn() -> TurnState:
    return TurnState(turn_id="t1", model="m:x", started_at=0.0, deadline_at=60.0)


def test_update_copies_the_state_and_keeps_the_old_one() -> None:
    before = _turn()
    draft = Draft(before)
    draft.update(llm_calls=2, status=TurnStatus.WAITING)
    assert (draft.state.llm_calls, draft.state.status) == (2, TurnStatus.WAITING)
    assert (before.llm_calls, before.status) == (0, TurnStatus.RUNNING)
    assert draft.state.model_dump(exclude={"llm_calls", "status"}) == before.model_dump(
        exclude={"llm_calls", "status"}
    )


def test_replace_changes_only_the_named_fields() -> None:
    call = CallState(call_id="c1", tool="add", index=0)
    dispatched = call.replace(attempt=1, task_id="t1:r1:c0:a1", dispatched_at=5.0)
    assert (dispatched.attempt, dispatched.task_id, dispatched.dispatched_at) == (1, "t1:r1:c0:a1", 5.0)
    assert dispatched.model_dump(exclude={"attempt", "task_id", "dispatched_at"}) == call.model_dump(
        exclude={"attempt", "task_id", "dispatched_at"}
    )
    assert call.attempt == 0
    current = RoundState(index=1, assistant=AssistantMessage(content="a"), calls=[call])
    assert current.replace(calls=[dispatched]).calls == [dispatched]
    assert current.calls == [call]
