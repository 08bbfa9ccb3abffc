"""Large records compressed as they go into Redis, and put back as they come out (pure, no I/O).

A tool call's result travels twice through Redis (the worker's outcome, then the turn's history) and stays
there as long as its conversation does: a large one is what a turn's storage is made of. So the two records
that carry results, a tool outcome (`workers.contract`) and a history entry (`orchestrator.store.history`),
are stored zlib-compressed once their JSON reaches `MIN_BYTES`: `MARKER`, then zlib's stream. No JSON text
starts with a NUL byte, so a reader tells the two forms apart by the first byte, and reads records written
before compression (or below the threshold) as they are.

Readers whose Redis client decodes replies get the compressed bytes as text decoded with `surrogateescape`
(`workers.connect.build_redis_options`), which gives the same bytes back: `unpack` takes either.

One switch per process (`use_compression`, from `TOOLLOOP_COMPRESSION` at import, set again by the settings):
`off` writes plain JSON, for a deployment that still runs a release whose readers know no compressed record
(docs/operations/deploying.md). Reading never depends on it.
"""

from __future__ import annotations

import os
import zlib

COMPRESSION_VARIABLE = "TOOLLOOP_COMPRESSION"
MARKER = b"\x00"
# Below this a record is left as it is: zlib's own framing and the time spent would outweigh the saving.
MIN_BYTES = 1024
# zlib's default level.
_LEVEL = 6
_ESCAPE = "surrogateescape"


# Anything but `off` compresses here; the settings refuse a value they do not know, with its name.
_compressing = os.environ.get(COMPRESSION_VARIABLE, "").strip().lower() != "off"


def use_compression(on: bool) -> None:
    """Compress the records this process writes from now on (or not)."""
    global _compressing  # noqa: PLW0603  # one switch per process, like the key layout
    _compressing = on


def is_compressing() -> bool:
    """Whether this process writes large records compressed."""
    return _compressing


def pack(text: str) -> str | bytes:
    """The stored form of a record's JSON: as it is when small (or with compression off), else `MARKER` and
    its zlib stream, when that is smaller."""
    if not _compressing or len(text) < MIN_BYTES:
        return text
    raw = text.encode("utf-8")
    packed = MARKER + zlib.compress(raw, _LEVEL)
    return packed if len(packed) < len(raw) else text


def unpack(value: str | bytes) -> str:
    """A record's JSON from its stored form (`pack`'s), as read by any client: bytes, or text decoded with
    `surrogateescape`."""
    if isinstance(value, str):
        if not value.startswith("\x00"):
            return value
        value = value.encode("utf-8", _ESCAPE)
    elif not value.startswith(MARKER):
        return value.decode("utf-8")
    try:
        return zlib.decompress(value[1:]).decode("utf-8")
    except zlib.error as error:
        raise ValueError(f"a compressed record that does not decompress: {error}") from error


def stored_size(value: str | bytes) -> int:
    """The bytes Redis holds for a stored form."""
    return len(value) if isinstance(value, bytes) else len(value.encode("utf-8", _ESCAPE))
