"""MCP servers as a tool source, the pure parts: entries, schemas, specs, answers (workers.mcp)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from workers.contract import ToolCallRequest, ToolSpec
from workers.errors import McpConfigError, McpToolError, ToolDefinitionError
from workers.mcp.config import McpServer, build_server, merge_servers, parse_servers
from workers.mcp.results import build_result
from workers.mcp.schema import build_parameters
from workers.mcp.tool import build_tools, split_tool_name
from workers.mcp.watcher import RETRY_MAX_S, build_retry_delay_s
from workers.outcomes import ShownResult, build_success

STDIO = {"name": "fs", "command": ["npx", "-y", "server"]}


# --- entries -------------------------------------------------------------------------------------------


def test_a_stdio_and_an_http_entry_with_their_defaults() -> None:
    stdio, http = parse_servers(
        json.dumps([STDIO, {"name": "web", "url": "https://mcp.example/mcp", "headers": {"A": "b"}}])
    )
    assert (stdio.transport, stdio.queue_name, stdio.limits_s) == ("stdio", "mcp.fs", (30.0, 60.0))
    assert (http.transport, http.headers, http.describe()) == ("http", {"A": "b"}, "https://mcp.example/mcp")


@pytest.mark.parametrize(
    ("soft", "hard", "limits"), [(2, None, (2.0, 4.0)), (None, 3, (1.5, 3.0)), (1, 5, (1.0, 5.0))]
)
def test_limits_follow_as_for_tool(
    soft: float | None, hard: float | None, limits: tuple[float, float]
) -> None:
    server = build_server({**STDIO, "soft_time_limit": soft, "time_limit": hard}, "x")
    assert server.limits_s == limits


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "fs"}, 'give either "command"'),
        ({**STDIO, "url": "http://x/mcp"}, "not both"),
        ({**STDIO, "command": []}, "non-empty list"),
        ({"name": "w", "url": "ftp://x"}, "http:// or https://"),
        ({**STDIO, "headers": {"a": "b"}}, '"headers" is for a streamable HTTP server'),
        ({"name": "w", "url": "http://x", "env": {"a": "b"}}, '"env" is for a stdio server'),
        ({**STDIO, "name": "a__b"}, "is not valid"),
        ({**STDIO, "name": "fs_"}, "is not valid"),
        ({**STDIO, "soft_time_limit": 5, "time_limit": 5}, "must be less than time_limit"),
        ({**STDIO, "time_limit": 0}, '"time_limit": Input should be greater than 0'),
        ({**STDIO, "retries": -1}, '"retries"'),
        ({**STDIO, "sensitve": ["x"]}, '"sensitve": unknown setting'),
        ({**STDIO, "include": "read"}, '"include": Input should be a valid list'),
        ("fs", "must be a JSON object"),
    ],
)
def test_a_bad_entry_is_one_line_naming_it(entry: object, message: str) -> None:
    with pytest.raises(McpConfigError) as caught:
        parse_servers(json.dumps([STDIO | {"name": "ok"}, entry]))
    text = str(caught.value)
    assert text.startswith("TOOLLOOP_MCP_SERVERS[1]") and message in text and "\n" not in text
    if isinstance(entry, dict):
        assert repr(entry["name"]) in text
    assert isinstance(caught.value, ToolDefinitionError)


@pytest.mark.parametrize(("text", "message"), [("{", "is not valid JSON"), ('{"name": 1}', "JSON list")])
def test_a_bad_variable_is_one_line(text: str, message: str) -> None:
    with pytest.raises(McpConfigError, match=message):
        parse_servers(text)


def test_no_variable_no_server() -> None:
    assert parse_servers("") == [] and parse_servers(None) == [] and parse_servers("[]") == []


def test_one_name_twice_must_be_one_server() -> None:
    server = build_server(STDIO, "x")
    assert merge_servers([server], [server]) == [server]
    with pytest.raises(McpConfigError, match="defined twice"):
        merge_servers([server], [build_server({**STDIO, "retries": 2}, "x")])


# --- published specs -----------------------------------------------------------------------------------

LISTED: list[dict[str, Any]] = [
    {"name": "read_text", "description": "Read a text.", "inputSchema": {"type": "object"}},
    {"name": "search", "title": "Search", "inputSchema": {"type": "object", "properties": {"q": {}}}},
    {"name": "refund", "inputSchema": {}},
    {"name": "has space", "inputSchema": {}},
    {"name": "x" * 70, "inputSchema": {}},
]


def test_listed_tools_are_published_under_the_server_name_with_its_guardrails() -> None:
    server = build_server(
        {
            **STDIO,
            "soft_time_limit": 4,
            "queue": "mcp",
            "sensitive": ["search"],
            "requires_confirmation": ["refund"],
            "idempotent": ["read_text"],
            "retries": 2,
            "max_result_bytes": 100,
        },
        "x",
    )
    tools, skipped = build_tools(server, LISTED)
    specs = {tool.name: tool.spec for tool in tools}
    assert sorted(specs) == ["fs__read_text", "fs__refund", "fs__search"]
    assert len(skipped) == 2 and "'fs__has space'" in skipped[0]
    read = specs["fs__read_text"]
    assert (read.description, read.queue, read.soft_time_limit_s, read.time_limit_s) == (
        "Read a text.",
        "mcp",
        4.0,
        8.0,
    )
    assert (read.idempotency, read.retries, read.max_result_bytes, read.sensitive) == ("args", 2, 100, False)
    assert specs["fs__search"].description == "Search" and specs["fs__search"].sensitive
    assert specs["fs__refund"].requires_confirmation and not specs["fs__refund"].sensitive
    assert {tool.remote for tool in tools} == {"read_text", "search", "refund"}


def test_a_sensitive_word_in_the_name_hides_it_as_for_tool() -> None:
    tools, _ = build_tools(build_server(STDIO, "x"), [{"name": "write_file", "inputSchema": {}}])
    assert tools[0].spec.sensitive


@pytest.mark.parametrize(
    ("include", "exclude", "published"),
    [(None, [], 3), (["search", "nope"], [], 1), (None, ["search"], 2), (["search"], ["search"], 0)],
)
def test_include_then_exclude(include: list[str] | None, exclude: list[str], published: int) -> None:
    server = build_server({**STDIO, "include": include, "exclude": exclude}, "x")
    assert len(build_tools(server, LISTED)[0]) == published


def test_a_published_name_splits_back() -> None:
    assert split_tool_name("fs__read__file") == ("fs", "read__file")
    assert split_tool_name("plain") is None and split_tool_name("__x") is None


# --- schemas ---------------------------------------------------------------------------------------------

NESTED = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "title": "bookArguments",
    "$defs": {
        "Traveller": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
            "required": ["name"],
            "x-vendor": True,
        },
        "Node": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Node"}}},
    },
    "properties": {
        "travellers": {"type": "array", "items": {"$ref": "#/$defs/Traveller"}, "minItems": 1},
        "tree": {"$ref": "#/$defs/Node", "description": "A tree."},
        "when": {"type": "string", "format": "date", "if": {"const": "x"}, "then": {}},
        "remote": {"$ref": "https://example.com/schema.json"},
    },
    "required": ["travellers", "travellers", "ghost"],
    "anyOf": [{"required": ["travellers"]}],
}


def test_a_nested_schema_is_inlined_and_cleaned() -> None:
    params = build_parameters(NESTED)
    Draft202012Validator.check_schema(params)
    assert set(params) == {"type", "properties", "required"}
    assert params["required"] == ["travellers"]
    traveller = params["properties"]["travellers"]["items"]
    assert traveller == {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name"],
    }
    # A recursive type: inlined once, its reference to itself is any value.
    assert params["properties"]["tree"] == {
        "type": "object",
        "properties": {"child": {}},
        "description": "A tree.",
    }
    assert params["properties"]["when"] == {"type": "string", "format": "date"}
    assert params["properties"]["remote"] == {}
    assert "$ref" not in json.dumps(params) and "$defs" not in json.dumps(params)


@pytest.mark.parametrize("schema", [None, [], "object", {"type": "string"}, {"properties": 3}])
def test_anything_else_becomes_an_object(schema: object) -> None:
    assert build_parameters(schema) == {"type": "object", "properties": {}}


def test_a_schema_still_invalid_keeps_only_its_property_names() -> None:
    params = build_parameters({"type": "object", "properties": {"a": {"type": 3}, "b": {}}})
    assert params == {"type": "object", "properties": {"a": {}, "b": {}}}


def test_nothing_the_server_accepts_is_refused() -> None:
    params = build_parameters(NESTED)
    args = {"travellers": [{"name": "Ada"}], "tree": {"child": {"child": {}}}, "when": "x", "ghost": 1}
    assert not list(Draft202012Validator(NESTED).iter_errors(args))
    assert not list(Draft202012Validator(params).iter_errors(args))
    assert list(Draft202012Validator(params).iter_errors({"travellers": [{"age": 1}]}))


# --- answers ---------------------------------------------------------------------------------------------


def text(value: str) -> dict[str, str]:
    return {"type": "text", "text": value}


def test_text_blocks_are_the_result_and_the_content() -> None:
    assert build_result({"content": [text("a"), text("b")]}) == "a\nb"
    assert build_result({"content": []}) == ""


def test_structured_content_is_the_result_and_the_text_the_content() -> None:
    shown = build_result({"content": [text("21 °C")], "structuredContent": {"c": 21}})
    assert shown == ShownResult({"c": 21}, "21 °C")
    assert build_result({"content": [], "structuredContent": {"c": 21}}) == {"c": 21}


def test_is_error_raises_with_the_text() -> None:
    with pytest.raises(McpToolError, match=r"^disk full$"):
        build_result({"content": [text("disk full")], "isError": True})
    with pytest.raises(McpToolError, match="without saying what"):
        build_result({"content": [], "isError": True})


def test_other_blocks_keep_their_data_and_show_a_line_each() -> None:
    blocks = [
        text("see:"),
        {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
        {"type": "resource_link", "uri": "file:///a.txt", "name": "a"},
        {"type": "resource", "resource": {"uri": "file:///b", "text": "inline"}},
    ]
    shown = build_result({"content": blocks})
    assert isinstance(shown, ShownResult) and shown.result == blocks
    assert shown.content == "see:\n[image: image/png, 5 bytes]\n[resource: file:///a.txt]\ninline"


def request() -> ToolCallRequest:
    return ToolCallRequest(call_id="c1", tool="fs__w")


def test_a_shown_result_makes_the_envelope() -> None:
    spec = ToolSpec(name="fs__w", max_result_bytes=64)
    record = build_success(
        request(), spec, ShownResult({"c": 21}, "21 °C"), attempts=1, duration_ms=1, worker="w", finished_at=1
    )
    assert (record.outcome.result, record.outcome.content, record.outcome.truncated) == (
        {"c": 21},
        "21 °C",
        False,
    )


def test_a_shown_result_too_big_keeps_its_text_and_stores_the_result() -> None:
    spec = ToolSpec(name="fs__w", max_result_bytes=20)
    big = {"rows": list(range(20))}
    record = build_success(
        request(), spec, ShownResult(big, "20 rows"), attempts=1, duration_ms=1, worker="w", finished_at=1
    )
    assert record.outcome.truncated and record.outcome.result is None and record.outcome.content == "20 rows"
    assert record.full_result_json is not None and json.loads(record.full_result_json) == big


def test_the_lister_backs_off_up_to_its_cap() -> None:
    delays = [build_retry_delay_s(n) for n in range(1, 10)]
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0] and delays[-1] == RETRY_MAX_S
    assert delays == sorted(delays)


def test_an_entry_is_frozen() -> None:
    server: McpServer = build_server(STDIO, "x")
    with pytest.raises(ValueError, match="frozen"):
        server.name = "other"  # type: ignore[misc]
