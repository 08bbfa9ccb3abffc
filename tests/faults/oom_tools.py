"""The tool of the Redis out-of-memory fault test (`TOOLLOOP_TOOL_MODULES=tests.faults.oom_tools`).

`oom_bulky` returns about `kilobytes` kB, kept whole in its outcome (no truncation), so a burst of them fills
a Redis with a small `maxmemory`: random text, since a large outcome is stored compressed and a repeated
letter would shrink to almost nothing (random base64 keeps about three quarters). It records that its body
finished in a file, not in Redis: a Redis that refuses writes could not keep that record, and the test must
know which results existed to tell whether one was lost.
"""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

from workers import tool

# Larger than any result the test asks for, so the outcome carries the whole of it.
MAX_RESULT_BYTES = 1024 * 1024


@tool(max_result_bytes=MAX_RESULT_BYTES, soft_time_limit=20, time_limit=30)
def oom_bulky(tag: str, record_dir: str, kilobytes: int = 200, seconds: float = 0.05) -> str:
    """About `kilobytes` kB of text; appends `tag` to `<record_dir>/finished` once the body has finished."""
    time.sleep(seconds)
    body = f"{tag} " + base64.b64encode(os.urandom(kilobytes * 768)).decode()
    # One small O_APPEND write per line: lines of concurrent pool processes never interleave.
    fd = os.open(Path(record_dir) / "finished", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{tag}\n".encode())
    finally:
        os.close(fd)
    return body


def read_finished(record_dir: str | Path) -> set[str]:
    """The tags whose body finished."""
    path = Path(record_dir) / "finished"
    return set(path.read_text().split()) if path.exists() else set()
