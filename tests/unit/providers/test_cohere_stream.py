"""The Cohere v2 chat stream read event by event (`cohere.stream_reader`): the Turn `from_wire` gives for the
same answer, deltas that add up to its text and thinking, one announcement per call, however the bytes are
split; a failed generation, an error event and a cut stream as ProviderErrors. Streams: tests/fixtures/cohere
(written from Cohere's reference, see its README)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.model import ProviderError, Turn, UserMessage
from orchestrator.providers import cohere
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.common import IdSource, join_thinking
from orchestrator.providers.deltas import Delta, TextDelta, ThinkingDelta, ToolCallDelta
from orchestrator.providers.stream_reader import SSEByteDecoder
from orchestrator.providers.structured import ANSWER_TOOL, read_answer_tool
from tests.unit.providers.conftest import RESPONSES_DIR, load_expected
from tests.unit.providers.test_expected import check_turn

pytestmark = pytest.mark.timeout(60)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "cohere"
RECORDED = "cohere_v2__tool_plan_and_null_arguments.json"
# Each written stream and the whole body of the same answer.
TWINS = {
    "tool_plan_and_null_arguments.sse": RESPONSES_DIR / RECORDED,
    "parallel_tool_calls.sse": FIXTURES / "parallel_tool_calls.json",
    "text_with_citations.sse": FIXTURES / "text_with_citations.json",
    "reasoning_thinking_then_text.sse": FIXTURES / "reasoning_thinking_then_text.json",
    "reasoning_thinking_and_tool_call.sse": FIXTURES / "reasoning_thinking_and_tool_call.json",
}


def read_chunks(
    chunks: Iterable[bytes], request: ModelRequest | None = None
) -> tuple[list[Delta], Turn | ProviderError]:
    """What the HTTP path does with a body arriving as `chunks`: the deltas in order, then the result."""
    reader = cohere.stream_reader(request)
    decoder = SSEByteDecoder()
    deltas: list[Delta] = []
    for chunk in chunks:
        for event in decoder.feed(chunk):
            deltas += reader.add(event)
    for event in decoder.close():
        deltas += reader.add(event)
    return deltas, reader.finish(IdSource("t"))


def text_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, TextDelta))


def thinking_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, ThinkingDelta))


def sse(events: list[dict[str, Any]]) -> bytes:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def start(index: int, kind: str) -> dict[str, Any]:
    return {
        "type": "content-start",
        "index": index,
        "delta": {"message": {"content": {"type": kind, kind: ""}}},
    }


def piece(index: int, kind: str, text: str) -> dict[str, Any]:
    return {"type": "content-delta", "index": index, "delta": {"message": {"content": {kind: text}}}}


def call_piece(index: int, call: dict[str, Any], kind: str = "tool-call-delta") -> dict[str, Any]:
    return {"type": kind, "index": index, "delta": {"message": {"tool_calls": call}}}


def events_of(name: str) -> list[dict[str, Any]]:
    text = (FIXTURES / name).read_text("utf-8")
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("name", sorted(TWINS))
def test_stream_gives_the_turn_of_the_whole_body(name: str) -> None:
    deltas, turn = read_chunks([(FIXTURES / name).read_bytes()])
    whole = cohere.from_wire(json.loads(TWINS[name].read_text("utf-8")), ids=IdSource("t"))
    assert isinstance(turn, Turn), turn
    assert turn == whole
    assert text_of(deltas) == (turn.text or "")
    assert thinking_of(deltas) == (turn.thinking or "")
    announced = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert [(d.index, d.tool, d.call_id) for d in announced] == [
        (i, c.name, c.id) for i, c in enumerate(turn.tool_calls)
    ]


def test_recorded_answer_streamed_meets_its_expectation() -> None:
    _, turn = read_chunks([(FIXTURES / "tool_plan_and_null_arguments.sse").read_bytes()])
    check_turn(turn, load_expected()[RECORDED])
    assert isinstance(turn, Turn)
    assert turn.provider_data == {
        "tool_plan": "I will use the currentTime tool to find the current time.",
        "response_id": "316f0604-ff50-49f6-ba38-c64616e972b4",
    }
    assert turn.usage.cache_read_tokens == 992


@pytest.mark.parametrize("name", sorted(TWINS))
@pytest.mark.parametrize("seed", range(4))
def test_any_split_of_the_bytes_reads_the_same(name: str, seed: int) -> None:
    body = (
        (FIXTURES / name).read_bytes().replace(b"\n", b"\r\n") if seed % 2 else (FIXTURES / name).read_bytes()
    )
    whole_deltas, whole = read_chunks([body])
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, 80)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    deltas, turn = read_chunks(chunks)
    assert turn == whole
    assert text_of(deltas) == text_of(whole_deltas)
    assert thinking_of(deltas) == thinking_of(whole_deltas)


def test_byte_by_byte() -> None:
    body = (FIXTURES / "text_with_citations.sse").read_bytes()
    deltas, turn = read_chunks([body[i : i + 1] for i in range(len(body))])
    assert isinstance(turn, Turn)
    assert turn.text == "It is currently 24°C in Madrid and 28°C in Brasilia." == text_of(deltas)


@pytest.mark.parametrize("name", sorted(TWINS))
def test_event_lines_are_not_needed(name: str) -> None:
    body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events_of(name))
    _, with_names = read_chunks([(FIXTURES / name).read_bytes()])
    _, without = read_chunks([body])
    assert without == with_names


def test_a_done_line_after_message_end_is_ignored() -> None:
    body = (FIXTURES / "reasoning_thinking_then_text.sse").read_bytes() + b"data: [DONE]\n\n"
    _, turn = read_chunks([body])
    assert (
        isinstance(turn, Turn) and turn.text == "Alice's brother has **3 sisters**: Alice and her 2 sisters."
    )


def test_thinking_pieces_add_up_to_the_joined_thinking() -> None:
    deltas, turn = read_chunks([(FIXTURES / "reasoning_thinking_then_text.sse").read_bytes()])
    assert isinstance(turn, Turn) and turn.thinking is not None and "\n\n" in turn.thinking
    assert thinking_of(deltas) == turn.thinking == join_thinking([turn.thinking])
    assert turn.text is not None and "\n\n" not in text_of(deltas)


def test_tool_plan_and_text_are_one_text_with_a_blank_line() -> None:
    events = [
        {"type": "message-start", "id": "m"},
        {"type": "tool-plan-delta", "delta": {"message": {"tool_plan": "I will look."}}},
        {
            "type": "content-start",
            "index": 0,
            "delta": {"message": {"content": {"type": "text", "text": ""}}},
        },
        {"type": "content-delta", "index": 0, "delta": {"message": {"content": {"text": "Found"}}}},
        {"type": "content-delta", "index": 0, "delta": {"message": {"content": {"text": " it."}}}},
        {
            "type": "content-start",
            "index": 1,
            "delta": {"message": {"content": {"type": "text", "text": ""}}},
        },
        {"type": "content-delta", "index": 1, "delta": {"message": {"content": {"text": "More."}}}},
        {"type": "message-end", "delta": {"finish_reason": "COMPLETE"}},
    ]
    deltas, turn = read_chunks([sse(events)])
    assert isinstance(turn, Turn)
    assert turn.text == "I will look.\n\nFound it.\n\nMore." == text_of(deltas)


def test_a_block_without_a_type_is_what_its_pieces_carry() -> None:
    events = [
        {"type": "message-start", "id": "m"},
        {"type": "content-delta", "index": 0, "delta": {"message": {"content": {"thinking": "hmm"}}}},
        {"type": "content-delta", "index": 1, "delta": {"message": {"content": {"text": "Yes."}}}},
        {"type": "message-end", "delta": {"finish_reason": "COMPLETE"}},
    ]
    deltas, turn = read_chunks([sse(events)])
    assert isinstance(turn, Turn)
    assert (turn.thinking, turn.text) == ("hmm", "Yes.")
    assert (thinking_of(deltas), text_of(deltas)) == ("hmm", "Yes.")


def test_a_failed_generation_is_a_retryable_error() -> None:
    _, result = read_chunks([(FIXTURES / "message_end_error.sse").read_bytes()])
    assert isinstance(result, ProviderError)
    assert result.retryable and result.type == "error" and result.provider == "cohere"
    assert result.message.startswith("internal server error")


def test_a_failed_generation_over_the_window_is_an_overflow() -> None:
    message = "too many tokens: total number of tokens in the prompt cannot exceed 4081 - received 4292."
    events = [
        {"type": "message-start", "id": "m"},
        {"type": "message-end", "delta": {"finish_reason": "ERROR", "error": message}},
    ]
    _, result = read_chunks([sse(events)])
    assert isinstance(result, ProviderError)
    assert (result.code, result.retryable) == ("context_length_exceeded", False)


def test_an_error_body_as_an_event_is_the_error() -> None:
    body = sse([{"type": "message-start", "id": "m"}]) + b'data: {"id": "r", "message": "internal error"}\n\n'
    _, result = read_chunks([body])
    assert isinstance(result, ProviderError) and result.message == "internal error"


@pytest.mark.parametrize("name", sorted(TWINS))
def test_a_stream_cut_before_message_end_is_retryable(name: str) -> None:
    events = events_of(name)
    assert events[-1]["type"] == "message-end"
    _, result = read_chunks([sse(events[:-1])])
    assert isinstance(result, ProviderError)
    assert (result.type, result.retryable) == ("invalid_response", True)


def test_an_empty_body_was_cut() -> None:
    _, result = read_chunks([b""])
    assert isinstance(result, ProviderError) and result.retryable


@pytest.mark.parametrize(
    "event",
    [
        {"type": "content-delta", "index": "0", "delta": {"message": {"content": {"text": "x"}}}},
        {"type": "content-delta", "index": 0, "delta": {"message": {"content": {"text": 3}}}},
        {"type": "tool-call-start", "index": 0, "delta": {"message": {"tool_calls": []}}},
        {"type": "tool-plan-delta", "delta": []},
    ],
)
def test_a_malformed_event_is_not_retryable(event: dict[str, Any]) -> None:
    _, result = read_chunks([sse([{"type": "message-start", "id": "m"}, event])])
    assert isinstance(result, ProviderError)
    assert (result.type, result.retryable) == ("invalid_response", False)


def test_citations_and_unknown_events_change_nothing() -> None:
    events = events_of("text_with_citations.sse")
    extra = [{"type": "debug", "prompt": "..."}, {"type": "something-new", "index": 0}]
    _, plain = read_chunks([sse(events)])
    _, more = read_chunks([sse([*events[:3], *extra, *events[3:]])])
    assert more == plain


def test_the_answer_tool_streams_as_text() -> None:
    answer = ['{"city"', ': "Madrid"', "}"]
    events = [
        {"type": "message-start", "id": "m"},
        {"type": "tool-plan-delta", "delta": {"message": {"tool_plan": "I will answer."}}},
        {
            "type": "tool-call-start",
            "index": 0,
            "delta": {
                "message": {"tool_calls": {"id": "a1", "type": "function", "function": {"name": ANSWER_TOOL}}}
            },
        },
        *(
            {
                "type": "tool-call-delta",
                "index": 0,
                "delta": {"message": {"tool_calls": {"function": {"arguments": a}}}},
            }
            for a in answer
        ),
        {"type": "tool-call-end", "index": 0},
        {"type": "message-end", "delta": {"finish_reason": "TOOL_CALL"}},
    ]
    request = ModelRequest(
        model="command-a-03-2025",
        messages=[UserMessage(content="Where?")],
        output_schema={"type": "object", "properties": {"city": {"type": "string"}}},
    )
    deltas, turn = read_chunks([sse(events)], request)
    assert isinstance(turn, Turn)
    assert not [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert text_of(deltas).endswith('{"city": "Madrid"}')
    final = read_answer_tool(turn)
    assert (final.type, final.text) == ("final_answer", '{"city": "Madrid"}')


def test_from_stream_reads_a_whole_body() -> None:
    text = (FIXTURES / "parallel_tool_calls.sse").read_text("utf-8")
    turn = cohere.from_stream(text, ids=IdSource("t"))
    assert isinstance(turn, Turn)
    assert [(c.id, c.arguments) for c in turn.tool_calls] == [
        ("get_weather_p1t92w7gfgq7", {"location": "Madrid"}),
        ("get_weather_ay6nmvjgp9vn", {"location": "Brasilia"}),
    ]
    assert (turn.finish_reason, turn.usage.input_tokens, turn.usage.output_tokens) == ("tool_calls", 913, 83)
