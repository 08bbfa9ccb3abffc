"""The preview of a refused message (`workers.poison.build_preview`) and the checks that refuse it: ids show,
no argument value, context value or repr ever does, and the line stays bounded."""

from __future__ import annotations

import json
from typing import Any

import pytest

from workers.contract import ToolSpec
from workers.poison import (
    PREVIEW_MAX_CHARS,
    RefusalReason,
    TaskMessage,
    build_preview,
    find_named_call,
    inspect_envelope,
    inspect_task_message,
    parse_envelope,
)

pytestmark = pytest.mark.timeout(10)

SECRET = "sk-live-0123456789"
HEADERS = {
    "task": "tool.add",
    "id": "t1:r1:c0:a1",
    "toolloop_call_id": "t1:c0",
    "toolloop_turn_id": "t1",
    "kwargsrepr": json.dumps({"arguments": {"api_key": SECRET}}),
    "argsrepr": SECRET,
}


def _body(**kwargs: Any) -> list[Any]:
    return [[], kwargs, {"callbacks": None}]


def test_ids_show_and_values_do_not() -> None:
    body = _body(
        call_id="t1:c0",
        tool="add",
        turn_id="t1",
        arguments={"a": SECRET, "nested": [{"deep": SECRET}], "n": 12345678},
        context={"user": SECRET},
    )
    preview = build_preview(HEADERS, body)
    assert SECRET not in preview and "12345678" not in preview
    assert '"toolloop_call_id":"t1:c0"' in preview and '"task":"tool.add"' in preview
    assert '"tool":"add"' in preview and '"a":"<str 18>"' in preview and '"n":"<number>"' in preview
    assert '"kwargsrepr":"<str' in preview


def test_a_safe_key_deep_in_the_arguments_shows_no_value_either_way_it_is_typed() -> None:
    # An argument named like an id is still an argument: only scalars under safe keys show, and they are ids.
    preview = build_preview({}, _body(arguments={"payload": {"token": SECRET}}))
    assert SECRET not in preview


def test_a_body_that_is_not_json_shows_only_its_size() -> None:
    raw = b"\x80\x04password=" + SECRET.encode()
    preview = build_preview(None, raw)
    assert SECRET not in preview and "password" not in preview
    assert preview == f"headers=null body=<{len(raw)} bytes, not JSON>"


def test_the_preview_is_bounded() -> None:
    huge = _body(arguments={f"k{i}": "x" * 10_000 for i in range(1000)})
    preview = build_preview({f"h{i}": i for i in range(1000)}, huge)
    assert len(preview) <= PREVIEW_MAX_CHARS and '"…":"<988 more>"' in preview
    long_keys = {("k" * 30) + str(i): [[["deep"]]] for i in range(10)}
    cut = build_preview(long_keys, [long_keys, long_keys])
    assert len(cut) == PREVIEW_MAX_CHARS and cut.endswith("…")


def test_the_named_call_comes_from_headers_then_kwargs() -> None:
    call = find_named_call(HEADERS, _body(call_id="other", tool="add", attempt=2))
    assert call is not None and (call.call_id, call.turn_id, call.tool, call.attempt) == (
        "t1:c0",
        "t1",
        "add",
        2,
    )
    assert find_named_call({"task": "tool.add"}, {"a": 1}) is None
    from_kwargs = find_named_call({"task": "tool.add"}, _body(call_id="c9", attempt="x"))
    assert from_kwargs is not None and (from_kwargs.call_id, from_kwargs.tool, from_kwargs.attempt) == (
        "c9",
        "add",
        1,
    )


def _inspect(body: Any, headers: dict[str, Any] | None = None, content_type: str = "application/json") -> Any:
    raw = json.dumps(body).encode()
    message = TaskMessage(
        headers=HEADERS if headers is None else headers,
        body=raw,
        content_type=content_type,
        content_encoding="utf-8",
        decode=lambda: json.loads(raw),
    )
    return inspect_task_message(
        message, is_registered=lambda name: name == "tool.add", spec_of=lambda _: ToolSpec(name="add")
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"a": 1}, RefusalReason.BAD_BODY),
        ([[], {}], RefusalReason.BAD_BODY),
        ([[1], {"call_id": "c", "tool": "add"}, {}], RefusalReason.BAD_BODY),
        ([[], {"call_id": "c", "tool": "add"}, []], RefusalReason.BAD_BODY),
        ([[], {"a": 1}, {}], RefusalReason.BAD_REQUEST),
        ([[], {"call_id": "c", "tool": "subtract"}, {}], RefusalReason.BAD_REQUEST),
        (
            [[], {"call_id": "c", "tool": "add", "arguments": {"pad": "x" * 1_300_000}}, {}],
            RefusalReason.TOO_LARGE,
        ),
    ],
)
def test_bodies_celery_or_the_task_could_not_take_are_refused(body: Any, reason: RefusalReason) -> None:
    refusal = _inspect(body)
    assert refusal is not None and refusal.reason is reason
    assert refusal.call is not None and refusal.call.call_id == "t1:c0"


def test_a_good_call_passes() -> None:
    assert _inspect([[], {"call_id": "t1:c0", "tool": "add", "arguments": {"a": 1, "b": 2}}, {}]) is None


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, RefusalReason.PROTOCOL),
        ({**HEADERS, "id": ["x"]}, RefusalReason.BAD_HEADERS),
        ({**HEADERS, "retries": "1"}, RefusalReason.BAD_HEADERS),
        ({**HEADERS, "timelimit": [1, 2, 3]}, RefusalReason.BAD_HEADERS),
        ({**HEADERS, "expires": "soon"}, RefusalReason.BAD_HEADERS),
        ({**HEADERS, "task": "os.system"}, RefusalReason.UNKNOWN_TASK),
    ],
)
def test_headers_celery_could_not_read_are_refused(headers: dict[str, Any], reason: RefusalReason) -> None:
    refusal = _inspect([[], {"call_id": "c", "tool": "add"}, {}], headers=headers)
    assert refusal is not None and refusal.reason is reason


def test_a_pickle_is_refused_unread() -> None:
    refusal = _inspect([[], {}, {}], content_type="application/x-python-serialize")
    assert refusal is not None and refusal.reason is RefusalReason.CONTENT_TYPE


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"garbage", RefusalReason.NOT_JSON),
        (b"[1]", RefusalReason.BAD_ENVELOPE),
        (json.dumps({"properties": {}}), RefusalReason.BAD_ENVELOPE),
        (
            json.dumps({"body": "!!!", "properties": {"delivery_tag": "d", "body_encoding": "base64"}}),
            RefusalReason.BAD_ENVELOPE,
        ),
        (json.dumps({"headers": [1], "properties": {"delivery_tag": "d"}}), RefusalReason.PROTOCOL),
    ],
)
def test_list_items_kombu_could_not_read_are_refused(raw: bytes | str, reason: RefusalReason) -> None:
    payload, refusal = parse_envelope(raw)
    assert payload is None and refusal is not None and refusal.reason is reason


def test_kombus_own_envelope_passes() -> None:
    envelope = {
        "body": "e30=",
        "headers": HEADERS,
        "properties": {"delivery_tag": "d", "body_encoding": "base64"},
    }
    assert inspect_envelope(envelope) is None
