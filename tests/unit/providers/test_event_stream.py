"""AWS event-stream framing: frames encoded here by hand, decoded by `EventStreamDecoder` and, on the same
bytes, by botocore's own parser (`botocore.eventstream.EventStreamBuffer`); every frame split at every byte
offset; bad CRCs, bad lengths, unknown header types and cut streams refused."""

from __future__ import annotations

import json
import struct
import uuid
import zlib
from typing import Any

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

from orchestrator.providers.common import SSEEvent
from orchestrator.providers.event_stream import EventStreamDecoder, EventStreamError

pytestmark = pytest.mark.timeout(60)


def encode_header(name: str, kind: int, value: Any) -> bytes:
    raw_name = name.encode()
    head = struct.pack("!B", len(raw_name)) + raw_name + struct.pack("!B", kind)
    if kind in (0, 1):
        return head
    fixed = {2: "!b", 3: "!h", 4: "!i", 5: "!q", 8: "!q"}
    if kind in fixed:
        return head + struct.pack(fixed[kind], value)
    if kind in (6, 7):
        raw = value if isinstance(value, bytes) else value.encode()
        return head + struct.pack("!H", len(raw)) + raw
    return head + (bytes(value) if value is not None else b"")


def frame(headers: list[tuple[str, int, Any]], payload: bytes) -> bytes:
    """One frame as the AWS event-stream spec lays it out (prelude, prelude CRC, headers, payload, CRC)."""
    encoded = b"".join(encode_header(*h) for h in headers)
    prelude = struct.pack("!II", 16 + len(encoded) + len(payload), len(encoded))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    message = prelude + encoded + payload
    return message + struct.pack("!I", zlib.crc32(message))


def event(event_type: str, payload: dict[str, Any]) -> bytes:
    headers = [
        (":event-type", 7, event_type),
        (":content-type", 7, "application/json"),
        (":message-type", 7, "event"),
    ]
    return frame(headers, json.dumps(payload).encode())


def exception(exception_type: str, message: str) -> bytes:
    headers = [
        (":exception-type", 7, exception_type),
        (":content-type", 7, "application/json"),
        (":message-type", 7, "exception"),
    ]
    return frame(headers, json.dumps({"message": message}).encode())


# Every header value type, to check both decoders read them alike.
ALL_TYPES = [
    ("t", 0, None),
    ("f", 1, None),
    ("byte", 2, -5),
    ("short", 3, -300),
    ("int", 4, 70000),
    ("long", 5, 2**40),
    ("bytes", 6, b"\x00\xff"),
    ("string", 7, "h\u00e9"),
    ("time", 8, 1_700_000_000_000),
    ("uuid", 9, uuid.UUID(int=7).bytes),
]

STREAM = b"".join(
    [
        event("messageStart", {"role": "assistant", "p": "abcd"}),
        event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hé"}, "p": "ab"}),
        frame([*ALL_TYPES, (":event-type", 7, "contentBlockStop"), (":message-type", 7, "event")], b"{}"),
        event("messageStop", {"stopReason": "end_turn"}),
        exception("throttlingException", "slow down"),
    ]
)


def decode(chunks: list[bytes]) -> list[SSEEvent]:
    decoder = EventStreamDecoder()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    return events + decoder.close()


def botocore_events(body: bytes) -> list[SSEEvent]:
    """What botocore's parser makes of the same bytes, mapped as the decoder maps frames."""
    buffer = EventStreamBuffer()
    buffer.add_data(body)
    events = []
    for message in buffer:
        headers = message.headers
        kind = headers[":message-type"]
        name = headers.get(":event-type") if kind == "event" else f"exception:{headers[':exception-type']}"
        events.append(SSEEvent(name, message.payload.decode()))
    return events


def test_frames_decode_as_botocore_reads_them() -> None:
    events = decode([STREAM])
    assert events == botocore_events(STREAM)
    assert [e.event for e in events] == [
        "messageStart",
        "contentBlockDelta",
        "contentBlockStop",
        "messageStop",
        "exception:throttlingException",
    ]
    assert json.loads(events[1].data)["delta"]["text"] == "Hé"
    assert json.loads(events[4].data) == {"message": "slow down"}


