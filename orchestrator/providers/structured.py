"""Structured output: a JSON Schema for the answer, in each provider's own way, and back.

OpenAI Chat (`response_format`) and Responses (`text.format`) take a `json_schema` format whose `strict` flag
asks for constrained decoding. Strict mode accepts only schemas where every object lists all its properties
as `required` and sets `additionalProperties: false` (and uses none of the keywords strict mode lacks), so a
schema is sent strict exactly when it already is one; any other schema goes with `strict: false` (the model
is asked, not forced), never rewritten — the machine validates the answer against the schema as given.

Anthropic has no such format here: the answer is the input of a tool, `ANSWER_TOOL`, whose `input_schema`
is the schema. Alone (no other tool offered) it is forced with `tool_choice`; beside other tools, or with
extended thinking (which forbids forcing a tool), it is offered with a description telling the model to call
it for its final answer. `read_answer_tool` turns a call of it back into a final answer whose `text` is the
JSON of that input, so that every provider's structured answer is a `final_answer` Turn carrying its JSON in
`text`; the answer tool never appears as a tool call. A response that calls it beside other tools ends
there: the answer wins and the other calls are not made (the model said it was done).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from orchestrator.model import Turn

# The tool an Anthropic model answers through; a name no ordinary tool is likely to take.
ANSWER_TOOL = "toolloop_final_answer"
ANSWER_TOOL_DESCRIPTION = (
    "Give your final answer by calling this tool, once you need no other tool: its input is the answer, "
    "as the schema describes. Do not answer in plain text."
)
_FORMAT_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
DEFAULT_FORMAT_NAME = "output"
# Keywords OpenAI's strict mode does not take: a schema using one is sent with `strict: false`.
_NOT_STRICT_KEYWORDS = frozenset(
    {"allOf", "not", "oneOf", "if", "then", "else", "patternProperties", "dependentSchemas"}
    | {"dependentRequired"}
)
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "prefixItems")


def build_format_name(schema: Mapping[str, Any]) -> str:
    """The format's `name`: the schema's `title` when OpenAI takes it as a name, else `output`."""
    title = schema.get("title")
    return title if isinstance(title, str) and _FORMAT_NAME.match(title) else DEFAULT_FORMAT_NAME


def is_strict_schema(schema: Mapping[str, Any]) -> bool:
    """True when `schema` already meets OpenAI's strict mode: an object at the root, every object closed
    (`additionalProperties: false`) with all its properties required, at every depth, and no keyword strict
    mode lacks."""
    return _is_object_schema(schema) and _is_strict_part(schema)


def _is_strict_part(schema: object) -> bool:
    if not isinstance(schema, Mapping):
        return False
    if _NOT_STRICT_KEYWORDS & schema.keys():
        return False
    if _is_object_schema(schema) and not _is_closed_object(schema):
        return False
    return all(_is_strict_part(sub) for sub in _subschemas(schema))


def _is_object_schema(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in schema


def _is_closed_object(schema: Mapping[str, Any]) -> bool:
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    return (
        schema.get("additionalProperties") is False
        and isinstance(properties, Mapping)
        and isinstance(required, list)
        and set(required) == set(properties)
    )


def _subschemas(schema: Mapping[str, Any]) -> list[object]:
    found: list[object] = []
    for key in _SUBSCHEMA_MAPS:
        value = schema.get(key)
        if isinstance(value, Mapping):
            found.extend(value.values())
    for key in _SUBSCHEMA_LISTS:
        value = schema.get(key)
        if isinstance(value, list):
            found.extend(value)
    items = schema.get("items")
    if isinstance(items, Mapping):
        found.append(items)
    return found


def build_json_schema_format(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`{name, schema, strict}`: the json_schema format of Chat (`response_format.json_schema`) and, flat
    beside `type`, of Responses (`text.format`)."""
    return {"name": build_format_name(schema), "schema": dict(schema), "strict": is_strict_schema(schema)}


def build_answer_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The Anthropic tool whose input is the answer: the schema as its `input_schema`."""
    input_schema = dict(schema)
    input_schema.setdefault("type", "object")
    return {"name": ANSWER_TOOL, "description": ANSWER_TOOL_DESCRIPTION, "input_schema": input_schema}


def read_answer_tool(turn: Turn) -> Turn:
    """`turn` with a call of `ANSWER_TOOL` made its final answer: `text` the JSON of the call's input (the
    model's own text when it streamed, so that the streamed pieces add up to it), no tool calls, finish
    reason `stop`. A turn that did not call it is returned as it is."""
    answer = next((c for c in turn.tool_calls if c.name == ANSWER_TOOL), None)
    if answer is None:
        return turn
    text = answer.raw_arguments if answer.raw_arguments is not None else None
    if text is None or not text.strip():
        text = json.dumps(answer.arguments, ensure_ascii=False)
    return turn.model_copy(
        update={"type": "final_answer", "text": text, "tool_calls": [], "finish_reason": "stop"}
    )
