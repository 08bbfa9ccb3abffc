"""AWS event-stream framing (`application/vnd.amazon.eventstream`), decoded as bytes arrive.

Bedrock's ConverseStream answers in binary frames, not server-sent events. `EventStreamDecoder` has the
interface of `stream_reader.SSEByteDecoder` (`feed(chunk)`, `close()`, both giving `SSEEvent`s), so the
streaming HTTP loop can read either framing and hand the same events to a provider's `StreamReader`.

One frame, all integers big-endian::

    total length      uint32   the whole frame, these 4 bytes and the trailing CRC included
    headers length    uint32
    prelude CRC       uint32   CRC-32 of the 8 bytes above
    headers           name length (uint8), name (UTF-8), value type (uint8), value — repeated
    payload           total length - headers length - 16 bytes
    message CRC       uint32   CRC-32 of everything before it

Header value types: 0 true, 1 false, 2 int8, 3 int16, 4 int32, 5 int64, 6 bytes (uint16 length),
7 string (uint16 length), 8 timestamp (int64 milliseconds), 9 UUID (16 bytes).

Each frame becomes one `SSEEvent`, by its `:message-type` header::

    event       SSEEvent(event=<:event-type>, data=<payload as text>)          e.g. contentBlockDelta
    exception   SSEEvent(event="exception:" + <:exception-type>, data=<payload>)  a modelled error, JSON
    error       SSEEvent(event="error:" + <:error-code>, data=<:error-message>)  an unmodelled error: its
                payload is empty, the message is a header (as botocore's parser reads it)

A frame that is not one — a prelude or message CRC that does not match, lengths out of bounds, a header
of an unknown type, a payload that is not UTF-8, a message type other than the three — raises
`EventStreamError`, as does `close()` when bytes of an unfinished frame are left (a cut stream). It is a
`ValueError`, so a caller that turns decoding failures into a `ProviderError` catches it beside
`UnicodeDecodeError`; after it, the decoder is spent. Limits are botocore's: 128 KiB of headers and
24 MiB of payload a frame.
"""

from __future__ import annotations

import struct
import zlib

from orchestrator.errors import EventStreamError
from orchestrator.providers.common import SSEEvent

__all__ = ["MAX_HEADERS_BYTES", "MAX_PAYLOAD_BYTES", "EventStreamDecoder", "EventStreamError"]

PRELUDE_BYTES = 12
CRC_BYTES = 4
# The least frame: a prelude and a message CRC, nothing between.
MIN_FRAME_BYTES = PRELUDE_BYTES + CRC_BYTES
MAX_HEADERS_BYTES = 128 * 1024
MAX_PAYLOAD_BYTES = 24 * 1024 * 1024

HeaderValue = bool | int | bytes | str

# Fixed-size header values: type → (struct format, size in bytes).
_FIXED = {2: ("!b", 1), 3: ("!h", 2), 4: ("!i", 4), 5: ("!q", 8), 8: ("!q", 8)}
_UUID_TYPE = 9
_UUID_BYTES = 16


