"""What the stores ask of Redis, as values (sans-IO): an operation and the parser of its reply.

An `Operation` is one round trip — a `RedisCommand`, a `ScriptCall`, a `Transaction` or a `Batch` —
built by a pure function of `orchestrator.store.operations`, with the function that turns the raw reply
into a typed value.
A flow (`orchestrator.store.flows`, `orchestrator.client.direct`) is a generator that yields effects and
receives their parsed replies, so each multi-step flow is written once; a runner (`orchestrator.store.runner`)
performs it on a sync or an asyncio Redis client. An `Effect` is an operation or a `BlockingCall` (a
blocking call that is not Redis: a Celery publish, run in a thread under asyncio); a stream may also yield an
`Item`, a value handed to whoever iterates it (an event of a followed turn).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from workers.scripts import Script

T = TypeVar("T")


@dataclass(frozen=True)
class RedisCommand(Generic[T]):
    """One Redis command (its words, as for redis-py's `execute_command`) and the parser of its reply."""

    args: tuple[str | bytes | int | float, ...]
    parse: Callable[[Any], T]


@dataclass(frozen=True)
class ScriptCall(Generic[T]):
    """One call of a Lua script with its KEYS and ARGV, and the parser of its reply."""

    script: Script
    keys: tuple[str, ...]
    args: tuple[str | bytes, ...]
    parse: Callable[[Any], T]


@dataclass(frozen=True)
class Transaction(Generic[T]):
    """Commands run together in one MULTI/EXEC; `parse` gets the list of their (callback-parsed) replies."""

    commands: tuple[tuple[str | int | float, ...], ...]
    parse: Callable[[list[Any]], T]


@dataclass(frozen=True)
class Batch(Generic[T]):
    """Commands and scripts sent together in one pipeline, without a transaction: on a Redis Cluster each goes
    to the master of its own slot (redis-py's cluster pipeline groups them by node), so keys of many turns are
    read or written in one round trip per node. `combine` gets each one's parsed reply, in order."""

    operations: tuple[RedisCommand[Any] | ScriptCall[Any], ...]
    combine: Callable[[list[Any]], T]

    def parse(self, replies: list[Any]) -> T:
        """Each reply parsed by its operation, then combined."""
        return self.combine([op.parse(r) for op, r in zip(self.operations, replies, strict=True)])


@dataclass(frozen=True)
class BlockingCall(Generic[T]):
    """A blocking call that is not Redis (publishing to Celery): the async runner runs it in a thread."""

    call: Callable[[], T]


@dataclass(frozen=True)
class Item(Generic[T]):
    """A value a flow hands to its consumer (`iter_flow`); the flow gets None back."""

    value: T


Operation: TypeAlias = RedisCommand[T] | ScriptCall[T] | Transaction[T] | Batch[T]
Effect: TypeAlias = RedisCommand[Any] | ScriptCall[Any] | Transaction[Any] | Batch[Any] | BlockingCall[Any]
# A flow yields steps, receives each one's parsed reply, and returns its result.
Flow: TypeAlias = Generator[Effect, Any, T]
# A flow whose consumer iterates the values it emits.
Stream: TypeAlias = Generator[Effect | Item[T], Any, None]


def parse_reply(reply: Any) -> Any:
    """The parser of an operation whose reply nobody reads."""
    return reply
