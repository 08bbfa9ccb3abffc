"""An MCP tool's `inputSchema` as the parameters providers accept (pure).

MCP servers publish any JSON Schema; model providers take a subset, and refuse the whole request over one
keyword they do not know. So the schema a worker publishes is rewritten, never loosened past what the
server itself checks:

- the root is an object: `type: "object"`, `properties` (empty when missing) and `required` (only names of
  `properties`, each once); root-level `anyOf` / `oneOf` / `allOf` / `not` / `enum` / `const` and the root
  `title` are dropped;
- local references (`#/$defs/…`, `#/definitions/…`) are inlined, and `$defs` / `definitions` dropped; a
  reference back into itself (a recursive type), a remote one, or nesting past `MAX_DEPTH` becomes `{}`
  (any value), keeping its description;
- only the keywords in `KEPT_KEYWORDS` stay (types, properties, items, enums, bounds, formats, patterns,
  combinators, descriptions, defaults); the others (`$schema`, `$id`, `$comment`, `if`/`then`/`else`,
  `patternProperties`, `dependentRequired`, `unevaluatedProperties`, `x-…` vendor keys…) are dropped, and
  a boolean schema (`true`, `false`) becomes `{}`;
- a result that is not a valid JSON Schema (Draft 2020-12) falls back to an object of the same property
  names, each `{}`.

Every rule only removes constraints or spells them out in place, so an argument the server would accept is
never refused before dispatch; the server checks its own schema when it runs the call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

MAX_DEPTH = 24
KEPT_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "items",
        "enum",
        "const",
        "description",
        "title",
        "default",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "uniqueItems",
        "additionalProperties",
        "anyOf",
        "oneOf",
        "allOf",
        "nullable",
    }
)
_ROOT_DROPPED = ("anyOf", "oneOf", "allOf", "enum", "const", "title", "nullable")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf")


def build_parameters(input_schema: object) -> dict[str, Any]:
    """The published parameters of an MCP tool whose `inputSchema` is `input_schema` (see the module)."""
    root: Mapping[str, Any] = input_schema if isinstance(input_schema, Mapping) else {}
    definitions = _definitions(root)
    cleaned = _clean(root, definitions, frozenset(), 0)
    for keyword in _ROOT_DROPPED:
        cleaned.pop(keyword, None)
    cleaned["type"] = "object"
    properties = cleaned.get("properties")
    if not isinstance(properties, dict):
        properties = {}
    cleaned["properties"] = properties
    required = cleaned.pop("required", None)
    if isinstance(required, list):
        names = [name for name in dict.fromkeys(required) if isinstance(name, str) and name in properties]
        if names:
            cleaned["required"] = names
    try:
        Draft202012Validator.check_schema(cleaned)
    except SchemaError:
        return {"type": "object", "properties": {name: {} for name in properties}}
    return cleaned


def _definitions(root: Mapping[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for section in ("definitions", "$defs"):
        value = root.get(section)
        if isinstance(value, Mapping):
            found.update({f"#/{section}/{name}": schema for name, schema in value.items()})
    return found


def _clean(
    schema: object, definitions: Mapping[str, Any], seen: frozenset[str], depth: int
) -> dict[str, Any]:
    if not isinstance(schema, Mapping) or depth > MAX_DEPTH:
        return {}
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return _resolve(schema, ref, definitions, seen, depth)
    cleaned: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword not in KEPT_KEYWORDS:
            continue
        if keyword == "properties":
            if isinstance(value, Mapping):
                cleaned[keyword] = {
                    str(name): _clean(sub, definitions, seen, depth + 1) for name, sub in value.items()
                }
        elif keyword == "items" or (keyword == "additionalProperties" and isinstance(value, Mapping)):
            cleaned[keyword] = _clean(value, definitions, seen, depth + 1)
        elif keyword in _SCHEMA_LISTS:
            if isinstance(value, list) and value:
                cleaned[keyword] = [_clean(sub, definitions, seen, depth + 1) for sub in value]
        else:
            cleaned[keyword] = value
    return cleaned


def _resolve(
    schema: Mapping[str, Any], ref: str, definitions: Mapping[str, Any], seen: frozenset[str], depth: int
) -> dict[str, Any]:
    """A `$ref` inlined (its siblings, such as a description, win over the target's)."""
    target = definitions.get(ref)
    if target is None or ref in seen:
        resolved: dict[str, Any] = {}
    else:
        resolved = _clean(target, definitions, seen | {ref}, depth + 1)
    siblings = {key: value for key, value in schema.items() if key != "$ref"}
    resolved.update(_clean(siblings, definitions, seen, depth))
    return resolved
