"""The turn's model controls in the machine: instructions, model settings and the output schema
go with every model call, from the persisted state, and never into the history."""

from __future__ import annotations

import json

import pytest

from orchestrator.context.budget import ContextBudget
from orchestrator.context.tokens import count_controls_tokens
from orchestrator.machine import resume, start, step
from orchestrator.machine.events import ArmTimer, CallModel, Command, ModelFailed, ModelResponded, TimerFired
from orchestrator.machine.layout import dump_log
from orchestrator.machine.state import dump_entries, dump_state, load_state
from orchestrator.machine.view import build_view, fit_view
from orchestrator.model import (
    AssistantMessage,
    Limits,
    Message,
    ModelSettings,
    ProviderError,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Turn,
    TurnRequest,
    UserMessage,
)
from tests.unit.machine.harness import Driver, answer, calls, of_type, ok

pytestmark = pytest.mark.timeout(30)

INSTRUCTIONS = "You are a terse assistant. Answer in French."
SETTINGS = ModelSettings(
    temperature=0.2,
    top_p=0.9,
    max_output_tokens=300,
    stop=["END"],
    seed=7,
    reasoning_effort="low",
    parallel_tool_calls=False,
    extra={"top_k": 20},
)
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def controlled(**fields: object) -> Driver:
    return Driver(instructions=INSTRUCTIONS, model_settings=SETTINGS, output_schema=SCHEMA, **fields)


def assert_controls(call: CallModel) -> None:
    assert (call.instructions, call.settings, call.output_schema) == (INSTRUCTIONS, SETTINGS, SCHEMA)


def copy_of(driver: Driver) -> tuple[str, list[str], list[str]]:
    state = driver.state
    return dump_state(state), dump_entries(state.history), dump_log(state)


def test_every_model_call_carries_the_controls_and_the_history_never_holds_the_instructions() -> None:
    driver = controlled(limits=Limits(max_model_retries=1))
    assert_controls(driver.call_model())
    driver.respond(calls(("add", {"a": 1, "b": 2})))
    driver.finish(ok("call_0", "add", "3"))
    assert_controls(driver.call_model())  # after a round
    driver.feed(
        ModelFailed(error=ProviderError(provider="openai", message="busy", retryable=True), at=1002.0)
    )
    [timer] = of_type(driver.last, ArmTimer)
    driver.feed(TimerFired(timer_id=timer.timer_id, at=timer.at))
    assert_controls(driver.call_model())  # a retry
    driver.respond(answer('{"n": 3}'), at=timer.at)
    assert driver.outcome.status == "completed"
    assert not any(isinstance(m, SystemMessage) for m in driver.state.history)
    assert INSTRUCTIONS not in json.dumps([m.model_dump(mode="json") for m in driver.state.history])
    assert [type(m) for m in driver.state.history][:1] == [UserMessage]


def test_a_turn_without_controls_sends_none() -> None:
    call = Driver().call_model()
    assert (call.instructions, call.settings, call.output_schema) == (None, ModelSettings(), None)


def test_the_controls_are_static_fields_that_survive_a_restart() -> None:
    driver = controlled()
    text, history, log = copy_of(driver)
    static = json.loads(log[0])
    assert static[0] == "static"
    assert static[1]["instructions"] == INSTRUCTIONS and static[1]["output_schema"] == SCHEMA
    assert static[1]["model_settings"]["extra"] == {"top_k": 20}
    assert INSTRUCTIONS not in text  # stored once, in the log, not in every step's state
    loaded = load_state(text, history, log)
    assert loaded == driver.state
    _, commands = resume(loaded, at=1000.5)
    [again] = of_type(commands, CallModel)
    assert again == driver.call_model()  # the very same request


def test_a_later_turn_of_the_conversation_may_change_the_instructions() -> None:
    first = controlled()
    first.respond(answer('{"n": 1}'))
    history: list[Message] = list(first.outcome.messages)
    second = Driver(prompt="again", prior_history=history, instructions="Answer in German.")
    call = second.call_model()
    assert call.instructions == "Answer in German."
    assert call.output_schema is None and call.settings == ModelSettings()
    assert INSTRUCTIONS not in json.dumps([m.model_dump(mode="json") for m in call.messages])


def test_a_state_written_before_the_controls_loads_with_defaults() -> None:
    driver = Driver()
    text, history, log = copy_of(driver)
    entry = json.loads(log[0])
    # As an orchestrator of the previous release wrote it: every static field, none of the new ones.
    entry[1] = driver.state.model_dump(
        mode="json",
        include={"model", "limits", "context", "tools_allowed", "tool_choice", "stream", "offered"},
    )
    loaded = load_state(text, history, [json.dumps(entry)])
    assert (loaded.instructions, loaded.model_settings, loaded.output_schema) == (None, ModelSettings(), None)
    assert (loaded.models, loaded.model_index, loaded.output_retries) == ([], 0, 0)


