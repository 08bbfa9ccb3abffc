"""`toolloop orchestrator` raises its soft limit on open files for the model calls it may have in flight.

Every model call in flight holds a socket (`TOOLLOOP_MODEL_MAX_CONNECTIONS`, default 1000), and a soft limit
of 1024 is common (systemd's default): the orchestrator raises it towards what it needs, within the hard
limit, and says so when the hard limit is lower. Run in a child process, whose limits the test sets.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, {hard}))
from orchestrator.commands.turns import raise_open_files_limit
print(raise_open_files_limit({needed}), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def probe(needed: int, hard: str) -> tuple[list[int], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(needed=needed, hard=hard)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [int(word) for word in done.stdout.split()], done.stderr


def test_the_soft_limit_is_raised_to_what_the_model_calls_need() -> None:
    limits, said = probe(1256, "hard")
    assert limits == [1256, 1256] and "open files are limited" not in said


def test_a_hard_limit_below_the_need_is_used_and_said() -> None:
    limits, said = probe(1256, "512")
    assert limits == [512, 512]
    assert "open files are limited to 512 (hard limit)" in said
    assert "lower TOOLLOOP_MODEL_MAX_CONNECTIONS" in said
