"""The scripted model: the pure brain, its wire format (checked against OpenAI's OpenAPI) and its server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from orchestrator.providers.scripted.brain import build_reply, find_plan
from orchestrator.providers.scripted.server import ScriptedServer
from orchestrator.providers.scripted.wire import build_stream_chunks
from tests.openapi_schemas import assert_valid

ADD = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}


def tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


DEMO_TOOLS = [tool("add", ADD), tool("multiply", ADD), tool("get_weather", WEATHER)]


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant_calls(*calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, n, a in calls
        ],
    }


def tool_result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def message_of(reply_body: dict[str, Any]) -> dict[str, Any]:
    return dict(reply_body["choices"][0]["message"])


def arguments_of(message: dict[str, Any]) -> list[tuple[str, object]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]


def test_demo_calls_the_offered_tools_in_parallel_with_the_prompts_numbers() -> None:
    reply = build_reply(
        {"model": "demo", "messages": [user("What is 12 plus 30, and 12 times 30?")], "tools": DEMO_TOOLS}
    )
    assert reply.status == 200
    message = message_of(reply.body)
    assert arguments_of(message) == [("add", {"a": 12, "b": 30}), ("multiply", {"a": 12, "b": 30})]
    assert reply.body["choices"][0]["finish_reason"] == "tool_calls"
    ids = [c["id"] for c in message["tool_calls"]]
    assert len(set(ids)) == 2
    assert reply.body["usage"]["total_tokens"] > 0


def test_demo_reads_argument_names_from_the_schema() -> None:
    tools = [
        tool("add", {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}})
    ]
    tools.append(tool("get_weather", {"type": "object", "properties": {"location": {"type": "string"}}}))
    reply = build_reply(
        {
            "model": "scripted:demo",
            "messages": [user("Tell me the weather in Oslo, and 6 plus 7")],
            "tools": tools,
        }
    )
    assert arguments_of(message_of(reply.body)) == [
        ("add", {"x": 6, "y": 7}),
        ("get_weather", {"location": "Oslo"}),
    ]


def play_demo(
    prompt: str, tools: list[dict[str, Any]], answers: dict[str, str]
) -> tuple[list[list[Any]], str]:
    """Run the demo model to its final answer, each call answered from `answers` (tool name → content, with
    `{a}` and `{b}` standing for the call's arguments): the calls of each round, and the final text."""
    compute = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b}
    messages: list[dict[str, Any]] = [user(prompt)]
    rounds: list[list[Any]] = []
    for _ in range(10):
        message = message_of(build_reply({"model": "demo", "messages": messages, "tools": tools}).body)
        messages.append(message)
        if not message.get("tool_calls"):
            return rounds, message["content"]
        rounds.append(arguments_of(message))
        for call in message["tool_calls"]:
            name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"])
            content = answers.get(name) or json.dumps(float(compute[name](arguments["a"], arguments["b"])))
            messages.append(tool_result(call["id"], content))
    raise AssertionError(f"no final answer after 10 rounds: {rounds}")


ARITHMETIC_TOOLS = [tool(name, ADD) for name in ("add", "subtract", "multiply", "divide")]


def test_demo_computes_a_continued_clause_in_two_rounds() -> None:
    rounds, text = play_demo("What is 2+3, times 4?", ARITHMETIC_TOOLS, {})
    assert rounds == [[("add", {"a": 2, "b": 3})], [("multiply", {"a": 5, "b": 4})]]
    assert text.startswith("(2 + 3) × 4 = 20\n")
    assert "- multiply(a=5, b=4) → 20.0" in text


@pytest.mark.parametrize(
    ("prompt", "first_round", "answer"),
    [
        (
            "What is 2*3 + 4*5?",
            [("multiply", {"a": 2, "b": 3}), ("multiply", {"a": 4, "b": 5})],
            "2 × 3 + 4 × 5 = 26",
        ),
        ("(1+2) x (3+4)", [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})], "(1 + 2) × (3 + 4) = 21"),
        ("What is -3 plus 5?", [("add", {"a": -3, "b": 5})], "-3 + 5 = 2"),
        ("What is 5, minus 3?", [("subtract", {"a": 5, "b": 3})], "5 - 3 = 2"),
        ("10 minus 2 minus 3", [("subtract", {"a": 10, "b": 2})], "10 - 2 - 3 = 5"),
        ("What is 4 multiplied by 2.5?", [("multiply", {"a": 4, "b": 2.5})], "4 × 2.5 = 10"),
    ],
)
def test_demo_follows_precedence_and_calls_what_it_can_in_parallel(
    prompt: str, first_round: list[Any], answer: str
) -> None:
    rounds, text = play_demo(prompt, ARITHMETIC_TOOLS, {})
    assert rounds[0] == first_round
    assert text.splitlines()[0] == answer


