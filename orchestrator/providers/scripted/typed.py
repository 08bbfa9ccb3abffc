"""The `demo` model's structured answer: a JSON object when the request asks for one (pure).

A request whose `response_format` is a `json_schema` gets, for its final answer, an object of the schema's
properties, each filled from the turn's tool results: the value of the same key in a result that is a JSON
object (case-insensitively; the last result that has it wins), else an empty value of the property's type
(`""`, `0`, `false`, `[]`, `{}`, an enum's first value). So "What is the weather in Paris?" asked for
`{city, temperature, conditions}` answers with what `get_weather` returned. The `plan` model answers what its
plan says, structured or not: the tests decide whether an answer fits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.providers.scripted.conversation import ToolResult

_EMPTY: Mapping[str, Any] = {
    "string": "",
    "number": 0,
    "integer": 0,
    "boolean": False,
    "array": [],
    "null": None,
}


def requested_schema(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The JSON Schema a `response_format` of type `json_schema` asks for, or None."""
    response_format = body.get("response_format")
    if not isinstance(response_format, Mapping) or response_format.get("type") != "json_schema":
        return None
    described = response_format.get("json_schema")
    schema = described.get("schema") if isinstance(described, Mapping) else None
    return schema if isinstance(schema, Mapping) else None


def build_typed_answer(schema: Mapping[str, Any], results: Sequence[ToolResult]) -> str:
    """The JSON text of an object with the schema's properties, filled from the tool results."""
    known: dict[str, Any] = {}
    for result in results:
        try:
            value = json.loads(result.content)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            known.update({str(key).lower(): item for key, item in value.items()})
    properties = schema.get("properties")
    answer = {
        name: known.get(name.lower(), _empty_value(spec))
        for name, spec in (properties.items() if isinstance(properties, Mapping) else [])
    }
    return json.dumps(answer, ensure_ascii=False)


def _empty_value(spec: object) -> Any:
    if not isinstance(spec, Mapping):
        return None
    enum = spec.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    kind = spec.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    return _EMPTY.get(kind, {}) if isinstance(kind, str) else {}
