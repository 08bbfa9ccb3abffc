"""Bedrock Converse request bodies: every body built here is checked against botocore's own service model
(`ParamValidator` over the Converse input shape, the body being its members other than modelId)."""

from __future__ import annotations

from typing import Any

import botocore.serialize
import botocore.session
import pytest
from botocore.validate import ParamValidator

from orchestrator.model import (
    AssistantMessage,
    Message,
    ModelSettings,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from orchestrator.providers import bedrock
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.bedrock_request import CONTINUE_TEXT, NO_TOOL, build_model_family
from orchestrator.providers.controls import refuse_controls
from orchestrator.providers.structured import ANSWER_TOOL
from workers.contract import ToolSpec

pytestmark = pytest.mark.timeout(60)

CLAUDE = "us.anthropic.claude-3-7-sonnet-20250219-v1:0"
LLAMA = "meta.llama3-1-70b-instruct-v1:0"
WEATHER = ToolSpec(
    name="weather",
    description="Weather of a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CLOCK = ToolSpec(name="clock", description="", parameters={"properties": {}})
_MODEL = botocore.session.get_session().get_service_model("bedrock-runtime")


def check_valid(body: dict[str, Any], operation: str = "Converse") -> None:
    """The body is a valid input of `operation` by botocore's service model (modelId is the URL's)."""
    shape = _MODEL.operation_model(operation).input_shape
    report = ParamValidator().validate({"modelId": CLAUDE, **body}, shape)
    assert not report.has_errors(), report.generate_report()


def wire(**kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("model", CLAUDE)
    kwargs.setdefault("messages", [UserMessage(content="Hi")])
    body = bedrock.to_wire(ModelRequest(**kwargs))
    check_valid(body)
    check_valid(bedrock.to_wire(ModelRequest(**kwargs), stream=True), "ConverseStream")
    return body


def call(call_id: str, name: str = "weather", **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


ROUND: list[Message] = [
    SystemMessage(content="Be brief."),
    UserMessage(content="Weather in Oslo and Paris?"),
    AssistantMessage(
        content="Checking.",
        tool_calls=[call("tooluse_a", city="Oslo"), call("tooluse_b", city="Paris")],
        provider="bedrock",
        provider_data={
            "reasoning": [
                {"reasoningText": {"text": "plan", "signature": "sig=="}},
                {"redactedContent": "ZW5j"},
                {"reasoningText": {"text": "unsigned"}},
            ]
        },
    ),
    ToolMessage(tool_call_id="tooluse_a", name="weather", content="5C"),
    ToolMessage(tool_call_id="tooluse_b", name="weather", content="boom", is_error=True),
]


def test_a_full_round() -> None:
    body = wire(messages=ROUND, tools=[WEATHER], instructions="You are helpful.", tool_choice="auto")
    assert body["system"] == [{"text": "You are helpful."}, {"text": "Be brief."}]
    user, assistant, results = body["messages"]
    assert user == {"role": "user", "content": [{"text": "Weather in Oslo and Paris?"}]}
    assert assistant == {
        "role": "assistant",
        "content": [
            {"reasoningContent": {"reasoningText": {"text": "plan", "signature": "sig=="}}},
            {"reasoningContent": {"redactedContent": "ZW5j"}},
            {"text": "Checking."},
            {"toolUse": {"toolUseId": "tooluse_a", "name": "weather", "input": {"city": "Oslo"}}},
            {"toolUse": {"toolUseId": "tooluse_b", "name": "weather", "input": {"city": "Paris"}}},
        ],
    }
    assert results == {
        "role": "user",
        "content": [
            {"toolResult": {"toolUseId": "tooluse_a", "content": [{"text": "5C"}]}},
            {"toolResult": {"toolUseId": "tooluse_b", "content": [{"text": "boom"}], "status": "error"}},
        ],
    }
    assert body["toolConfig"] == {
        "tools": [
            {
                "toolSpec": {
                    "name": "weather",
                    "description": "Weather of a city",
                    "inputSchema": {"json": WEATHER.parameters},
                }
            }
        ],
        "toolChoice": {"auto": {}},
    }
    assert "inferenceConfig" not in body and "additionalModelRequestFields" not in body


def test_reasoning_of_another_provider_is_never_sent() -> None:
    history = [*ROUND[:2], ROUND[2].model_copy(update={"provider": "anthropic"})]
    body = wire(messages=history, tools=[WEATHER])
    assert all("reasoningContent" not in block for block in body["messages"][1]["content"])


def test_a_conversation_ending_with_the_assistant_gets_a_user_turn() -> None:
    body = wire(messages=[UserMessage(content="Hi"), AssistantMessage(content="Hello")])
    assert body["messages"][-1] == {"role": "user", "content": [{"text": CONTINUE_TEXT}]}


def test_consecutive_turns_merge_and_blank_text_is_dropped() -> None:
    history = [UserMessage(content="a"), UserMessage(content="  "), UserMessage(content="b")]
    body = wire(messages=history)
    assert body["messages"] == [{"role": "user", "content": [{"text": "a"}, {"text": "b"}]}]


def test_an_empty_tool_result_still_has_text() -> None:
    history = [*ROUND[1:3], ToolMessage(tool_call_id="tooluse_a", name="weather", content="", is_error=True)]
    body = wire(messages=history, tools=[WEATHER])
    assert body["messages"][2]["content"][0]["toolResult"]["content"] == [{"text": "(no output)"}]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"auto": {}}),
        ("required", {"any": {}}),
        ("weather", {"tool": {"name": "weather"}}),
        (None, None),
    ],
)
def test_tool_choice(choice: str | None, expected: dict[str, Any] | None) -> None:
    body = wire(tools=[WEATHER, CLOCK], tool_choice=choice)
    assert body["toolConfig"].get("toolChoice") == expected
    assert body["toolConfig"]["tools"][1] == {
        "toolSpec": {"name": "clock", "inputSchema": {"json": {"properties": {}, "type": "object"}}}
    }