def test_demo_reports_a_failed_call_and_a_tool_the_turn_does_not_offer() -> None:
    _, text = play_demo(
        "What is 1/0?", ARITHMETIC_TOOLS, {"divide": "Error: ZeroDivisionError: division by zero"}
    )
    assert (
        text.splitlines()[0] == "1 ÷ 0: divide(a=1, b=0) answered Error: ZeroDivisionError: division by zero"
    )
    rounds, text = play_demo("What is 2+3, times 4?", [tool("add", ADD)], {})
    assert rounds == [[("add", {"a": 2, "b": 3})]]
    assert text.splitlines()[0] == "(2 + 3) × 4: the multiply tool is not offered in this turn"


def test_demo_states_the_tool_results_in_its_final_answer() -> None:
    messages = [
        user("What is 2 plus 3, and 2 times 3?"),
        assistant_calls(("c1", "add", {"a": 2, "b": 3}), ("c2", "multiply", {"a": 2, "b": 3})),
        tool_result("c1", "5"),
        tool_result("c2", "6"),
    ]
    reply = build_reply({"model": "demo", "messages": messages, "tools": DEMO_TOOLS})
    message = message_of(reply.body)
    assert "tool_calls" not in message
    assert message["content"].startswith("2 + 3 = 5\n2 × 3 = 6\n")
    assert "add(a=2, b=3) → 5" in message["content"]
    assert "multiply(a=2, b=3) → 6" in message["content"]
    assert reply.body["choices"][0]["finish_reason"] == "stop"


def test_demo_with_no_fitting_tool_answers_in_text() -> None:
    for prompt in ("hello", "3 and 4"):
        content = message_of(build_reply({"model": "demo", "messages": [user(prompt)]}).body)["content"]
        assert "No demo tool fits" in content and "What is 2+3, times 4?" in content


def test_echo_repeats_the_last_user_message() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        user("first"),
        user([{"type": "text", "text": "hi"}]),
    ]
    assert message_of(build_reply({"model": "echo", "messages": messages}).body)["content"] == "hi"


PLAN = {
    "plan": [
        {
            "calls": [
                {"name": "add", "arguments": {"a": 1, "b": 2}},
                {"name": "slow", "arguments_raw": "{oops"},
            ]
        },
        {"text": "all done"},
    ]
}


def plan_request(plan: dict[str, Any], *rest: dict[str, Any]) -> dict[str, Any]:
    return {"model": "plan", "messages": [user("Follow this: " + json.dumps(plan)), *rest]}


def test_plan_round_zero_sends_parallel_calls_including_broken_argument_text() -> None:
    message = message_of(build_reply(plan_request(PLAN)).body)
    calls = message["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["add", "slow"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert calls[1]["function"]["arguments"] == "{oops"
    assert [c["id"] for c in calls] == ["call_r0_0", "call_r0_1"]


def test_plan_round_is_the_number_of_assistant_messages_and_past_the_end_summarises() -> None:
    history = [assistant_calls(("call_r0_0", "add", {"a": 1, "b": 2})), tool_result("call_r0_0", "3")]
    assert message_of(build_reply(plan_request(PLAN, *history)).body)["content"] == "all done"
    past = [*history, {"role": "assistant", "content": "all done"}, user("and now?")]
    text = message_of(build_reply(plan_request(PLAN, *past)).body)["content"]
    assert "add(a=1, b=2) → 3" in text


def test_plan_repeat_on_the_last_round_repeats_it_with_fresh_ids() -> None:
    plan = {"plan": [{"calls": [{"name": "add", "arguments": {"a": 1, "b": 1}}], "repeat": True}]}
    history: list[dict[str, Any]] = []
    seen_ids = set()
    for round_number in range(4):
        message = message_of(build_reply(plan_request(plan, *history)).body)
        call_id = message["tool_calls"][0]["id"]
        assert call_id == f"call_r{round_number}_0"
        seen_ids.add(call_id)
        history += [message, tool_result(call_id, "2")]
    assert len(seen_ids) == 4


def test_plan_error_round_answers_openai_error_format_with_retry_after() -> None:
    plan = {"plan": [{"error": {"status": 429, "message": "slow down", "retry_after": 1}}]}
    reply = build_reply(plan_request(plan))
    assert reply.status == 429
    assert reply.headers == {"retry-after": "1"}
    assert reply.body == {
        "error": {"message": "slow down", "type": "invalid_request_error", "param": None, "code": None}
    }
    assert build_reply(plan_request(plan), attempt=5).status == 429  # no `times`: fails every time


def test_plan_error_with_times_lets_the_retry_through_to_the_next_round() -> None:
    plan = {"plan": [{"error": {"status": 500, "message": "boom", "times": 2}}, {"text": "recovered"}]}
    assert [build_reply(plan_request(plan), attempt=a).status for a in range(3)] == [500, 500, 200]
    assert message_of(build_reply(plan_request(plan), attempt=2).body)["content"] == "recovered"
    assert build_reply(plan_request(plan)).body["error"]["type"] == "server_error"


def test_find_plan_skips_other_braces_and_requires_a_list() -> None:
    assert find_plan('x {not json} {"plan": 3} then {"plan": [{"text": "a"}]}') == [{"text": "a"}]
    assert find_plan("no plan here") is None


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": "nope", "messages": [user("x")]}, 404),
        ({"model": "demo", "messages": []}, 400),
        (["not", "an", "object"], 400),
        ({"model": "plan", "messages": [user("no plan")]}, 400),
    ],
)
def test_bad_requests_get_openai_error_bodies(body: object, status: int) -> None:
    reply = build_reply(body)
    assert reply.status == status
    assert isinstance(reply.body["error"]["message"], str)