class EventStreamDecoder:
    """`SSEEvent`s from an AWS event stream's bytes, fed as they arrive; frames may be split anywhere."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._frames = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """The events of the frames `chunk` completes; `EventStreamError` for a frame that is not one."""
        self._buffer += chunk
        events: list[SSEEvent] = []
        start = 0
        while len(self._buffer) - start >= PRELUDE_BYTES:
            total = self._read_prelude(start)
            if len(self._buffer) - start < total:
                break
            events.append(self._read_frame(bytes(self._buffer[start : start + total])))
            start += total
            self._frames += 1
        # One deletion per chunk, never per frame: a chunk of many small frames stays linear.
        del self._buffer[:start]
        return events

    def close(self) -> list[SSEEvent]:
        """The end of the body: no event; `EventStreamError(cut=True)` when a frame was left unfinished."""
        if self._buffer:
            left = len(self._buffer)
            self._buffer.clear()
            raise EventStreamError(
                f"event stream cut: {left} bytes of an unfinished frame after frame {self._frames}", cut=True
            )
        return []

    def _read_prelude(self, start: int) -> int:
        total, headers_length, prelude_crc = struct.unpack_from("!III", self._buffer, start)
        computed = zlib.crc32(self._buffer[start : start + 8])
        if computed != prelude_crc:
            raise self._fail(f"prelude CRC mismatch: expected 0x{prelude_crc:08x}, computed 0x{computed:08x}")
        if headers_length > MAX_HEADERS_BYTES:
            raise self._fail(f"headers of {headers_length} bytes exceed {MAX_HEADERS_BYTES}")
        payload_length = total - headers_length - MIN_FRAME_BYTES
        if payload_length < 0:
            raise self._fail(f"total length {total} is too small for {headers_length} bytes of headers")
        if payload_length > MAX_PAYLOAD_BYTES:
            raise self._fail(f"payload of {payload_length} bytes exceeds {MAX_PAYLOAD_BYTES}")
        return int(total)

    def _read_frame(self, frame: bytes) -> SSEEvent:
        (message_crc,) = struct.unpack_from("!I", frame, len(frame) - CRC_BYTES)
        computed = zlib.crc32(frame[:-CRC_BYTES])
        if computed != message_crc:
            raise self._fail(f"message CRC mismatch: expected 0x{message_crc:08x}, computed 0x{computed:08x}")
        (headers_length,) = struct.unpack_from("!I", frame, 4)
        headers_end = PRELUDE_BYTES + headers_length
        headers = self._read_headers(frame[PRELUDE_BYTES:headers_end])
        try:
            payload = frame[headers_end:-CRC_BYTES].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self._fail(f"payload is not UTF-8 ({exc.reason} at byte {exc.start})") from exc
        return self._build_event(headers, payload)

    def _read_headers(self, data: bytes) -> dict[str, HeaderValue]:
        headers: dict[str, HeaderValue] = {}
        at = 0
        try:
            while at < len(data):
                name_length = data[at]
                name = data[at + 1 : at + 1 + name_length].decode("utf-8")
                at += 1 + name_length
                value, at = self._read_value(data, at)
                if name in headers:
                    raise self._fail(f"header {name!r} appears twice")
                headers[name] = value
        except (IndexError, struct.error, UnicodeDecodeError) as exc:
            raise self._fail(f"headers end inside a header ({type(exc).__name__})") from exc
        return headers

    def _read_value(self, data: bytes, at: int) -> tuple[HeaderValue, int]:
        kind = data[at]
        at += 1
        if kind in (0, 1):
            return kind == 0, at
        if kind in _FIXED:
            fmt, size = _FIXED[kind]
            if at + size > len(data):
                raise IndexError(at + size)
            (number,) = struct.unpack_from(fmt, data, at)
            return int(number), at + size
        if kind in (6, 7):
            (length,) = struct.unpack_from("!H", data, at)
            raw = data[at + 2 : at + 2 + length]
            if len(raw) != length:
                raise IndexError(at + 2 + length)
            return (raw.decode("utf-8") if kind == 7 else raw), at + 2 + length
        if kind == _UUID_TYPE:
            raw = data[at : at + _UUID_BYTES]
            if len(raw) != _UUID_BYTES:
                raise IndexError(at + _UUID_BYTES)
            return raw, at + _UUID_BYTES
        raise self._fail(f"header value of unknown type {kind}")

    def _build_event(self, headers: dict[str, HeaderValue], payload: str) -> SSEEvent:
        kind = headers.get(":message-type")
        if kind == "event":
            return SSEEvent(_text(headers.get(":event-type")), payload)
        if kind == "exception":
            return SSEEvent(f"exception:{_text(headers.get(':exception-type'))}", payload)
        if kind == "error":
            message = _text(headers.get(":error-message")) or payload
            return SSEEvent(f"error:{_text(headers.get(':error-code'))}", message)
        raise self._fail(f"frame of unknown :message-type {kind!r}")

    def _fail(self, problem: str) -> EventStreamError:
        # The stream cannot be resynchronised after a bad frame: what follows is dropped.
        self._buffer.clear()
        return EventStreamError(f"malformed event stream frame {self._frames}: {problem}")


def _text(value: HeaderValue | None) -> str:
    return value if isinstance(value, str) else ""
