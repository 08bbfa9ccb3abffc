"""`runtime.streaming.CallStream`: a model call's deltas as coalesced events adding up to its text; the
last of them written with the step that records the answer (`persist.build_emits`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import redis

from orchestrator.machine.events import ArmTimer, Emit, ModelFailed, ModelResponded
from orchestrator.model import ProviderError, Turn
from orchestrator.providers.deltas import TextDelta, ThinkingDelta, ToolCallDelta
from orchestrator.runtime.persist import build_emits
from orchestrator.runtime.streaming import CallStream
from tests.support.waiting import async_wait_until


class Events:
    """The turn's event stream as a list; `failing` makes the next appends fail as Redis would."""

    def __init__(self) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self.failing = 0
        self.writes = 0

    async def append(self, events: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        if self.failing:
            self.failing -= 1
            raise redis.ConnectionError("Redis is away")
        self.writes += 1
        self.items += [(name, dict(data)) for name, data in events]
        return f"{len(self.items)}-0"

    def texts(self, name: str = "text_delta") -> list[str]:
        return [data["text"] for event, data in self.items if event == name]

    def names(self) -> list[str]:
        return [name for name, _ in self.items]


def answer(text: str | None, thinking: str | None = None) -> Turn:
    return Turn(type="final_answer", text=text, thinking=thinking, provider="openai_chat")


async def end(stream: CallStream, events: Events, result: Turn | ProviderError) -> None:
    """End the call, then write what `finish` owes, as the step that records the answer does."""
    events.items += [(name, dict(data)) for name, data in await stream.finish(result)]


async def written_past(events: Events, count: int, what: str) -> None:
    """Wait until the ticker has written more than `count` events."""
    await async_wait_until(lambda: len(events.items) > count, what)


async def stream_pieces(stream: CallStream, events: Events, pieces: list[str]) -> None:
    """Each piece as a slow model sends it: the next one only once the ticker has written the one before."""
    for piece in pieces:
        written = len(events.items)
        await stream.on_delta(TextDelta(piece))
        await written_past(events, written, f"the ticker to write {piece!r}")


async def test_pieces_written_in_a_few_events_that_add_up_to_the_text() -> None:
    events = Events()
    stream = CallStream(events.append, 3, flush_s=0.01)
    pieces = [f"word{i} " for i in range(200)]
    # The model sends 20 pieces between two writes of the ticker, ten times over (`on_delta` never yields,
    # so a burst is buffered whole before the ticker runs): each burst goes out as one event.
    for burst in range(10):
        written = len(events.items)
        for piece in pieces[burst * 20 : (burst + 1) * 20]:
            await stream.on_delta(TextDelta(piece))
        await written_past(events, written, f"the ticker to write burst {burst}")
    await end(stream, events, answer("".join(pieces)))
    texts = events.texts()
    assert "".join(texts) == "".join(pieces)
    assert len(texts) == 10
    assert all(data["llm_call"] == 3 for _, data in events.items)


async def test_an_answer_that_did_not_stream_is_one_text_delta() -> None:
    events = Events()
    stream = CallStream(events.append, 0, flush_s=0.2)
    await end(stream, events, answer("the whole answer", thinking="pondered"))
    assert events.items == [
        ("thinking_delta", {"llm_call": 0, "text": "pondered"}),
        ("text_delta", {"llm_call": 0, "text": "the whole answer"}),
    ]


async def test_the_first_piece_goes_out_when_the_reader_waits_not_on_a_clock() -> None:
    events = Events()
    # A flush period far longer than the test: only the first write can happen here.
    stream = CallStream(events.append, 0, flush_s=60.0)
    await stream.on_delta(TextDelta("Hel"))
    await stream.on_delta(TextDelta("lo"))
    assert events.writes == 0  # the reader has not waited yet: it may still be reading a whole answer
    loop = asyncio.get_running_loop()
    started = loop.time()
    # The reader waits for the network (the next piece is not there yet); a few turns of the loop suffice.
    for _ in range(5):
        await asyncio.sleep(0)
    assert events.items == [("text_delta", {"llm_call": 0, "text": "Hello"})]
    assert loop.time() - started < 0.005
    await end(stream, events, answer("Hello"))
    assert events.texts() == ["Hello"]


async def test_an_answer_read_whole_without_waiting_costs_no_write_of_its_own() -> None:
    events = Events()
    stream = CallStream(events.append, 0, flush_s=0.2)
    for piece in ("The ", "whole ", "answer"):
        await stream.on_delta(TextDelta(piece))
    # The reader reached the end of the body without waiting: the step that records the answer writes it.
    owed = await stream.finish(answer("The whole answer"))
    assert events.writes == 0
    assert owed == [("text_delta", {"llm_call": 0, "text": "The whole answer"})]


async def test_text_the_normaliser_reshaped_is_reset_and_sent_whole() -> None:
    events = Events()
    stream = CallStream(events.append, 1, flush_s=0.01)
    await stream_pieces(stream, events, ["<think>hm</think>", "Paris"])
    await end(stream, events, answer("Paris", thinking="hm"))
    names = events.names()
    assert "model_stream_reset" in names
    after_reset = names.index("model_stream_reset")
    assert "".join(d["text"] for n, d in events.items[after_reset:] if n == "text_delta") == "Paris"


async def test_a_failed_call_that_showed_something_is_reset() -> None:
    events = Events()
    stream = CallStream(events.append, 2, flush_s=0.01)
    await stream_pieces(stream, events, ["partial ", "answer"])
    await end(stream, events, ProviderError(provider="openai_chat", type="transport_error", message="cut"))
    assert events.names()[-1] == "model_stream_reset"
    assert events.items[-1][1] == {"llm_call": 2}


async def test_a_failed_call_that_showed_nothing_writes_nothing() -> None:
    events = Events()
    stream = CallStream(events.append, 2, flush_s=0.2)
    await end(stream, events, ProviderError(provider="openai_chat", type="timeout", message="slow"))
    assert events.items == []


async def test_a_dropped_write_still_ends_with_deltas_adding_up() -> None:
    events = Events()
    stream = CallStream(events.append, 0, flush_s=0.01)
    await stream.on_delta(TextDelta("lost "))
    events.failing = 1
    # The ticker's write fails: the page missed "lost ".
    await async_wait_until(lambda: events.failing == 0, "the ticker's failed write")
    await stream_pieces(stream, events, ["and found"])
    await end(stream, events, answer("lost and found"))
    names = events.names()
    last_reset = len(names) - 1 - names[::-1].index("model_stream_reset")
    shown = [d["text"] for n, d in events.items[last_reset:] if n == "text_delta"]
    assert "".join(shown) == "lost and found"


async def test_tool_calls_are_announced_in_order_with_the_ids_the_normaliser_gives() -> None:
    events = Events()
    stream = CallStream(events.append, 4, flush_s=0.01, id_prefix="t1-m4")
    await stream.on_delta(TextDelta("Looking it up."))
    await stream.on_delta(ToolCallDelta(index=0, tool="search", call_id="call_a"))
    await stream.on_delta(ThinkingDelta("and the weather"))
    await stream.on_delta(ToolCallDelta(index=1, tool="weather"))
    await end(stream, events, answer("Looking it up."))
    assert events.items[:4] == [
        ("text_delta", {"llm_call": 4, "text": "Looking it up."}),
        ("tool_call_started", {"llm_call": 4, "call_id": "call_a", "tool": "search"}),
        ("thinking_delta", {"llm_call": 4, "text": "and the weather"}),
        ("tool_call_started", {"llm_call": 4, "call_id": "t1-m4_1", "tool": "weather"}),
    ]
    # Buffered together (`on_delta` never yields) and the answer ended before the first write was due: no
    # write of their own, all go with the step that records the answer.
    assert events.writes == 0


@pytest.mark.parametrize("size", [1, 8_000, 20_001])
async def test_long_text_is_cut_into_events_of_bounded_size(size: int) -> None:
    events = Events()
    stream = CallStream(events.append, 0, flush_s=0.2)
    text = "x" * size
    await end(stream, events, answer(text))
    assert "".join(events.texts()) == text
    assert max(len(t) for t in events.texts()) <= 8_000


async def test_a_write_in_flight_when_the_call_ends_is_counted_once() -> None:
    written = asyncio.Event()
    release = asyncio.Event()
    events = Events()

    async def slow_append(batch: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
        entry_id = await events.append(batch)  # in Redis already; its reply is on its way
        written.set()
        await release.wait()  # the model's answer is complete meanwhile
        return entry_id

    stream = CallStream(slow_append, 0, flush_s=0.01)
    await stream.on_delta(TextDelta("the whole answer"))
    await written.wait()
    finishing = asyncio.create_task(end(stream, events, answer("the whole answer")))
    # One turn of the loop (no time passes): `finish` runs until it waits for the lock the write holds.
    await asyncio.sleep(0)
    assert not finishing.done()
    release.set()
    await finishing
    assert events.texts() == ["the whole answer"]


def test_a_step_writes_what_its_model_calls_still_owed_before_the_machines_events() -> None:
    owed = (("text_delta", {"llm_call": 1, "text": "Paris"}),)
    responded = ModelResponded(turn=answer("Paris"), at=1.0, llm_call_index=1, preview=owed)
    failed = ModelFailed(
        error=ProviderError(provider="openai_chat", type="timeout", message="slow"),
        at=2.0,
        preview=(("model_stream_reset", {"llm_call": 2}),),
    )
    commands = [Emit(event_name="model_responded", data={"llm_call": 1}), ArmTimer(timer_id="t", at=3.0)]
    assert build_emits([responded, failed], commands) == [
        ("text_delta", {"llm_call": 1, "text": "Paris"}),
        ("model_stream_reset", {"llm_call": 2}),
        ("model_responded", {"llm_call": 1}),
    ]
