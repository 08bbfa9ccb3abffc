"""Stream readers: every recorded stream read event by event gives the normaliser's Turn, its
text deltas add up exactly to the Turn's text (thinking too), one ToolCallDelta per call with its id, and
the same whatever way the bytes are split (byte by byte, randomly, CRLF split between chunks, mid UTF-8)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from orchestrator.model import ProviderError, Turn, UserMessage
from orchestrator.providers import anthropic, openai_chat, openai_responses
from orchestrator.providers.base import ModelRequest
from orchestrator.providers.common import SSEDecoder, SSEEvent, join_thinking, parse_sse
from orchestrator.providers.deltas import Delta, TextDelta, ThinkingDelta, ToolCallDelta
from orchestrator.providers.scripted.wire import build_stream_chunks, split_text
from orchestrator.providers.stream_reader import SSEByteDecoder, ThinkingJoiner
from tests.openapi_schemas import assert_valid
from tests.unit.providers.conftest import load_expected
from tests.unit.providers.test_expected import check_turn

pytestmark = pytest.mark.timeout(60)

MODULES: dict[str, ModuleType] = {
    "openai_chat": openai_chat,
    "openai_responses": openai_responses,
    "anthropic": anthropic,
}
STREAMS = [e for e in load_expected().values() if e["file"].endswith(".sse") and e["provider"] in MODULES]


def read_chunks(module: ModuleType, chunks: Iterable[bytes]) -> tuple[list[Delta], Turn | ProviderError]:
    """What the HTTP path does with a body arriving as `chunks`: the deltas in order, then the result."""
    reader = module.stream_reader()
    decoder = SSEByteDecoder()
    deltas: list[Delta] = []
    for chunk in chunks:
        for event in decoder.feed(chunk):
            deltas += reader.add(event)
    for event in decoder.close():
        deltas += reader.add(event)
    return deltas, reader.finish()


def text_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, TextDelta))


def thinking_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas if isinstance(d, ThinkingDelta))


def random_splits(body: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(1, 60))))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


def check_deltas(deltas: list[Delta], turn: Turn) -> None:
    assert text_of(deltas) == (turn.text or "")
    assert thinking_of(deltas) == (turn.thinking or "")
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert [(d.index, d.tool, d.call_id) for d in calls] == [
        (i, c.name, c.id) for i, c in enumerate(turn.tool_calls)
    ]


@pytest.mark.parametrize("expected", STREAMS, ids=lambda e: e["file"])
def test_recorded_stream_read_event_by_event(responses_dir: Path, expected: dict[str, Any]) -> None:
    module = MODULES[expected["provider"]]
    body = (responses_dir / expected["file"]).read_bytes()
    deltas, turn = read_chunks(module, [body])
    check_turn(turn, expected)
    assert isinstance(turn, Turn)
    assert turn == module.from_stream(body.decode())
    check_deltas(deltas, turn)
    assert len(deltas) >= 2


@pytest.mark.parametrize("crlf", [False, True])
@pytest.mark.parametrize("expected", STREAMS, ids=lambda e: e["file"])
def test_recorded_stream_split_anywhere_reads_the_same(
    responses_dir: Path, expected: dict[str, Any], crlf: bool
) -> None:
    module = MODULES[expected["provider"]]
    body = (responses_dir / expected["file"]).read_bytes()
    if crlf:
        body = body.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    whole_deltas, whole = read_chunks(module, [body])
    byte_by_byte = read_chunks(module, [body[i : i + 1] for i in range(len(body))])
    assert byte_by_byte == (whole_deltas, whole)
    for seed in range(5):
        deltas, turn = read_chunks(module, random_splits(body, seed))
        assert turn == whole
        assert text_of(deltas) == text_of(whole_deltas) and thinking_of(deltas) == thinking_of(whole_deltas)


def test_sse_decoder_reads_a_body_split_anywhere_as_the_whole() -> None:
    body = (
        '\ufeffevent: a\r\ndata: {"x": "é€😀"}\r\n\r\n: comment\rid: 7\rdata: one\rdata: two\r\r'
        "retry: 5\ndata\nevent: last\ndata: no blank line at the end"
    )
    whole = list(parse_sse(body.removeprefix("\ufeff")))
    assert whole == [
        SSEEvent("a", '{"x": "é€😀"}'),
        SSEEvent(None, "one\ntwo"),
        SSEEvent("last", "\nno blank line at the end"),
    ]
    raw = body.encode()
    for size in (1, 2, 3, 5, 7):
        decoder = SSEByteDecoder()
        events = [e for i in range(0, len(raw), size) for e in decoder.feed(raw[i : i + size])]
        assert [*events, *decoder.close()] == whole
    text = SSEDecoder()
    events = [e for ch in body.removeprefix("\ufeff") for e in text.feed(ch)]
    assert [*events, *text.close()] == whole


def test_sse_decoder_keeps_a_cr_until_it_knows_whether_lf_follows() -> None:
    decoder = SSEDecoder()
    assert decoder.feed("data: x\r") == []
    assert decoder.feed("\n\r") == []  # CRLF ends the line, the next CR may begin a CRLF
    assert decoder.feed("\n") == [SSEEvent(None, "x")]  # one blank line, not two
    assert decoder.feed("data: y\n\n") == [SSEEvent(None, "y")]


def test_bytes_that_are_not_utf8_raise_for_the_http_path_to_map() -> None:
    decoder = SSEByteDecoder()
    with pytest.raises(UnicodeDecodeError):
        decoder.feed(b"data: \xff\n\n")
    cut = SSEByteDecoder()
    assert cut.feed("data: é".encode()[:-1]) == []
    with pytest.raises(UnicodeDecodeError):
        cut.close()


@pytest.mark.parametrize("seed", range(30))
def test_thinking_pieces_add_up_to_join_thinking(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = ["\n", "\n\n", " ", "a", "bc", " d", "\t"]
    parts = [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))) for _ in range(rng.randint(1, 4))
    ]
    joiner = ThinkingJoiner()
    pieces: list[Delta] = []
    for number, part in enumerate(parts):
        cuts = sorted(rng.sample(range(len(part) + 1), min(len(part) + 1, 3)))
        for a, b in zip([0, *cuts], [*cuts, len(part)], strict=True):
            pieces += joiner.add(number, part[a:b])
    assert thinking_of(pieces) == (join_thinking(parts) or ""), parts


def sse(*payloads: object) -> str:
    return "".join(f"data: {json.dumps(p)}\n\n" for p in payloads) + "data: [DONE]\n\n"


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "c",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def read_text(module: ModuleType, text: str) -> tuple[list[Delta], Turn | ProviderError]:
    return read_chunks(module, [text.encode()])


def test_chat_text_refusal_and_thinking_deltas_add_up_exactly() -> None:
    deltas, turn = read_text(
        openai_chat,
        sse(
            chunk({"role": "assistant", "reasoning_content": "\n\nfirst"}),
            chunk({"reasoning_content": " step\n"}),
            chunk({"reasoning_content": "\n"}),
            chunk({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "more"}]}]}),
            chunk({"content": "I can"}),
            chunk({"content": [{"type": "text", "text": "not "}]}),
            chunk({"refusal": "do that."}),
            chunk({}, "stop"),
        ),
    )
    assert isinstance(turn, Turn)
    assert turn.text == "I cannot do that." and turn.thinking == "first step\n\nmore"
    check_deltas(deltas, turn)


def test_chat_tool_calls_are_announced_once_when_named() -> None:
    deltas, turn = read_text(
        openai_chat,
        sse(
            chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"name": "look", "arguments": '{"q"'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "x"}'}}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"name": "add", "arguments": "{}"}}]}),
            chunk({}, "tool_calls"),
        ),
    )
    assert isinstance(turn, Turn)
    assert [d for d in deltas if isinstance(d, ToolCallDelta)] == [
        ToolCallDelta(0, "look", "a"),
        ToolCallDelta(1, "add", None),
    ]
    assert [c.name for c in turn.tool_calls] == ["look", "add"] and turn.tool_calls[1].id  # synthesised


def test_chat_stream_cut_before_its_end_is_retryable() -> None:
    cut = "".join(f"data: {json.dumps(chunk({'content': w}))}\n\n" for w in ("Hel", "lo"))
    deltas, error = read_text(openai_chat, cut)
    assert text_of(deltas) == "Hello"
    assert isinstance(error, ProviderError)
    assert (error.type, error.retryable) == ("invalid_response", True)
    # A server that sends finish_reason and no [DONE] has finished.
    finished = cut + f"data: {json.dumps(chunk({}, 'stop'))}\n\n"
    assert isinstance(openai_chat.from_stream(finished), Turn)


def test_anthropic_error_event_mid_stream_ends_the_reading() -> None:
    events = [
        {"type": "message_start", "message": {"id": "m", "model": "c", "content": [], "usage": {}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "Hi"}},
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " there"}},
        {"type": "message_stop"},
    ]
    text = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
    deltas, error = read_text(anthropic, text)
    assert deltas == [TextDelta("Hi")]
    assert isinstance(error, ProviderError)
    assert (error.type, error.retryable) == ("overloaded_error", True)


def test_anthropic_thinking_blocks_are_joined_as_the_normaliser_joins_them() -> None:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"id": "m", "model": "c", "content": [], "usage": {}}},
    ]
    for index, pieces in enumerate((["plan\n", "\n"], ["  \n"], ["\ncheck", " it\n"])):
        events.append(
            {
                "type": "content_block_start",
                "index": index,
                "content_block": {"type": "thinking", "thinking": ""},
            }
        )
        events += [
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "thinking_delta", "thinking": p},
            }
            for p in pieces
        ]
        events.append(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "signature_delta", "signature": "s"},
            }
        )
    events += [{"type": "message_delta", "delta": {"stop_reason": "end_turn"}}, {"type": "message_stop"}]
    deltas, turn = read_text(anthropic, "".join(f"data: {json.dumps(e)}\n\n" for e in events))
    assert isinstance(turn, Turn)
    assert turn.thinking == "plan\n\ncheck it"
    check_deltas(deltas, turn)


def test_responses_text_refusal_and_summary_deltas_add_up_exactly() -> None:
    def event(kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, **fields}

    events = [
        event("response.created", response={"id": "r", "status": "in_progress", "output": []}),
        event("response.output_item.added", output_index=0, item={"type": "reasoning", "summary": []}),
        event("response.reasoning_summary_text.delta", output_index=0, summary_index=0, delta="**Plan**"),
        event("response.reasoning_summary_text.delta", output_index=0, summary_index=1, delta="\nThen act"),
        event("response.output_item.added", output_index=1, item={"type": "message", "content": []}),
        event("response.output_text.delta", output_index=1, content_index=0, delta="Sure"),
        event("response.output_text.delta", output_index=1, content_index=0, delta=", but"),
        event("response.refusal.delta", output_index=1, content_index=1, delta=" no."),
        event(
            "response.output_item.added",
            output_index=2,
            item={"type": "function_call", "call_id": "call_1", "name": "add", "arguments": ""},
        ),
        event("response.function_call_arguments.delta", output_index=2, delta='{"a": 1}'),
        event("response.completed", response={"id": "r", "status": "completed", "model": "g"}),
    ]
    deltas, turn = read_text(openai_responses, "".join(f"data: {json.dumps(e)}\n\n" for e in events))
    assert isinstance(turn, Turn)
    assert (turn.text, turn.thinking) == ("Sure, but no.", "**Plan**\n\nThen act")
    assert [(c.id, c.arguments) for c in turn.tool_calls] == [("call_1", {"a": 1})]
    check_deltas(deltas, turn)


def test_responses_stream_without_its_terminal_event_is_retryable() -> None:
    event = {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": "Hi"}
    deltas, error = read_text(openai_responses, f"data: {json.dumps(event)}\n\n")
    assert deltas == [TextDelta("Hi")]
    assert isinstance(error, ProviderError) and error.retryable and error.type == "invalid_response"


def test_stream_request_bodies_match_openais_published_schemas() -> None:
    request = ModelRequest(model="gpt-4o", messages=[UserMessage(content="hi")])
    chat = openai_chat.to_wire(request, stream=True)
    assert (chat["stream"], chat["stream_options"]) == (True, {"include_usage": True})
    assert_valid(chat, "CreateChatCompletionRequest")
    responses = openai_responses.to_wire(request, stream=True)
    assert responses["stream"] is True
    assert_valid(responses, "CreateResponse")
    assert anthropic.to_wire(request, stream=True)["stream"] is True
    for module in (openai_chat, openai_responses, anthropic):
        assert not {"stream", "stream_options"} & module.to_wire(request).keys()


def test_scripted_stream_writes_its_text_a_word_at_a_time() -> None:
    text = "The answer is forty-two, as computed by multiply(a=6, b=7).\n\nDone"
    assert "".join(split_text(text)) == text
    assert all(0 < len(p) <= 12 for p in split_text(text))
    completion = {
        "id": "c",
        "created": 1,
        "model": "demo",
        "choices": [{"index": 0, "message": {"content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    chunks = build_stream_chunks(completion, include_usage=True)
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    deltas, turn = read_text(openai_chat, body)
    assert isinstance(turn, Turn) and turn.text == text
    assert [d.text for d in deltas if isinstance(d, TextDelta)] == split_text(text)
    assert len(deltas) >= 10