def test_tool_choice_none_offers_no_tool() -> None:
    assert "toolConfig" not in wire(tools=[WEATHER], tool_choice="none")


@pytest.mark.parametrize("tools", [[], [WEATHER]])
def test_tool_history_without_offered_tools_gets_the_no_tool_stub(tools: list[ToolSpec]) -> None:
    # Bedrock refuses toolUse / toolResult blocks without a toolConfig.
    body = wire(messages=ROUND, tools=tools, tool_choice="none" if tools else None)
    assert [t["toolSpec"]["name"] for t in body["toolConfig"]["tools"]] == [NO_TOOL]
    assert "toolChoice" not in body["toolConfig"]


def test_inference_config() -> None:
    settings = ModelSettings(temperature=0.2, top_p=0.9, max_output_tokens=500, stop=["END"])
    body = wire(settings=settings, max_output_tokens=100)
    assert body["inferenceConfig"] == {
        "maxTokens": 500,
        "temperature": 0.2,
        "topP": 0.9,
        "stopSequences": ["END"],
    }
    assert wire(max_output_tokens=100)["inferenceConfig"] == {"maxTokens": 100}


def test_reasoning_effort_on_claude_is_a_thinking_budget() -> None:
    body = wire(settings=ModelSettings(reasoning_effort="medium"))
    assert body["additionalModelRequestFields"] == {"thinking": {"type": "enabled", "budget_tokens": 8192}}
    assert body["inferenceConfig"] == {"maxTokens": 8192 + 4096}
    capped = wire(settings=ModelSettings(reasoning_effort="high", max_output_tokens=5000))
    assert capped["additionalModelRequestFields"]["thinking"]["budget_tokens"] == 5000 - 1024
    assert capped["inferenceConfig"]["maxTokens"] == 5000


def test_reasoning_effort_on_another_model_is_sent_as_reasoning_effort() -> None:
    body = wire(model="openai.gpt-oss-120b-1:0", settings=ModelSettings(reasoning_effort="low"))
    assert body["additionalModelRequestFields"] == {"reasoning_effort": "low"}
    assert "inferenceConfig" not in body


def test_extra_is_merged_last() -> None:
    settings = ModelSettings(extra={"additionalModelRequestFields": {"top_k": 5}, "performanceConfig": {}})
    body = wire(settings=settings)
    assert body["additionalModelRequestFields"] == {"top_k": 5}
    assert body["performanceConfig"] == {}


SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


@pytest.mark.parametrize(
    ("model", "tools", "settings", "choice"),
    [
        (CLAUDE, [], ModelSettings(), {"any": {}}),
        ("amazon.nova-pro-v1:0", [], ModelSettings(), {"any": {}}),
        (LLAMA, [], ModelSettings(), None),
        (CLAUDE, [], ModelSettings(reasoning_effort="low"), None),
        (CLAUDE, [WEATHER], ModelSettings(), None),
    ],
)
def test_output_schema_is_the_answer_tool(
    model: str, tools: list[ToolSpec], settings: ModelSettings, choice: dict[str, Any] | None
) -> None:
    body = wire(model=model, tools=tools, settings=settings, output_schema=SCHEMA)
    answer = body["toolConfig"]["tools"][-1]["toolSpec"]
    assert (answer["name"], answer["inputSchema"]) == (ANSWER_TOOL, {"json": SCHEMA})
    assert body["toolConfig"].get("toolChoice") == choice
    assert "outputConfig" not in body


@pytest.mark.parametrize(
    ("model", "family"),
    [
        (CLAUDE, "anthropic"),
        ("anthropic.claude-3-haiku-20240307-v1:0", "anthropic"),
        ("global.anthropic.claude-sonnet-4-5-20250929-v1:0", "anthropic"),
        ("arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-3-haiku-20240307-v1:0", "anthropic"),
        ("arn:aws:bedrock:us-east-1:123456789012:inference-profile/eu.amazon.nova-lite-v1:0", "amazon"),
        ("mistral.mistral-large-2402-v1:0", "mistral"),
        (LLAMA, None),
        ("arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3", None),
    ],
)
def test_model_family(model: str, family: str | None) -> None:
    assert build_model_family(model) == family


@pytest.mark.parametrize(
    ("model", "path"),
    [
        (CLAUDE, "/model/us.anthropic.claude-3-7-sonnet-20250219-v1%3A0/converse"),
        (
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude",
            "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude/converse",
        ),
    ],
)
def test_build_url_quotes_the_model_as_botocore_does(model: str, path: str) -> None:
    base = "https://bedrock-runtime.us-east-1.amazonaws.com"
    assert bedrock.build_url(base, model, stream=False) == base + path
    assert bedrock.build_url(base, model, stream=True) == base + path.replace("/converse", "/converse-stream")
    # botocore's own serialiser builds the same path.
    serializer = botocore.serialize.create_serializer("rest-json")
    request = serializer.serialize_to_request(
        {"modelId": model, "messages": []}, _MODEL.operation_model("Converse")
    )
    assert request["url_path"] == path


def test_owned_fields_and_unsupported_settings() -> None:
    refused = refuse_controls(
        "bedrock", ModelSettings(seed=1, parallel_tool_calls=True, extra={"modelId": "x"})
    )
    assert refused == [
        "seed is not supported by bedrock",
        "parallel_tool_calls is not supported by bedrock",
        "extra.modelId is not allowed: toolloop builds 'modelId' itself",
    ]