def test_a_turn_using_no_new_field_writes_none_of_them() -> None:
    # So that an orchestrator of the previous release, during a rolling deploy, still reads its state.
    text, _, log = copy_of(Driver())
    written = set(json.loads(log[0])[1]) | set(json.loads(text))
    new_fields = {
        "models",
        "model_index",
        "instructions",
        "model_settings",
        "output_schema",
        "output_retries",
    }
    assert written & new_fields == set()


def test_the_last_static_entry_counts_even_for_a_field_it_leaves_at_its_default() -> None:
    driver = Driver(instructions="first")
    text, history, log = copy_of(driver)
    changed = driver.state.model_copy(update={"instructions": None})
    log += dump_log(changed, log)
    assert len(log) == 2
    assert load_state(text, history, log).instructions is None


def test_the_view_estimate_counts_the_instructions_and_the_schema() -> None:
    history: list[Message] = [UserMessage(content="hello")]
    view = build_view(history, "openai")
    bare = fit_view(view, history, model="openai:m", tools=[], budget_tokens=10_000)
    instructions = "x" * 3_000
    fitted = fit_view(
        view,
        history,
        model="openai:m",
        tools=[],
        budget_tokens=10_000,
        instructions=instructions,
        output_schema=SCHEMA,
    )
    assert fitted.tokens - bare.tokens == count_controls_tokens(instructions, SCHEMA) > 1_000


def test_long_instructions_make_the_view_trim_sooner() -> None:
    history: list[Message] = [
        UserMessage(content="fetch"),
        AssistantMessage(tool_calls=[ToolCall(id="call_0", name="fetch")], provider="openai"),
        ToolMessage(tool_call_id="call_0", name="fetch", content="r" * 6_000),
        AssistantMessage(content="done", provider="openai"),
        UserMessage(content="and now?"),
    ]
    budget = ContextBudget(window_tokens=3_000, output_reserve_tokens=0)
    results: list[int] = []
    for instructions in (None, "i" * 6_000):
        request = TurnRequest(instructions=instructions)
        _, commands = start(
            "t", request, model="openai:m", catalogue={}, at=0.0, prior_history=history, context_budget=budget
        )
        [call] = model_calls(commands)
        results += [len(m.content) for m in call.messages if isinstance(m, ToolMessage)]
    # The same history fits whole without them, and has its tool result elided with them.
    assert results[0] == 6_000 and results[1] < 6_000


def test_a_compaction_call_carries_neither_instructions_nor_schema_nor_cutting_settings() -> None:
    history: list[Message] = []
    for n in range(6):
        history += [
            UserMessage(content=f"fetch page {n}"),
            AssistantMessage(tool_calls=[ToolCall(id=f"call_{n}", name="fetch")], provider="openai"),
            ToolMessage(tool_call_id=f"call_{n}", name="fetch", content="x" * 12_000),
            AssistantMessage(content=f"page {n} read", provider="openai"),
        ]
    request = TurnRequest(
        prompt="and now?", instructions=INSTRUCTIONS, model_settings=SETTINGS, output_schema=SCHEMA
    )
    budget = ContextBudget(window_tokens=300, output_reserve_tokens=0, compaction=True)
    state, commands = start(
        "t", request, model="openai:m", catalogue={}, at=0.0, prior_history=history, context_budget=budget
    )
    [summary_call] = model_calls(commands)
    assert summary_call.shown is False
    assert (summary_call.instructions, summary_call.output_schema) == (None, None)
    assert summary_call.settings == SETTINGS.model_copy(
        update={"stop": None, "max_output_tokens": None, "parallel_tool_calls": None}
    )
    assert summary_call.settings.extra == {"top_k": 20} and summary_call.settings.temperature == 0.2
    # Resumed while the summary is in flight: the same summary call again.
    copy = load_state(dump_state(state), dump_entries(state.history), dump_log(state))
    _, again = resume(copy, at=0.5)
    assert model_calls(again) == [summary_call]
    # The summary back: the next call is the turn's own again, with all its controls.
    summary = Turn(type="final_answer", text="Pages were read.", provider="openai_chat")
    state, commands = step(state, ModelResponded(turn=summary, at=1.0))
    [call] = model_calls(commands)
    assert (call.instructions, call.settings, call.output_schema) == (INSTRUCTIONS, SETTINGS, SCHEMA)


def model_calls(commands: list[Command]) -> list[CallModel]:
    return [c for c in commands if isinstance(c, CallModel)]
