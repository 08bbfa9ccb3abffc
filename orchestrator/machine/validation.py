"""Pre-dispatch validation of one tool call, and of a typed final answer: pure, no I/O.

The state machine and direct execution call `validate_call` before anything is sent to a worker: an unknown
tool, a tool the turn does not offer, arguments that are too large or that fail the tool's JSON Schema all
become a `Rejection` — a value the caller turns into a failure outcome — and are never dispatched.
`classify_tool` says whether a call of a catalogued tool is sent to a live worker, sent to wait in its queue
for the next one (a restart, a deploy), or answered `not_found` (no worker has served it for a while).
`validate_output` parses a final answer as JSON and checks it against the turn's output schema (Draft 2020-12,
as tool arguments are), giving the errors a model can fix its answer by.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from enum import StrEnum
from functools import lru_cache
from typing import Any, NamedTuple

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError
from referencing.exceptions import Unresolvable

from workers.contract import FailureKind, ToolSpec, build_listing

# Order of jsonschema messages shown to the model: what is missing first, then what is unexpected, then
# wrong types; anything else after. A model fixes its call fastest in that order.
_MESSAGE_ORDER = {"required": 0, "additionalProperties": 1, "type": 2}
_MAX_MESSAGES = 10
# A message about a value quotes the value: an answer's error shows at most this much of it.
_MAX_MESSAGE_CHARS = 300
# The cache key of output schemas in the compiled validators (no tool is named so: names are identifiers).
_OUTPUT = "<output schema>"


class Rejection(NamedTuple):
    """Why a call is refused before dispatch: the failure kind and a message a model can act on."""

    kind: FailureKind
    message: str


class ToolAvailability(StrEnum):
    """Whether a call of a tool can be sent now, as `classify_tool` sorts it."""

    SERVED = "served"  # a live worker serves it: sent
    WAITING_FOR_WORKER = "waiting_for_worker"  # none now, one within the window: sent, it waits in its queue
    GONE = "gone"  # no worker has served it within the window: answered `not_found`


def classify_tool(
    name: str, live: Collection[str], served_at: Mapping[str, float], now: float, gone_after_s: float
) -> ToolAvailability:
    """How a call of `name` fares, given the tools live workers serve (`live`), when a worker last served
    each tool (`served_at`, epoch seconds) and the time `now`.

    A tool a worker served at most `gone_after_s` ago is only between workers — its only worker
    restarting, a deploy replacing them all — and a call of it waits in its queue, where Celery keeps it, for
    the next one (within the turn's deadline: the task `expires` then). Only a tool no worker has served for
    longer is gone. A `served_at` in the future (clocks a little apart) counts as now.
    """
    if name in live:
        return ToolAvailability.SERVED
    last = served_at.get(name)
    if last is not None and now - last <= gone_after_s:
        return ToolAvailability.WAITING_FOR_WORKER
    return ToolAvailability.GONE


def offered_tools(catalogue: Mapping[str, ToolSpec], requested: Sequence[str] | None) -> dict[str, ToolSpec]:
    """The tools a turn offers.

    `requested` None → every non-sensitive tool of the catalogue; otherwise exactly the named tools that
    exist — a sensitive tool only because it is named.
    """
    if requested is None:
        return {spec.name: spec for spec in build_listing(catalogue.values())}
    return {name: catalogue[name] for name in requested if name in catalogue}


def validate_call(
    name: str,
    arguments: Mapping[str, Any],
    arguments_error: str | None,
    catalogue: Mapping[str, ToolSpec],
    offered: Mapping[str, ToolSpec],
) -> Rejection | None:
    """None when the call may be dispatched, else the reason it may not.

    Only the names of the offered tools are ever listed, so a hidden sensitive tool is never revealed.
    """
    if name not in catalogue:
        available = ", ".join(sorted(offered)) or "none"
        return Rejection(FailureKind.NOT_FOUND, f"unknown tool '{name}'; available: {available}")
    if name not in offered:
        return Rejection(FailureKind.NOT_ALLOWED, f"tool '{name}' is not allowed in this turn")
    if arguments_error is not None:
        return Rejection(FailureKind.VALIDATION, f"invalid arguments for '{name}': {arguments_error}")
    spec = offered[name]
    size_rejection = _check_size(name, arguments, spec.max_args_bytes)
    if size_rejection is not None:
        return size_rejection
    messages = build_schema_messages(name, spec.parameters, arguments)
    if messages:
        return Rejection(FailureKind.VALIDATION, f"invalid arguments for '{name}': " + "; ".join(messages))
    return None


def _check_size(name: str, arguments: Mapping[str, Any], max_args_bytes: int) -> Rejection | None:
    try:
        encoded = json.dumps(arguments, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:
        return Rejection(FailureKind.VALIDATION, f"arguments for '{name}' are not JSON: {exc}")
    if len(encoded) > max_args_bytes:
        return Rejection(
            FailureKind.PAYLOAD_LIMIT,
            f"arguments for '{name}' are {len(encoded)} bytes; the limit is {max_args_bytes}",
        )
    return None


def build_schema_messages(name: str, schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
    """The JSON Schema errors of `arguments`, most actionable first (missing, unknown, type, others)."""
    validator = _compiled_validator(name, json.dumps(schema, sort_keys=True))
    errors = sorted(validator.iter_errors(dict(arguments)), key=_error_rank)
    return [_describe(error) for error in errors[:_MAX_MESSAGES]]


def _error_rank(error: ValidationError) -> tuple[int, str, str]:
    validator = str(error.validator)
    return (_MESSAGE_ORDER.get(validator, 3), error.json_path, error.message)


def _describe(error: ValidationError) -> str:
    if error.json_path == "$":
        return error.message
    return f"{error.json_path.removeprefix('$.')}: {error.message}"


@lru_cache(maxsize=1024)
def _compiled_validator(name: str, schema_json: str) -> Draft202012Validator:
    # Keyed on the schema text as well as the name: a worker may republish a tool with a new schema.
    del name  # part of the cache key only
    return Draft202012Validator(json.loads(schema_json))


def check_output_schema(schema: Mapping[str, Any]) -> str | None:
    """None when `schema` is a valid JSON Schema (Draft 2020-12), else what is wrong with it."""
    try:
        Draft202012Validator.check_schema(dict(schema))
    except SchemaError as exc:
        return f"the output schema is not a valid JSON Schema: {_bounded(exc.message)}"
    return None


def validate_output(schema: Mapping[str, Any], text: str | None) -> tuple[Any, list[str]]:
    """A final answer parsed as JSON and checked against `schema`: `(value, [])` when it fits, else
    `(None, errors)`, most actionable first. An answer wrapped in a Markdown code fence is read inside it."""
    problem = check_output_schema(schema)
    if problem is not None:
        return None, [problem]  # refused at submit; a state from elsewhere is guarded all the same
    try:
        value = json.loads(_unfenced((text or "").strip()))
    except ValueError as exc:
        return None, [f"the answer is not JSON: {exc}"]
    validator = _compiled_validator(_OUTPUT, json.dumps(schema, sort_keys=True))
    try:
        errors = sorted(validator.iter_errors(value), key=_error_rank)
    except Unresolvable as exc:
        return None, [f"the output schema cannot be used: {_bounded(str(exc))}"]
    if errors:
        return None, [_bounded(_describe(error)) for error in errors[:_MAX_MESSAGES]]
    return value, []


def _unfenced(text: str) -> str:
    if text.startswith("```") and text.endswith("```") and "\n" in text:
        return text[text.index("\n") + 1 : -3].strip()
    return text


def _bounded(message: str) -> str:
    return message if len(message) <= _MAX_MESSAGE_CHARS else message[: _MAX_MESSAGE_CHARS - 1] + "…"
