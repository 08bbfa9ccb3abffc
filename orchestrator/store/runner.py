"""Performing operations and flows (`orchestrator.store.effects`) on a sync or an asyncio Redis client.

redis-py's two clients take the same calls (`execute_command`, a registered script, a pipeline) and differ
only in whether the reply must be awaited, so `send` starts any operation on either; `SyncRunner` takes its
reply, `AsyncRunner` awaits it. A flow is driven step by step: each step performed, its parsed reply sent
back in, until the flow returns (`run_flow`) or, for a stream, ends (`iter_flow`, yielding what it emits).
Redis errors propagate as `redis.RedisError`; an error a parser or a flow raises propagates as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, assert_never

import redis
import redis.asyncio as aioredis

from orchestrator.store.effects import (
    BlockingCall,
    Effect,
    Flow,
    Item,
    Operation,
    RedisCommand,
    ScriptCall,
    Stream,
    Transaction,
)
from workers.scripts import Script

T = TypeVar("T")


def send(client: Any, operation: Operation[Any], registered: dict[Script, Any]) -> Any:
    """Start `operation` on `client`: its raw reply (sync client) or an awaitable of it (asyncio client).

    Scripts are registered on the client once (`registered` is the runner's cache) and called by SHA,
    loaded again by redis-py when Redis has forgotten them."""
    match operation:
        case RedisCommand(args=words):
            return client.execute_command(*words)
        case ScriptCall(script=script, keys=keys, args=args):
            if script not in registered:
                registered[script] = client.register_script(script.source)
            return registered[script](keys=list(keys), args=list(args))
        case Transaction(commands=commands):
            pipe = client.pipeline(transaction=True)
            for words in commands:
                pipe.execute_command(*words)
            return pipe.execute()
        case _:
            assert_never(operation)


@dataclass(frozen=True)
class Done(Generic[T]):
    """A flow's end, with what it returned."""

    value: T


def advance(flow: Generator[Any, Any, T], reply: Any) -> Effect | Item[Any] | Done[T]:
    """Send `reply` into `flow` (None to start it): its next step, or `Done` when it returned."""
    try:
        step: Effect | Item[Any] = flow.send(reply)
    except StopIteration as stop:
        return Done(stop.value)
    return step


class SyncRunner:
    """Performs operations and flows on a sync Redis client."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._registered: dict[Script, Any] = {}

    def run(self, operation: Operation[T]) -> T:
        """One round trip: the parsed reply of `operation`."""
        return operation.parse(send(self.client, operation, self._registered))

    def perform(self, step: Effect | Item[Any]) -> Any:
        """What a flow gets back for `step` (None for an `Item`)."""
        if isinstance(step, Item):
            return None
        if isinstance(step, BlockingCall):
            return step.call()
        return self.run(step)

    def run_flow(self, flow: Flow[T]) -> T:
        """Drive `flow` to its end; its result."""
        reply: Any = None
        while not isinstance(step := advance(flow, reply), Done):
            reply = self.perform(step)
        return step.value

    def iter_flow(self, flow: Stream[T]) -> Iterator[T]:
        """Drive `flow`, yielding each value it emits, as it emits it."""
        reply: Any = None
        while not isinstance(step := advance(flow, reply), Done):
            if isinstance(step, Item):
                yield step.value
            reply = self.perform(step)


class AsyncRunner:
    """`SyncRunner` on an asyncio Redis client; a `BlockingCall` runs in a thread, off the event loop."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self._registered: dict[Script, Any] = {}

    async def run(self, operation: Operation[T]) -> T:
        """One round trip: the parsed reply of `operation`."""
        return operation.parse(await send(self.client, operation, self._registered))

    async def perform(self, step: Effect | Item[Any]) -> Any:
        """What a flow gets back for `step` (None for an `Item`)."""
        if isinstance(step, Item):
            return None
        if isinstance(step, BlockingCall):
            return await asyncio.to_thread(step.call)
        return await self.run(step)

    async def run_flow(self, flow: Flow[T]) -> T:
        """Drive `flow` to its end; its result."""
        reply: Any = None
        while not isinstance(step := advance(flow, reply), Done):
            reply = await self.perform(step)
        return step.value

    async def iter_flow(self, flow: Stream[T]) -> AsyncIterator[T]:
        """Drive `flow`, yielding each value it emits, as it emits it."""
        reply: Any = None
        while not isinstance(step := advance(flow, reply), Done):
            if isinstance(step, Item):
                yield step.value
            reply = await self.perform(step)
