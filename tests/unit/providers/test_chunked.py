"""`ChunkedDecoder`: the chunked coding of an answer's body decoded per read, as h11 would read it."""

from __future__ import annotations

import h11
import pytest

from orchestrator.providers.chunked import MAX_LINE_BYTES, ChunkedDecoder, is_chunked, keeps_alive

BODY = b"5\r\nhello\r\n1;name=value\r\n \r\n6\r\nworld!\r\n0\r\nExpires: never\r\n\r\n"


def decode_in(pieces: list[bytes]) -> tuple[bytes, ChunkedDecoder]:
    decoder = ChunkedDecoder()
    return b"".join(decoder.feed(piece) for piece in pieces), decoder


def test_a_body_in_one_piece_is_its_chunks_joined_extensions_and_trailers_read_past() -> None:
    data, decoder = decode_in([BODY])
    assert data == b"hello world!"
    assert decoder.done and decoder.error is None and decoder.extra == b""


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_split_anywhere_the_body_decodes_the_same(size: int) -> None:
    pieces = [BODY[i : i + size] for i in range(0, len(BODY), size)]
    data, decoder = decode_in(pieces)
    assert data == b"hello world!"
    assert decoder.done


def test_each_read_gives_what_it_completed_and_no_more() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"5\r\nhel") == b"hel"
    assert decoder.feed(b"lo\r\n3\r") == b"lo"
    assert decoder.feed(b"\nabc\r\n") == b"abc"
    assert not decoder.done
    assert decoder.feed(b"0\r\n\r\n") == b""
    assert decoder.done


def test_upper_case_hex_and_spaces_before_an_extension() -> None:
    data, decoder = decode_in([b"A \t;x\r\n0123456789\r\n0\r\n\r\n"])
    assert data == b"0123456789" and decoder.done


@pytest.mark.parametrize(
    ("body", "kept"),
    [
        (b"zz\r\nhello\r\n", b""),
        (b"5\r\nhello\r\n-1\r\n", b"hello"),
        (b"\r\n", b""),
        (b"5\r\nhelloXY3\r\nabc\r\n", b"hello"),
        (b"11111111111111111\r\n", b""),
    ],
)
def test_malformed_framing_is_an_error_after_the_data_before_it(body: bytes, kept: bytes) -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(body) == kept
    assert decoder.error is not None
    assert decoder.feed(b"3\r\nabc\r\n") == b""  # nothing more once broken
    assert not decoder.done


def test_a_size_line_without_end_is_refused_past_its_limit() -> None:
    decoder = ChunkedDecoder()
    assert decoder.feed(b"5" * MAX_LINE_BYTES) == b""
    assert decoder.error is None
    decoder.feed(b"5")
    assert decoder.error == "a chunk-size line or trailer field is too long"


def test_bytes_after_the_body_are_kept_apart() -> None:
    data, decoder = decode_in([b"2\r\nok\r\n0\r\n\r\nHTTP/1.1 200", b" OK"])
    assert data == b"ok"
    assert decoder.extra == b"HTTP/1.1 200 OK"


def answer(
    status: int = 200, headers: list[tuple[bytes, bytes]] | None = None, version: bytes = b"1.1"
) -> h11.Response:
    return h11.Response(status_code=status, headers=headers or [], http_version=version)


def test_framing_and_keep_alive_as_h11_decides_them() -> None:
    chunked = [(b"Transfer-Encoding", b"chunked")]
    assert is_chunked(b"POST", answer(headers=chunked))
    assert not is_chunked(b"HEAD", answer(headers=chunked))
    assert not is_chunked(b"POST", answer(304, chunked))
    assert not is_chunked(b"POST", answer(headers=[(b"content-length", b"3")]))
    assert keeps_alive([], answer())
    assert not keeps_alive([], answer(headers=[(b"connection", b"keep-alive, Close")]))
    assert not keeps_alive([(b"Connection", b"close")], answer())
    assert not keeps_alive([], answer(version=b"1.0"))
