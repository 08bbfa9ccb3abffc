"""The chunked transfer coding of an HTTP/1.1 answer's body (RFC 9112 §7.1), decoded as the bytes come.

Why not h11's own reader: it makes one event per chunk, each through its state machine, and a streamed model
answer is hundreds of small chunks (one per SSE event) — per chunk, that was as much CPU as reading the event
itself. `ChunkedDecoder.feed` takes whatever one socket read brought and returns the data of every chunk in
it at once. h11 still reads the answer's head (status, headers), and bodies framed otherwise.

Malformed framing is a value: `feed` returns the data decoded before the fault and sets `error`, so that the
caller hands on what arrived intact before it reports the error. Chunk extensions and trailer fields are read
past and ignored, as h11 does.
"""

from __future__ import annotations

import enum

import h11

# A chunk-size line or a trailer field longer than this is refused rather than buffered without end.
MAX_LINE_BYTES = 16 * 1024
_CRLF = b"\r\n"


class _Part(enum.Enum):
    SIZE = enum.auto()  # a chunk-size line
    DATA = enum.auto()  # the chunk's data
    DATA_END = enum.auto()  # the CRLF after it
    TRAILER = enum.auto()  # trailer fields, up to an empty line
    DONE = enum.auto()


class ChunkedDecoder:
    """Feed the body's bytes as they arrive; `done` once its last chunk and trailer section are read."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._part = _Part.SIZE
        self._left = 0  # data bytes of the current chunk still to come
        # Bytes past the end of the body: a server that sent more than one answer (never reuse it).
        self.extra = b""
        # Why the framing is malformed; nothing more is decoded once set.
        self.error: str | None = None

    @property
    def done(self) -> bool:
        return self._part is _Part.DONE

    def feed(self, data: bytes) -> bytes:
        """The data of the chunks `data` completes or continues, joined (maybe b'')."""
        if self.error is not None:
            return b""
        if self._part is _Part.DONE:
            self.extra += data
            return b""
        buffer = self._buffer
        buffer += data
        out: list[bytes] = []
        position = 0
        while self.error is None and (advanced := self._step(buffer, position, out)) is not None:
            position = advanced
        del buffer[:position]
        if self.done and buffer:
            self.extra, buffer[:] = bytes(buffer), b""
        return b"".join(out)

    def _step(self, buffer: bytearray, position: int, out: list[bytes]) -> int | None:
        """Read one part at `position`; the position after it, None when it needs more bytes."""
        part = self._part
        if part is _Part.DATA:
            take = min(self._left, len(buffer) - position)
            if not take:
                return None
            out.append(bytes(buffer[position : position + take]))
            self._left -= take
            if not self._left:
                self._part = _Part.DATA_END
            return position + take
        if part is _Part.DATA_END:
            if len(buffer) - position < 2:
                return None
            if buffer[position : position + 2] != _CRLF:
                self.error = "a chunk's data does not end with CRLF"
                return None
            self._part = _Part.SIZE
            return position + 2
        if part is _Part.DONE:
            return None
        end = buffer.find(_CRLF, position)
        if end < 0:
            if len(buffer) - position > MAX_LINE_BYTES:
                self.error = "a chunk-size line or trailer field is too long"
            return None
        if part is _Part.SIZE:
            self._read_size(bytes(buffer[position:end]))
        elif end == position:  # the empty line that ends the trailer section, and the body
            self._part = _Part.DONE
        return end + 2

    def _read_size(self, line: bytes) -> None:
        digits = line.split(b";", 1)[0].rstrip(b" \t")
        if not digits or len(digits) > 16 or digits.strip(b"0123456789abcdefABCDEF"):
            self.error = f"malformed chunk size {line[:40]!r}"
            return
        size = int(digits, 16)
        if size:
            self._part, self._left = _Part.DATA, size
        else:
            self._part = _Part.TRAILER


def is_chunked(method: bytes, answer: h11.Response) -> bool:
    """Whether `answer` to a `method` request has a chunked body, by h11's framing rules: no body for these
    whatever the headers say; else Transfer-Encoding (h11 takes `chunked` only, and has refused any other)."""
    if answer.status_code in (204, 304) or method == b"HEAD":
        return False
    return any(name.lower() == b"transfer-encoding" for name, _ in answer.headers)


def keeps_alive(request_headers: list[tuple[bytes, bytes]], answer: h11.Response) -> bool:
    """h11's keep-alive rule, for an answer whose body h11 does not read: HTTP/1.1, and no
    `Connection: close` in either head."""
    values = [value for name, value in [*request_headers, *answer.headers] if name.lower() == b"connection"]
    if any(b"close" in (token.strip().lower() for token in value.split(b",")) for value in values):
        return False
    return answer.http_version >= b"1.1"