def test_responses_and_stream_chunks_match_openais_published_schemas() -> None:
    for body in (
        plan_request(PLAN),
        {"model": "demo", "messages": [user("3 and 4")], "tools": DEMO_TOOLS},
        {"model": "echo", "messages": [user("hi")]},
    ):
        completion = build_reply(body, created=1_700_000_000).body
        assert_valid(completion, "CreateChatCompletionResponse")
        for chunk in build_stream_chunks(completion, include_usage=True):
            assert_valid(chunk, "CreateChatCompletionStreamResponse")


def test_stream_chunks_accumulate_to_the_completion() -> None:
    completion = build_reply(plan_request(PLAN)).body
    chunks = build_stream_chunks(completion, include_usage=False)
    arguments: dict[int, str] = {}
    for chunk in chunks:
        for delta in chunk["choices"][0]["delta"].get("tool_calls", []):
            arguments[delta["index"]] = arguments.get(delta["index"], "") + delta["function"]["arguments"]
    expected = [c["function"]["arguments"] for c in completion["choices"][0]["message"]["tool_calls"]]
    assert [arguments[i] for i in sorted(arguments)] == expected
    assert all("usage" not in c for c in chunks)


@pytest.mark.timeout(20)
async def test_server_in_the_event_loop_serves_completions_streams_models_and_errors() -> None:
    async with ScriptedServer() as base_url, httpx.AsyncClient(base_url=base_url, timeout=5) as http:
        models = (await http.get("/models")).json()
        assert {m["id"] for m in models["data"]} == {"demo", "plan", "echo"}
        plan = {
            "plan": [
                {"error": {"status": 503, "message": "busy", "retry_after": 2, "times": 1}},
                {"text": "ok"},
            ]
        }
        first = await http.post("/chat/completions", json=plan_request(plan))
        assert (first.status_code, first.headers["retry-after"]) == (503, "2")
        second = await http.post("/chat/completions", json=plan_request(plan))
        assert second.json()["choices"][0]["message"]["content"] == "ok"
        stream = await http.post(
            "/chat/completions",
            json={**plan_request(PLAN), "stream": True, "stream_options": {"include_usage": True}},
        )
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = [line for line in stream.text.split("\n\n") if line]
        assert events[-1] == "data: [DONE]"
        assert "usage" in json.loads(events[-2].removeprefix("data: "))
        broken = await http.post("/chat/completions", content=b"{nope")
        assert broken.status_code == 400


@pytest.mark.timeout(30)
def test_server_runs_as_its_own_process() -> None:
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.providers.scripted.server", "--port", "0"],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:")
        base_url = line.removeprefix("listening on ")
        reply = httpx.post(
            f"{base_url}/chat/completions", json={"model": "echo", "messages": [user("ping")]}, timeout=5
        )
        assert reply.json()["choices"][0]["message"]["content"] == "ping"
    finally:
        process.terminate()
        process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def test_demo_calls_the_real_example_tools_with_arguments_their_schemas_accept() -> None:
    from orchestrator.providers.openai_chat import build_tool_param
    from workers.examples import arithmetic, demo

    specs = {t.spec.name: t.spec for t in (arithmetic.add, arithmetic.multiply, demo.get_weather)}
    tools = [build_tool_param(spec) for spec in specs.values()]
    for prompt in ("What is 4 times 2.5?", "How is the weather in Lisbon?"):
        reply = build_reply({"model": "demo", "messages": [user(prompt)], "tools": tools})
        calls = arguments_of(message_of(reply.body))
        assert calls
        for name, arguments in calls:
            jsonschema.Draft202012Validator(specs[name].parameters).validate(arguments)
