"""Signalling the process group a test started, and never another one by the same number.

A test starts its processes in a session of their own (`start_new_session=True`), so that one `killpg`
ends a worker with its pool, or a `toolloop` command with the redis-server it started. The group's id is
its leader's pid. pid_max is 32768 on these machines and a suite run starts far more processes than that:
once the leader is reaped, its pid (and so the group id) can be handed to another test's process, and a
`killpg` then ends that one's group instead — a redis-server, an orchestrator, a worker of a test that has
nothing to do with this one. The kernel hands out neither number while any process of the group lives.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Any


def signal_group(process: subprocess.Popen[Any], signum: int) -> None:
    """Send `signum` to the group `process` leads, unless its id is another group's by now: once `process`
    is reaped, a live process with its pid means the number was handed out again."""
    if process.poll() is not None and pid_exists(process.pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def group_alive(process: subprocess.Popen[Any]) -> bool:
    """Whether any process of the group `process` leads is still there (a number handed out again, once
    `process` is reaped, says nothing of it: the kernel reuses none while the group lives)."""
    if process.poll() is not None and pid_exists(process.pid):
        return False
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_process(process: subprocess.Popen[Any], signum: int) -> None:
    """Send `signum` to `process` itself while it has not been reaped (its pid is its own until then)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)


def pid_exists(pid: int) -> bool:
    """Whether any process has this pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
