"""Tools that start child processes of every kind (`TOOLLOOP_TOOL_MODULES=tests.faults.descendant_tools`).

Each starts `sleep 600` four ways and writes each one's pid to `<record_dir>/<kind>.pid`:

    group        subprocess.Popen: a child in the pool process's process group
    session      subprocess.Popen(start_new_session=True): a child in a session of its own
    detached     a double fork into a new session (the classic daemon): a grandchild whose parent has exited
    background   `sh -c "sleep 600 &"`: a grandchild left in the pool process's group by a shell that exited

`spawn_and_hang` then never returns (only its hard limit ends it); `spawn_and_return` returns at once.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from workers import tool

KINDS = ("group", "session", "detached", "background")
SLEEP = ["sleep", "600"]


def spawn_children(record_dir: Path) -> None:
    """Start one `sleep 600` of each kind in `KINDS` and record its pid under `record_dir`."""
    record_dir.mkdir(parents=True, exist_ok=True)
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    _record(record_dir, "group", subprocess.Popen(SLEEP, **quiet).pid)
    _record(record_dir, "session", subprocess.Popen(SLEEP, start_new_session=True, **quiet).pid)
    _record(record_dir, "detached", _double_fork())
    shell = subprocess.run(
        ["sh", "-c", "sleep 600 >/dev/null 2>&1 </dev/null & echo $!"], capture_output=True, check=True
    )
    _record(record_dir, "background", int(shell.stdout))


def _double_fork() -> int:
    """A daemon: fork, new session, fork again and exec; the middle process exits at once."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read_end)
            os.setsid()
            grandchild = os.fork()
            if grandchild == 0:
                os.close(write_end)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execvp(SLEEP[0], SLEEP)
            os.write(write_end, str(grandchild).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        pid = int(pipe.read())
    os.waitpid(middle, 0)
    return pid


def _record(record_dir: Path, kind: str, pid: int) -> None:
    (record_dir / f"{kind}.pid").write_text(str(pid))


@tool(soft_time_limit=1, time_limit=2)
def spawn_and_hang(record_dir: str) -> str:
    """Starts children of every kind, then never returns: swallows everything, the soft limit included."""
    spawn_children(Path(record_dir))
    while True:
        with contextlib.suppress(BaseException):
            time.sleep(0.05)


@tool(soft_time_limit=5, time_limit=10)
def spawn_and_return(record_dir: str) -> str:
    """Starts children of every kind and returns, leaving them running."""
    spawn_children(Path(record_dir))
    return "spawned"
