"""Model controls on the faces, pure: what `submit` builds, the submit-time refusals and where they
point, the CLI's flag parsers, the control stream's approval fields, and the scripted model's fallback and
typed answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from orchestrator.client.submission import build_submission
from orchestrator.commands.approvals import parse_arguments
from orchestrator.commands.controls import (
    build_model_names,
    build_model_settings,
    parse_output_schema,
    parse_setting,
)
from orchestrator.errors import CallNotWaitingError
from orchestrator.model import (
    ApprovalDecision,
    ModelSettings,
    ToolMessage,
    TurnOutcome,
    TurnRequest,
    TurnStatus,
)
from orchestrator.providers.scripted.brain import build_reply
from orchestrator.store import codec, flows
from orchestrator.store.scripts import ControlResult
from orchestrator.store.turn_view import PendingApproval, TurnView
from orchestrator.submit_checks import ModelNames, check_refusals, find_refusals
from tests.openapi_schemas import assert_valid
from tests.support.flows import drive
from workers.contract import ToolSpec


class Weather(BaseModel):
    city: str
    celsius: float


def request(**fields: Any) -> TurnRequest:
    return TurnRequest.model_validate({"prompt": "hi", **fields})


# --- build_submission -----------------------------------------------------------------------------------


def test_submit_takes_a_pydantic_class_as_the_schema_a_mapping_of_settings_and_a_model_list() -> None:
    built = build_submission(
        "hi",
        model=("scripted:plan-down", "scripted:plan"),
        instructions="Be brief.",
        model_settings={"temperature": 0.2, "extra": {"top_k": 5}},
        output_schema=Weather,
    ).request
    assert built.model == ["scripted:plan-down", "scripted:plan"]
    assert built.output_schema == Weather.model_json_schema() and built.instructions == "Be brief."
    assert built.model_settings == ModelSettings(temperature=0.2, extra={"top_k": 5})
    assert build_submission("hi", model_settings=ModelSettings(seed=1)).request.model_settings.seed == 1
    assert build_submission("hi", output_schema={"type": "object"}).request.output_schema == {
        "type": "object"
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"output_schema": int}, "pydantic model class, not int"),
        ({"output_schema": ["type", "object"]}, "JSON Schema"),
        ({"model_settings": {"temprature": 1}}, "temprature"),
        ({"model_settings": {"top_p": 2}}, "top_p"),
        ({"model_settings": {"reasoning_effort": "max"}}, "reasoning_effort"),
    ],
)
def test_submit_refuses_what_is_not_a_schema_or_a_setting(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_submission("hi", **kwargs)


def test_parse_gives_the_typed_object_or_says_there_is_none() -> None:
    done = TurnOutcome(turn_id="t", status="completed", output={"city": "Oslo", "celsius": -3})
    assert done.parse(Weather) == Weather(city="Oslo", celsius=-3)
    with pytest.raises(ValueError, match="has no output"):
        TurnOutcome(turn_id="t", status="stopped", stop_reason="invalid_output").parse(Weather)
    with pytest.raises(ValidationError):
        TurnOutcome(turn_id="t", status="completed", output={"city": "Oslo"}).parse(Weather)


# --- refusals at submit ---------------------------------------------------------------------------------


def test_each_refusal_names_its_field_and_the_model() -> None:
    asked = request(
        model=["scripted:plan", "anthropic:claude-x"],
        model_settings={"seed": 1, "temperature": 0.5, "extra": {"model": "other", "top_k": 3}},
    )
    shown = [str(r) for r in find_refusals(asked)]
    assert shown == [
        "model_settings.extra.model: extra.model is not allowed: toolloop builds 'model' itself "
        "(model scripted:plan)",
        "model_settings.extra.model: extra.model is not allowed: toolloop builds 'model' itself "
        "(model anthropic:claude-x)",
        "model_settings.seed: seed is not supported by anthropic (model anthropic:claude-x)",
    ]
    with pytest.raises(ValueError, match=r"^model_settings\.extra\.model: .*; model_settings\.seed: "):
        check_refusals(asked)
    assert find_refusals(request(model="scripted:plan", model_settings={"seed": 1})) == []


def test_a_combination_refused_names_the_settings_as_a_whole() -> None:
    asked = request(model="anthropic:c", model_settings={"reasoning_effort": "low", "temperature": 0.5})
    (refusal,) = find_refusals(asked)
    assert refusal.field == ("model_settings",) and "reasoning_effort" in refusal.message


def test_tiers_resolve_with_the_submitting_processs_names_and_the_rest_is_left_to_the_orchestrator() -> None:
    asked = request(model="smart", model_settings={"seed": 1})
    assert find_refusals(asked) == []  # no tiers known here: the orchestrator checks when it resolves it
    (refusal,) = find_refusals(asked, ModelNames({"smart": "anthropic:c"}))
    assert refusal.field == ("model_settings", "seed")
    unnamed = request(model_settings={"seed": 1})
    assert find_refusals(unnamed, ModelNames()) == []
    assert find_refusals(unnamed, ModelNames(default="openai_responses:gpt-x"))[0].field[-1] == "seed"
    assert find_refusals(unnamed, ModelNames({"default": "anthropic:c"}, "openai:x"))[0].field[-1] == "seed"


def test_an_output_schema_must_be_a_json_schema_of_an_object() -> None:
    (bad,) = find_refusals(request(output_schema={"type": "objekt"}))
    assert bad.field == ("output_schema",) and bad.message.startswith("not a valid JSON Schema: 'objekt'")
    (array,) = find_refusals(request(model="openai:gpt-x", output_schema={"type": "array"}))
    assert array.field == ("output_schema",) and "JSON object" in array.message
    assert find_refusals(request(model="openai:gpt-x", output_schema=Weather.model_json_schema())) == []


def test_names_come_from_settings_only_where_the_process_set_them() -> None:
    from orchestrator.settings import Settings

    assert ModelNames.from_settings(Settings()).default is None
    named = ModelNames.from_settings(Settings(model="anthropic:c", model_smart="openai:x"))
    assert (named.default, named.resolve("smart"), named.resolve("fast")) == ("anthropic:c", "openai:x", None)


# --- the CLI's flags ------------------------------------------------------------------------------------


def test_cli_flags_build_settings_with_only_what_was_given(tmp_path: Path) -> None:
    given = build_model_settings(
        temperature=0.0,
        top_p=None,
        max_output_tokens=None,
        stop=["a", "b"],
        seed=None,
        reasoning_effort=None,
        parallel_tool_calls=False,
        settings=["top_k=40", "mode=fast", 'bias={"1": 2}'],
    )
    assert given == {
        "temperature": 0.0,
        "stop": ["a", "b"],
        "parallel_tool_calls": False,
        "extra": {"top_k": 40, "mode": "fast", "bias": {"1": 2}},
    }
    with pytest.raises(ValueError, match="KEY=JSON"):
        parse_setting("=1")
    assert build_model_names(None) is None and build_model_names(["a:b"]) == "a:b"
    assert build_model_names(["a:b", "c:d"]) == ["a:b", "c:d"]
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object"}))
    assert (
        parse_output_schema(f"@{schema}") == parse_output_schema('{"type": "object"}') == {"type": "object"}
    )
    with pytest.raises(ValueError, match="cannot read --output-schema file"):
        parse_output_schema(f"@{tmp_path / 'missing.json'}")
    with pytest.raises(ValueError, match="must be a JSON object"):
        parse_output_schema("[1]")
    with pytest.raises(ValueError, match="--arguments is not valid JSON"):
        parse_arguments("{to: bob}")


# --- the control stream ---------------------------------------------------------------------------------


def test_approvals_carry_edited_arguments_and_a_reason_and_old_entries_read_as_none() -> None:
    old = codec.parse_control("1-0", {"kind": "approval", "call": "c", "approved": "1", "at": "2.0"})
    assert (old.arguments, old.reason) == (None, None)
    fields = {"kind": "approval", "call": "c", "approved": "0", "at": "2.0", "arguments": "", "reason": "no"}
    assert (codec.parse_control("1-1", fields).arguments, codec.parse_control("1-1", fields).reason) == (
        None,
        "no",
    )
    edited = {
        **fields,
        "approved": "1",
        "arguments": codec.dump_control_arguments({"to": "bob"}),
        "reason": "",
    }
    parsed = codec.parse_control(b"1-2", {k.encode(): v.encode() for k, v in edited.items()})
    assert (parsed.approved, parsed.arguments, parsed.reason) == (True, {"to": "bob"}, None)
    with pytest.raises(ValueError, match="JSON object"):
        codec.dump_control_arguments(["bob"])  # type: ignore[arg-type]


# --- the scripted model ---------------------------------------------------------------------------------


def plan_body(model: str, rounds: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": json.dumps({"plan": rounds})}], **more}


def test_an_error_round_for_one_model_lets_the_others_through() -> None:
    rounds = [{"error": {"status": 503, "message": "down", "model": "scripted:plan-down"}}, {"text": "ok"}]
    assert build_reply(plan_body("plan-down", rounds)).status == 503
    assert build_reply(plan_body("plan-down", rounds), attempt=5).status == 503  # on every attempt
    answered = build_reply(plan_body("plan", rounds))
    assert answered.status == 200 and answered.body["choices"][0]["message"]["content"] == "ok"
    assert build_reply(plan_body("plan-b", [{"text": "same plan"}])).status == 200
    assert build_reply(plan_body("planet", [{"text": "x"}])).status == 404


def test_the_demo_model_answers_the_schema_it_is_asked_for_from_the_tool_results() -> None:
    weather = {"city": "Paris", "temperature": 18.0, "unit": "celsius", "conditions": "cloudy"}
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps(weather)},
    ]
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "temperature": {"type": "number"},
            "wind": {"type": "integer"},
            "sky": {"enum": ["clear", "grey"]},
        },
    }
    response_format = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}
    body = {"model": "demo", "messages": messages, "response_format": response_format}
    assert_valid(body, "CreateChatCompletionRequest")
    reply = build_reply(body)
    answer = json.loads(reply.body["choices"][0]["message"]["content"])
    assert answer == {"city": "Paris", "temperature": 18.0, "wind": 0, "sky": "clear"}
    plain = build_reply({"model": "demo", "messages": messages})
    assert "Paris" in plain.body["choices"][0]["message"]["content"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(plain.body["choices"][0]["message"]["content"])


# --- the approval flow ----------------------------------------------------------------------------------


def waiting_view(tool: str) -> TurnView:
    return TurnView(
        id="t",
        status=TurnStatus.WAITING,
        request=request(),
        pending_approvals=[PendingApproval(call_id="c1", tool=tool, arguments={})],
    )


def ended_view() -> TurnView:
    return TurnView(id="t", status=TurnStatus.CANCELLED, request=request())


TRANSFER = ToolSpec(
    name="transfer",
    parameters={
        "type": "object",
        "properties": {"amount": {"type": "number"}, "to": {"type": "string"}},
        "required": ["amount", "to"],
    },
)


def test_an_answer_to_a_call_whose_first_answer_was_taken_is_refused_as_decided() -> None:
    # The turn runs on: the first answer was taken, the call waits no more, and a second answer is told so
    # (`call_decided` over HTTP), not that no such call waited.
    locate = {"name": "locate_user", "parameters": {"type": "object", "properties": {}}}
    running = TurnView(
        id="t",
        status=TurnStatus.RUNNING,
        request=request(client_tools=[locate]),
        messages=[
            ToolMessage(tool_call_id="c1", name="locate_user", content="{}"),
            ToolMessage(tool_call_id="c2", name="add", content="5"),
        ],
        approvals=[ApprovalDecision(call_id="c3", tool="transfer", approved=True, at=0.5)],
    )
    with pytest.raises(CallNotWaitingError, match="not waiting for a result: it was answered already") as got:
        drive(flows.send_client_result("t", "c1", 1.0, result={}), [running])
    assert got.value.decided
    with pytest.raises(CallNotWaitingError, match="no call with this id waits") as got:
        drive(
            flows.send_client_result("t", "c2", 1.0, result={}), [running]
        )  # a worker's call, not the caller's
    assert not got.value.decided
    with pytest.raises(CallNotWaitingError, match="not waiting for approval: it was decided already") as got:
        drive(flows.send_approval("t", "c3", False, 1.0), [running])
    assert got.value.decided
    with pytest.raises(CallNotWaitingError, match="no call with this id waits") as got:
        drive(flows.send_approval("t", "c1", True, 1.0), [running])
    assert not got.value.decided


def test_edited_arguments_are_checked_against_the_waiting_calls_tool_before_anything_is_recorded() -> None:
    with pytest.raises(ValueError, match=r"arguments: invalid arguments for 'transfer': .*amount"):
        drive(
            flows.send_approval("t", "c1", True, 1.0, arguments={"amount": "lots", "to": "bob"}),
            [waiting_view("transfer"), {"transfer": TRANSFER}],
        )
    steps, recorded = drive(
        flows.send_approval("t", "c1", True, 1.0, arguments={"amount": 5, "to": "bob"}),
        [waiting_view("transfer"), {"transfer": TRANSFER}, ControlResult.RECORDED],
    )
    assert recorded and steps[-1].args[8:12] == ('{"amount":5,"to":"bob"}', "", "", "")
    # No live worker serves the tool: the orchestrator checks.
    assert drive(
        flows.send_approval("t", "c1", True, 1.0, arguments={"x": 1}),
        [waiting_view("transfer"), {}, ControlResult.RECORDED],
    )[1]
    # Another call than the one waiting, or an answer recorded already: refused, nothing more recorded.
    with pytest.raises(CallNotWaitingError, match="no call with this id waits"):
        drive(flows.send_approval("t", "c9", True, 1.0, arguments={"x": 1}), [waiting_view("transfer")])
    with pytest.raises(CallNotWaitingError, match="decided already"):
        drive(flows.send_approval("t", "c1", True, 1.0), [waiting_view("transfer"), ControlResult.DECIDED])
    # Without edits, the view is read for the waiting call, and a denial's reason goes as it is.
    steps, _ = drive(
        flows.send_approval("t", "c1", False, 1.0, reason="no"),
        [waiting_view("transfer"), ControlResult.RECORDED],
    )
    assert len(steps) == 2 and steps[1].args[8:12] == ("", "no", "", "")
    # An ended turn: its view is read, nothing waits, and the script says it has ended.
    assert not drive(flows.send_approval("t", "c1", False, 1.0), [ended_view(), ControlResult.TERMINAL])[1]


@pytest.mark.parametrize("schema", [{"type": "string"}, {"type": "array", "items": {}}, {"enum": [1, 2]}])
def test_a_schema_of_anything_but_an_object_is_refused_whatever_the_model(schema: dict[str, object]) -> None:
    # No model named and no default configured here: no provider can be asked, the shape is refused anyway.
    refusals = find_refusals(TurnRequest(prompt="hi", output_schema=schema))
    assert [r.field for r in refusals] == [("output_schema",)]
    assert "JSON object" in refusals[0].message