def test_header_values_of_every_type_read_as_botocore_reads_them() -> None:
    body = frame([*ALL_TYPES, (":event-type", 7, "x"), (":message-type", 7, "event")], b"{}")
    buffer = EventStreamBuffer()
    buffer.add_data(body)
    (message,) = list(buffer)
    decoder = EventStreamDecoder()
    headers = decoder._read_headers(body[12 : 12 + struct.unpack_from("!I", body, 4)[0]])
    assert headers == dict(message.headers)


def test_every_split_of_every_frame_gives_the_same_events() -> None:
    whole = decode([STREAM])
    for offset in range(1, len(STREAM)):
        assert decode([STREAM[:offset], STREAM[offset:]]) == whole, offset


def test_byte_by_byte() -> None:
    assert decode([STREAM[i : i + 1] for i in range(len(STREAM))]) == decode([STREAM])


def test_error_frame_carries_its_message_from_the_headers() -> None:
    headers = [
        (":message-type", 7, "error"),
        (":error-code", 7, "InternalFailure"),
        (":error-message", 7, "boom"),
    ]
    body = frame(headers, b"")
    assert decode([body]) == [SSEEvent("error:InternalFailure", "boom")]


def flip(body: bytes, at: int) -> bytes:
    return body[:at] + bytes([body[at] ^ 0x01]) + body[at + 1 :]


@pytest.mark.parametrize(("where", "what"), [(9, "prelude CRC"), (20, "message CRC"), (-1, "message CRC")])
def test_bad_crcs_are_refused_like_botocore(where: int, what: str) -> None:
    original = event("messageStop", {"stopReason": "end_turn"})
    body = flip(original, where % len(original))
    with pytest.raises(EventStreamError, match=what):
        decode([body])
    buffer = EventStreamBuffer()
    buffer.add_data(body)
    with pytest.raises(ChecksumMismatch):
        list(buffer)


def test_a_bad_frame_is_a_value_error_and_nothing_after_it_is_read() -> None:
    decoder = EventStreamDecoder()
    bad = flip(event("messageStart", {}), 20)
    with pytest.raises(ValueError, match="frame 0"):
        decoder.feed(bad + event("messageStop", {"stopReason": "end_turn"}))
    assert decoder.close() == []


@pytest.mark.parametrize("cut", [1, 11, 12, 30, -1])
def test_a_cut_stream_is_refused_at_close(cut: int) -> None:
    first = event("messageStart", {"role": "assistant"})
    body = first + event("messageStop", {"stopReason": "end_turn"})
    decoder = EventStreamDecoder()
    events = decoder.feed(body[: len(first) + (cut if cut > 0 else len(body) - len(first) + cut)])
    assert [e.event for e in events] == ["messageStart"]
    with pytest.raises(EventStreamError) as raised:
        decoder.close()
    assert raised.value.cut


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (frame([(":message-type", 7, "weird")], b""), "unknown :message-type"),
        (frame([("x", 42, None)], b""), "unknown type 42"),
        (frame([(":message-type", 7, "event"), (":message-type", 7, "event")], b""), "twice"),
        (frame([(":message-type", 7, "event"), (":event-type", 7, "x")], b"\xff"), "not UTF-8"),
    ],
)
def test_malformed_frames(body: bytes, problem: str) -> None:
    with pytest.raises(EventStreamError, match=problem):
        decode([body])


def test_impossible_lengths() -> None:
    prelude = struct.pack("!II", 15, 0)
    body = prelude + struct.pack("!I", zlib.crc32(prelude)) + b"\x00" * 4
    with pytest.raises(EventStreamError, match="too small"):
        decode([body])
    prelude = struct.pack("!II", 200_000, 150_000)
    with pytest.raises(EventStreamError, match="headers of 150000 bytes"):
        decode([prelude + struct.pack("!I", zlib.crc32(prelude))])


def test_a_header_that_runs_past_the_headers_is_refused() -> None:
    headers = encode_header(":message-type", 7, "event")[:-2]
    prelude = struct.pack("!II", 16 + len(headers), len(headers))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    message = prelude + headers
    with pytest.raises(EventStreamError, match="inside a header"):
        decode([message + struct.pack("!I", zlib.crc32(message))])


def test_many_small_frames_in_one_chunk() -> None:
    one = event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "x"}})
    body = one * 2000
    assert len(decode([body])) == 2000
