"""Tool-task messages written into the broker's lists by the orchestrator's own Redis client (pure).

When the broker is the state Redis (no `TOOLLOOP_BROKER_URL`), the orchestrator does not need kombu's
connection to publish: `orchestrator.publishing.wire` asks kombu's Redis channel which commands a batch of
messages is (the very LPUSH, PEXPIRE and PUBLISH it would pipeline, with its keys and bytes), and
`write_tasks` runs them as one script call on the asyncio client the orchestrator already holds: one round
trip from the event loop, which a Redis refusing writes (out of memory, read-only) refuses as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.store import scripts
from orchestrator.store.effects import ScriptCall

# The opcode of each verb in `write_tasks.lua`, and whether its first argument is a key (KEYS) or not.
_OPCODES: dict[str, tuple[str, bool]] = {
    "lpush": ("L", True),
    "pexpire": ("E", True),
    "publish": ("P", False),
}


@dataclass(frozen=True)
class BrokerCommand:
    """One command kombu's Redis transport would run to publish a message: its verb and arguments."""

    verb: str  # "lpush", "pexpire" or "publish" (`is_writable`)
    args: tuple[str, ...]


def is_writable(verb: str) -> bool:
    """Whether `write_tasks` can run a command of this verb (kombu might one day use another)."""
    return verb in _OPCODES


def write_tasks(commands: Sequence[BrokerCommand]) -> ScriptCall[int]:
    """Run `commands` in one script call, in order; the reply is how many ran."""
    keys: list[str] = []
    argv: list[str] = []
    for command in commands:
        opcode, keyed = _OPCODES[command.verb]
        first, *rest = command.args
        if keyed:
            keys.append(first)
            argv += [opcode, *rest]
        else:
            argv += [opcode, first, *rest]
    return ScriptCall(scripts.WRITE_TASKS, tuple(keys), tuple(argv), _count)


def _count(reply: Any) -> int:
    return int(reply)
