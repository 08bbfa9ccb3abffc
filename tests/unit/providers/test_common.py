"""The shared normalising rules: arguments, finish reasons, usage, ids, names, SSE, error envelopes."""

from __future__ import annotations

import pytest

from orchestrator.model import ProviderError
from orchestrator.providers.body import build_error, decode_json, is_error_body
from orchestrator.providers.common import (
    IdSource,
    build_tool_call,
    clean_tool_name,
    is_retryable_status,
    parse_arguments,
    parse_finish_reason,
    parse_sse,
    parse_usage,
)


@pytest.mark.parametrize("raw", ['{"a": 1, "b": [1, {"c": null}]}', {"a": 1, "b": [1, {"c": None}]}])
def test_string_and_object_arguments_normalise_identically(raw: object) -> None:
    assert parse_arguments(raw).arguments == {"a": 1, "b": [1, {"c": None}]}


@pytest.mark.parametrize("raw", [None, "", "  ", "null", " null "])
def test_empty_and_null_arguments_mean_an_empty_dict(raw: object) -> None:
    parsed = parse_arguments(raw)
    assert parsed.arguments == {} and parsed.error is None


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("[1]", "array"),
        ("3", "number"),
        ('"s"', "string"),
        ("{bad", "not valid JSON"),
        ([1], "array"),
        (True, "boolean"),
    ],
)
def test_broken_arguments_keep_the_raw_text_and_say_why(raw: object, fragment: str) -> None:
    parsed = parse_arguments(raw)
    assert parsed.arguments == {} and parsed.raw is not None
    assert parsed.error is not None and fragment in parsed.error


def test_unicode_and_escaped_quotes_in_arguments() -> None:
    assert parse_arguments('{"q": "caf\\u00e9 \\"quoted\\""}').arguments == {"q": 'café "quoted"'}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("stop", "stop"),
        ("end_turn", "stop"),
        ("completed", "stop"),
        ("STOP", "stop"),
        ("tool_use", "tool_calls"),
        ("tool_calls", "tool_calls"),
        ("function_call", "tool_calls"),
        ("max_tokens", "length"),
        ("length", "length"),
        ("max_output_tokens", "length"),
        ("MAX_TOKENS", "length"),
        ("content_filter", "content_filter"),
        ("SAFETY", "content_filter"),
        ("refusal", "content_filter"),
        ("something_new", "unknown"),
        (154829, "unknown"),
        (None, None),
        ("", None),
    ],
)
def test_finish_reason_mapping(raw: object, expected: str | None) -> None:
    assert parse_finish_reason(raw) == expected


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 3, "completion_tokens": 4}, (3, 4, 7)),
        ({"input_tokens": 3, "output_tokens": 4, "total_tokens": 9}, (3, 4, 9)),
        ({"promptTokenCount": 3, "candidatesTokenCount": 4}, (3, 4, 7)),
        ({"inputTokens": 3, "outputTokens": 4}, (3, 4, 7)),
        ({"prompt_eval_count": 3, "eval_count": 4}, (3, 4, 7)),
        ({"prompt_tokens": "3", "completion_tokens": -4, "total_tokens": True}, (0, 0, 0)),
        (None, (0, 0, 0)),
    ],
)
def test_usage_mapping(usage: object, expected: tuple[int, int, int]) -> None:
    parsed = parse_usage(usage)
    assert (parsed.input_tokens, parsed.output_tokens, parsed.total_tokens) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("search<|channel|>commentary", "search"),
        ("get_weather", "get_weather"),
        (" lookup ", "lookup"),
        ("fn<|call|>", "fn"),
        (None, ""),
    ],
)
def test_leaked_special_tokens_are_cut(raw: object, expected: str) -> None:
    assert clean_tool_name(raw) == expected


def test_ids_are_unique_across_responses_and_never_empty() -> None:
    ids = IdSource()
    made = [ids.ensure(None), ids.ensure(""), ids.ensure("   "), ids.ensure("call_1"), ids.ensure("call_1")]
    assert all(made) and len(set(made)) == 5
    assert made[3] == "call_1"
    assert IdSource().next_id() != IdSource().next_id()


def test_build_tool_call() -> None:
    call = build_tool_call(IdSource(), "", "f<|x|>", '{"a": 1}')
    assert (call.name, call.arguments, call.raw_arguments) == ("f", {"a": 1}, '{"a": 1}') and call.id


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 529, None])
def test_retryable_statuses(status: int | None) -> None:
    assert is_retryable_status(status)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_final_statuses(status: int) -> None:
    assert not is_retryable_status(status)


def test_sse_lf_crlf_comments_and_multiline_data() -> None:
    body = ": keep-alive\r\nevent: a\r\ndata: one\r\ndata: two\r\n\r\nid: 7\ndata: three\n\n"
    assert [(e.event, e.data) for e in parse_sse(body)] == [("a", "one\ntwo"), (None, "three")]


def test_decode_json_says_when_a_body_was_cut_off() -> None:
    cut = decode_json('{"choices": [', "x")
    broken = decode_json("{nope}", "x")
    assert isinstance(cut, ProviderError) and cut.retryable and "truncated" in cut.message
    assert isinstance(broken, ProviderError) and not broken.retryable


def test_error_envelopes() -> None:
    plain = build_error("p", 502, "<html>Bad gateway</html>")
    assert (plain.status, plain.retryable, plain.message) == (502, True, "<html>Bad gateway</html>")
    empty = build_error("p", 503, b"")
    assert empty.message == "HTTP 503" and empty.retryable
    with_headers = build_error(
        "p", 429, {"error": {"message": "slow"}}, {"Retry-After": "7", "request-id": "req_1"}
    )
    assert (with_headers.retry_after_s, with_headers.request_id) == (7.0, "req_1")
    millis = build_error("p", 429, {}, {"retry-after-ms": "1500"})
    assert millis.retry_after_s == 1.5


def test_is_error_body() -> None:
    assert is_error_body({"error": {"message": "x"}})
    assert is_error_body({"type": "error", "error": {}})
    assert not is_error_body({"object": "response", "error": None})
    assert not is_error_body({"choices": [], "error": {"message": "x"}})
