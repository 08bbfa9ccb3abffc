"""Pre-dispatch validation and the offered set of tools."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.machine.validation import Rejection, offered_tools, validate_call
from workers.contract import FailureKind, ToolSpec

ADD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


def _catalogue() -> dict[str, ToolSpec]:
    return {
        "add": ToolSpec(name="add", parameters=ADD_SCHEMA, max_args_bytes=200),
        "weather": ToolSpec(name="weather"),
        "delete_user": ToolSpec(name="delete_user", sensitive=True),
    }


def test_offered_none_means_every_public_tool() -> None:
    assert sorted(offered_tools(_catalogue(), None)) == ["add", "weather"]


def test_offered_named_includes_sensitive_only_when_named() -> None:
    assert sorted(offered_tools(_catalogue(), ["delete_user", "add", "missing"])) == ["add", "delete_user"]
    assert offered_tools(_catalogue(), []) == {}


def _validate(
    name: str, args: dict[str, Any], error: str | None = None, requested: list[str] | None = None
) -> Rejection | None:
    catalogue = _catalogue()
    return validate_call(name, args, error, catalogue, offered_tools(catalogue, requested))


def test_valid_call_passes() -> None:
    assert _validate("add", {"a": 1, "b": 2}) is None


def test_unknown_tool_lists_only_offered_tools_sorted() -> None:
    rejection = _validate("nope", {})
    assert rejection == Rejection(FailureKind.NOT_FOUND, "unknown tool 'nope'; available: add, weather")


def test_unknown_tool_with_nothing_offered() -> None:
    rejection = _validate("nope", {}, requested=[])
    assert rejection is not None
    assert rejection.message == "unknown tool 'nope'; available: none"


def test_hidden_sensitive_tool_is_not_allowed_and_never_listed() -> None:
    rejection = _validate("delete_user", {})
    assert rejection is not None
    assert rejection.kind is FailureKind.NOT_ALLOWED
    assert "delete_user" in rejection.message
    unknown = _validate("x", {})
    assert unknown is not None and "delete_user" not in unknown.message


def test_known_but_not_in_allowlist_is_not_allowed() -> None:
    rejection = _validate("weather", {}, requested=["add"])
    assert rejection is not None and rejection.kind is FailureKind.NOT_ALLOWED


def test_arguments_error_is_validation() -> None:
    rejection = _validate("add", {}, error="Expecting value: line 1 column 1")
    assert rejection is not None
    assert rejection.kind is FailureKind.VALIDATION
    assert "Expecting value" in rejection.message


def test_schema_messages_order_missing_unknown_type() -> None:
    rejection = _validate("add", {"a": "x", "zzz": 1})
    assert rejection is not None and rejection.kind is FailureKind.VALIDATION
    message = rejection.message
    missing = message.index("'b' is a required property")
    unknown = message.index("'zzz' was unexpected")
    wrong_type = message.index("'x' is not of type 'integer'")
    assert missing < unknown < wrong_type
    assert "a: 'x' is not of type" in message


@pytest.mark.parametrize("size", [300, 5_000_000])
def test_oversized_arguments_are_payload_limit_before_schema(size: int) -> None:
    rejection = _validate("add", {"a": "é" * size})
    assert rejection is not None
    assert rejection.kind is FailureKind.PAYLOAD_LIMIT
    assert "limit is 200" in rejection.message
    # UTF-8 bytes, not characters: "é" is two bytes.
    assert str(2 * size + len('{"a":""}')) in rejection.message


def test_schema_change_under_same_name_is_honoured() -> None:
    catalogue = {"add": ToolSpec(name="add", parameters=ADD_SCHEMA)}
    assert validate_call("add", {"a": 1, "b": 2}, None, catalogue, catalogue) is None
    loose = {"add": ToolSpec(name="add", parameters={"type": "object", "required": ["c"]})}
    rejection = validate_call("add", {"a": 1, "b": 2}, None, loose, loose)
    assert rejection is not None and "'c' is a required property" in rejection.message
