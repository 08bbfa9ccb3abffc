"""Model controls on the Anthropic wire: the system prompt, every setting (extended thinking for
`reasoning_effort`), the answer tool of an output schema and its answer read back — plain and streamed,
through the HTTP client — and prompt-caching breakpoints with the cached tokens in usage."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from orchestrator.model import (
    AssistantMessage,
    ModelSettings,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Turn,
    UserMessage,
)
from orchestrator.providers import anthropic
from orchestrator.providers.base import HttpModelClient, ModelRequest
from orchestrator.providers.deltas import Delta, TextDelta, ToolCallDelta
from orchestrator.providers.structured import ANSWER_TOOL
from workers.contract import ToolSpec

TOOL = ToolSpec(
    name="add", description="Add.", parameters={"type": "object", "properties": {"a": {"type": "number"}}}
)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city"],
}
EPHEMERAL = {"type": "ephemeral"}
THINKING = {"type": "thinking", "thinking": "hmm", "signature": "sig"}


def request(**fields: Any) -> ModelRequest:
    base: dict[str, Any] = {"model": "claude-sonnet-4-5", "messages": [UserMessage(content="hi")]}
    return ModelRequest(**{**base, "prompt_cache": False, **fields})


def test_instructions_come_first_in_system_with_the_historys_system_messages_after() -> None:
    messages = [SystemMessage(content="From history."), UserMessage(content="hi")]
    body = anthropic.to_wire(request(instructions="Be terse.", messages=messages))
    assert body["system"] == "Be terse.\n\nFrom history."
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    alone = anthropic.to_wire(request(instructions="Be terse."))
    assert alone["system"] == "Be terse."


def test_every_setting_anthropic_has_is_mapped() -> None:
    settings = ModelSettings(
        temperature=0.3, top_p=0.8, max_output_tokens=900, stop=["END"], parallel_tool_calls=False
    )
    body = anthropic.to_wire(request(settings=settings, tools=[TOOL], max_output_tokens=50))
    assert {k: body[k] for k in ("temperature", "top_p", "max_tokens", "stop_sequences")} == {
        "temperature": 0.3,
        "top_p": 0.8,
        "max_tokens": 900,
        "stop_sequences": ["END"],
    }
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert "seed" not in body and "thinking" not in body
    forced = anthropic.to_wire(request(settings=settings, tools=[TOOL], tool_choice="required"))
    assert forced["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    none = anthropic.to_wire(request(settings=settings, tools=[TOOL], tool_choice="none"))
    assert none["tool_choice"] == {"type": "none"}
    assert anthropic.to_wire(request(max_output_tokens=50))["max_tokens"] == 50
    assert anthropic.to_wire(request())["max_tokens"] == anthropic.DEFAULT_MAX_TOKENS


@pytest.mark.parametrize(
    ("effort", "max_output_tokens", "budget", "max_tokens"),
    [
        ("minimal", None, 1024, 1024 + 4096),
        ("low", None, 2048, 2048 + 4096),
        ("medium", None, 8192, 8192 + 4096),
        ("high", None, 16384, 16384 + 4096),
        ("high", 3000, 1976, 3000),
        ("medium", 1500, 1024, 1500),
    ],
)
def test_reasoning_effort_is_a_thinking_budget_below_max_tokens(
    effort: Any, max_output_tokens: int | None, budget: int, max_tokens: int
) -> None:
    settings = ModelSettings(reasoning_effort=effort, max_output_tokens=max_output_tokens)
    body = anthropic.to_wire(request(settings=settings))
    assert body["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert body["max_tokens"] == max_tokens
    assert body["thinking"]["budget_tokens"] < body["max_tokens"]


def test_extra_is_merged_last() -> None:
    settings = ModelSettings(reasoning_effort="low", extra={"top_k": 5, "thinking": {"type": "disabled"}})
    body = anthropic.to_wire(request(settings=settings))
    assert (body["top_k"], body["thinking"]) == (5, {"type": "disabled"})


# --- output schema: the answer tool -----------------------------------------------------------------------


def test_an_output_schema_alone_is_a_forced_answer_tool() -> None:
    body = anthropic.to_wire(request(output_schema=SCHEMA))
    (tool,) = body["tools"]
    assert (tool["name"], tool["input_schema"]) == (ANSWER_TOOL, SCHEMA)
    assert "final answer" in tool["description"]
    assert body["tool_choice"] == {"type": "tool", "name": ANSWER_TOOL}
    # Tools offered but none may be called: only the answer may be given.
    none = anthropic.to_wire(request(output_schema=SCHEMA, tools=[TOOL], tool_choice="none"))
    assert none["tool_choice"] == {"type": "tool", "name": ANSWER_TOOL}


def test_beside_other_tools_or_with_thinking_the_answer_tool_is_offered_not_forced() -> None:
    body = anthropic.to_wire(request(output_schema=SCHEMA, tools=[TOOL]))
    assert [t["name"] for t in body["tools"]] == ["add", ANSWER_TOOL]
    assert "tool_choice" not in body
    required = anthropic.to_wire(request(output_schema=SCHEMA, tools=[TOOL], tool_choice="required"))
    assert required["tool_choice"] == {"type": "any"}
    thinking = anthropic.to_wire(
        request(output_schema=SCHEMA, settings=ModelSettings(reasoning_effort="low"))
    )
    assert thinking["tool_choice"] == {"type": "auto"}


def message(*content: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": list(content),
        "stop_reason": "tool_use",
        "usage": usage or {"input_tokens": 10, "output_tokens": 5},
    }


def client_answering(body: object, *, sse: str | None = None) -> HttpModelClient:
    def answer(http_request: httpx.Request) -> httpx.Response:
        if sse is not None:
            return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=body)

    http = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    return HttpModelClient("anthropic", anthropic, http, "http://anthropic.test/v1/messages")


ANSWER = {"city": "Lyon", "population": 520000}


async def test_a_call_of_the_answer_tool_is_the_final_answer_with_its_json_as_text() -> None:
    body = message(
        {"type": "text", "text": "Here it is."},
        {"type": "tool_use", "id": "toolu_1", "name": ANSWER_TOOL, "input": ANSWER},
    )
    turn = await client_answering(body).complete(request(output_schema=SCHEMA, stream=False))
    assert isinstance(turn, Turn)
    assert (turn.type, turn.tool_calls, turn.finish_reason) == ("final_answer", [], "stop")
    assert json.loads(turn.text or "") == ANSWER
    # Beside another call, the answer wins: the model said it was done.
    both = message(
        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}},
        {"type": "tool_use", "id": "toolu_2", "name": ANSWER_TOOL, "input": ANSWER},
    )
    turn = await client_answering(both).complete(request(output_schema=SCHEMA, tools=[TOOL], stream=False))
    assert isinstance(turn, Turn) and turn.type == "final_answer" and json.loads(turn.text or "") == ANSWER
    # Without an output schema the name means nothing special.
    plain = await client_answering(both).complete(request(tools=[TOOL], stream=False))
    assert isinstance(plain, Turn) and [c.name for c in plain.tool_calls] == ["add", ANSWER_TOOL]


def sse(*events: dict[str, Any]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


ANSWER_STREAM = sse(
    {
        "type": "message_start",
        "message": {
            **message(),
            "usage": {"input_tokens": 3, "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 150},
        },
    },
    {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "tool_use", "id": "toolu_1", "name": ANSWER_TOOL, "input": {}},
    },
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "input_json_delta", "partial_json": '{"city": '},
    },
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "input_json_delta", "partial_json": '"Lyon"}'},
    },
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 12}},
    {"type": "message_stop"},
)


async def test_a_streamed_answer_tool_streams_its_json_as_text_and_is_never_announced_as_a_call() -> None:
    deltas: list[Delta] = []

    async def sink(delta: Delta) -> None:
        deltas.append(delta)

    turn = await client_answering(None, sse=ANSWER_STREAM).complete(request(output_schema=SCHEMA), sink)
    assert isinstance(turn, Turn)
    assert (turn.type, turn.tool_calls, turn.text) == ("final_answer", [], '{"city": "Lyon"}')
    assert not any(isinstance(d, ToolCallDelta) for d in deltas)
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == turn.text
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (3, 12)
    assert (turn.usage.cache_read_tokens, turn.usage.cache_write_tokens) == (2000, 150)


# --- prompt caching ---------------------------------------------------------------------------------------


def conversation() -> list[Any]:
    call = ToolCall(id="toolu_1", name="add", arguments={"a": 1})
    return [
        SystemMessage(content="From history."),
        UserMessage(content="add"),
        AssistantMessage(
            content="Adding.",
            tool_calls=[call],
            provider="anthropic",
            provider_data={"thinking_blocks": [THINKING]},
        ),
        ToolMessage(tool_call_id="toolu_1", name="add", content="1"),
    ]


def breakpoints(body: dict[str, Any]) -> list[str]:
    found = [f"system[{i}]" for i, b in enumerate(body.get("system") or []) if "cache_control" in b]
    found += [f"tools[{i}]" for i, t in enumerate(body.get("tools", [])) if "cache_control" in t]
    for i, entry in enumerate(body["messages"]):
        found += [f"messages[{i}][{j}]" for j, b in enumerate(entry["content"]) if "cache_control" in b]
    return found


def test_cache_breakpoints_on_instructions_last_tool_and_the_stable_prefix() -> None:
    body = anthropic.to_wire(
        request(instructions="Be terse.", messages=conversation(), tools=[TOOL], prompt_cache=True)
    )
    assert body["system"] == [
        {"type": "text", "text": "Be terse.\n\nFrom history.", "cache_control": EPHEMERAL}
    ]
    assert body["tools"][-1]["cache_control"] == EPHEMERAL
    # The stable prefix ends with the assistant's turn, before the newest tool results; thinking blocks
    # cannot carry a breakpoint, so it goes on the message's last other block.
    assert breakpoints(body) == ["system[0]", "tools[0]", "messages[1][2]"]
    assert body["messages"][1]["content"][2]["type"] == "tool_use"
    assert len(breakpoints(body)) <= 4
    with_answer = anthropic.to_wire(
        request(messages=conversation(), tools=[TOOL], output_schema=SCHEMA, prompt_cache=True)
    )
    assert breakpoints(with_answer) == ["system[0]", "tools[1]", "messages[1][2]"]


def test_a_first_call_caches_what_it_has_and_prompt_cache_off_marks_nothing() -> None:
    first = anthropic.to_wire(request(instructions="Be terse.", tools=[TOOL], prompt_cache=True))
    assert breakpoints(first) == ["system[0]", "tools[0]"]
    bare = anthropic.to_wire(request(prompt_cache=True))
    assert breakpoints(bare) == []
    by_default = anthropic.to_wire(ModelRequest(model="claude", messages=conversation()))
    assert breakpoints(by_default) == ["system[0]", "messages[1][2]"]
    off = anthropic.to_wire(
        request(instructions="x", messages=conversation(), tools=[TOOL], prompt_cache=False)
    )
    assert breakpoints({**off, "system": []}) == [] and off["system"] == "x\n\nFrom history."
    assert "cache_control" not in json.dumps(off)


def test_caching_leaves_the_callers_history_untouched() -> None:
    history = conversation()
    before = [m.model_dump() for m in history]
    anthropic.to_wire(request(messages=history, tools=[TOOL], prompt_cache=True))
    assert [m.model_dump() for m in history] == before
    assert "cache_control" not in json.dumps(THINKING)
