"""Tool specs exported per provider: OpenAI function tools, Responses tools, Anthropic tools."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import pytest

from orchestrator.providers import anthropic, openai_chat, openai_responses
from tests.openapi_schemas import assert_valid
from workers.contract import ToolSpec
from workers.examples import arithmetic, demo, http, slow

EXAMPLE_SPECS = [
    t.spec for t in (arithmetic.add, demo.get_weather, demo.create_ticket, http.http_fetch, slow.slow)
]
# Anthropic's documented tool-name pattern.
ANTHROPIC_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
BARE = ToolSpec(name="ping")


@pytest.mark.parametrize("spec", [*EXAMPLE_SPECS, BARE], ids=lambda s: s.name)
def test_chat_function_tool_matches_openais_schema(spec: ToolSpec) -> None:
    tool = openai_chat.build_tool_param(spec)
    assert_valid(tool, "ChatCompletionTool")
    assert tool["function"]["name"] == spec.name
    assert tool["function"]["parameters"] == spec.parameters
    assert tool["function"].get("description") == (spec.description or None)


@pytest.mark.parametrize("spec", [*EXAMPLE_SPECS, BARE], ids=lambda s: s.name)
def test_responses_function_tool_matches_openais_schema(spec: ToolSpec) -> None:
    tool = openai_responses.build_tool_param(spec)
    assert_valid(tool, "FunctionTool")
    assert (tool["type"], tool["name"], tool["parameters"], tool["strict"]) == (
        "function",
        spec.name,
        spec.parameters,
        False,
    )


@pytest.mark.parametrize("spec", [*EXAMPLE_SPECS, BARE], ids=lambda s: s.name)
def test_anthropic_tool_has_a_valid_name_and_an_object_input_schema(spec: ToolSpec) -> None:
    tool = anthropic.build_tool_param(spec)
    assert set(tool) <= {"name", "description", "input_schema"}
    assert ANTHROPIC_TOOL_NAME.match(tool["name"])
    assert tool["input_schema"]["type"] == "object"
    jsonschema.Draft202012Validator.check_schema(tool["input_schema"])


def test_exports_do_not_alias_the_spec_parameters() -> None:
    spec = demo.get_weather.spec
    exported: list[dict[str, Any]] = [
        openai_chat.build_tool_param(spec)["function"]["parameters"],
        openai_responses.build_tool_param(spec)["parameters"],
        anthropic.build_tool_param(spec)["input_schema"],
    ]
    for parameters in exported:
        parameters["mutated"] = True
    assert "mutated" not in spec.parameters


def test_the_example_schemas_are_what_the_model_sees_and_validate_real_arguments() -> None:
    parameters = openai_chat.build_tool_param(demo.get_weather.spec)["function"]["parameters"]
    jsonschema.Draft202012Validator(parameters).validate({"city": "Paris"})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(parameters).validate({"city": ""})
