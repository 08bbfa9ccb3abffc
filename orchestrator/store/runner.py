"""Performing operations and flows (`orchestrator.store.effects`) on a sync or an asyncio Redis client.

redis-py's two clients take the same calls (`execute_command`, a registered script, a pipeline) and differ
only in whether the reply must be awaited, so `send` starts any operation on either; `SyncRunner` takes its
reply, `AsyncRunner` awaits it. A flow is driven step by step: each step performed, its parsed reply sent
back in, until the flow returns (`run_flow`) or, for a stream, ends (`iter_flow`, yielding what it emits).
Redis errors propagate as `redis.RedisError`; an error a parser or a flow raises propagates as it is.

Riding out an outage (a restart, a failover) is the runners' one retry policy, for whoever passes a
`Patience`: an operation Redis could not answer for want of Redis (`is_transient`, the one rule of
`workers.redis_errors`) is sent again with capped, jittered backoff (`workers.redis_retry.build_backoff_s`)
until it is answered or the patience runs out, then
`RedisUnavailableError` (a `redis.ConnectionError` naming the URL, password hidden). A flow never sees the
failure: it gets the reply of the retried operation, so a follower of a stream reads again from the last id
it handed out (nothing lost, nothing repeated). Only operations are retried, never a `BlockingCall`.
Retrying a write is safe for the writes the clients make: `submit.lua` stores a turn id once (a retry finds
it and is a no-op), and a repeated cancel or approval changes nothing (the machine ignores a second one).
Without a patience (the orchestrator runtime's own calls, which retry in their loops) an error propagates at
once, as before.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, assert_never

import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster

from orchestrator.errors import RedisUnavailableError
from orchestrator.store.effects import (
    Batch,
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
from workers import keys
from workers.errors import RedisConfigError
from workers.redis_errors import REDIS_ERRORS, RedisErrorKind, classify, is_cluster_reply, is_transient
from workers.redis_retry import build_backoff_s
from workers.scripts import Script, fill_absent_keys

T = TypeVar("T")
log = logging.getLogger(__name__)
Clock = Callable[[], float]

# How long a client's call without a deadline of its own (submit, get, cancel…) waits for Redis to come back:
# longer than a restart, well under what a web request may take.
DEFAULT_RETRY_S = 10.0


@dataclass(frozen=True)
class Patience:
    """How long a runner retries an operation Redis could not answer: until `until` on `clock`; None: as long
    as it takes (a follower of events, which has no deadline of its own)."""

    until: float | None
    clock: Clock = time.monotonic
    rand: Callable[[], float] = random.random

    @classmethod
    def for_s(
        cls, seconds: float | None, clock: Clock = time.monotonic, rand: Callable[[], float] = random.random
    ) -> Patience:
        """Patience for `seconds` from now (None: endless); `rand` jitters the pauses."""
        return cls(None if seconds is None else clock() + seconds, clock, rand)

    def build_pause_s(self, failures: int) -> float | None:
        """The pause after `failures` failed tries: capped backoff, ending by `until`; None once past it."""
        backoff = build_backoff_s(failures, self.rand)
        if self.until is None:
            return backoff
        left = self.until - self.clock()
        return None if left <= 0 else min(backoff, left)


def find_lost_connection(exc: AttributeError) -> redis.ConnectionError | None:
    """The lost connection behind `exc`, when redis-py's asyncio code raised it on a connection another task
    closed meanwhile (its writer gone: seen in the cluster client's pipeline while a master was replaced);
    None for any other `AttributeError`, a bug to raise."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = tb.tb_frame.f_code.co_filename if tb is not None else ""
    if f"{os.sep}redis{os.sep}asyncio{os.sep}" not in where or "NoneType" not in str(exc):
        return None
    return redis.ConnectionError(f"the connection was lost while it was used ({exc})")


def check_layout(exc: Exception, where: str) -> None:
    """`RedisConfigError` when `exc` says this process takes a Redis Cluster's node for one Redis (a reply
    only a cluster gives, TOOLLOOP_REDIS_CLUSTER unset): no wait mends that, and the person who set it up
    must hear what to set rather than that Redis cannot be reached."""
    if is_cluster_reply(exc) and not keys.is_cluster_layout():
        raise RedisConfigError(
            f"Redis at {where} is a node of a Redis Cluster (it answered {' '.join(str(exc).split())}): set "
            "TOOLLOOP_REDIS_CLUSTER=true, and TOOLLOOP_BROKER_URL, on every process"
        ) from exc


class Outage:
    """The failed tries of one operation: the pause before the next, one log line at the first failure and
    one when Redis answers again, and `RedisUnavailableError` once the patience has run out."""

    def __init__(self, patience: Patience, where: str) -> None:
        self.patience = patience
        self.where = where
        self.failures = 0
        self.since = patience.clock()

    def failed(self, exc: Exception) -> float:
        """The pause before the next try of the operation that raised `exc`; raises when not to retry."""
        check_layout(exc, self.where)
        if not is_transient(exc):
            raise exc
        self.failures += 1
        pause = self.patience.build_pause_s(self.failures)
        waited = self.patience.clock() - self.since
        if pause is None:
            raise RedisUnavailableError(self.where, waited, exc) from exc
        if self.failures == 1:
            log.warning("Redis at %s unavailable (%s); retrying until it is back", self.where, exc)
        return pause

    def ended(self) -> None:
        """The operation was answered: say so if it had failed."""
        if self.failures:
            waited = self.patience.clock() - self.since
            log.info("Redis at %s answered again after %.1f s", self.where, waited)


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
            return registered[script](keys=fill_absent_keys(keys), args=list(args))
        case Transaction(commands=commands):
            if isinstance(client, aiocluster.RedisCluster):
                return _send_transaction_cluster(client, commands)
            pipe = client.pipeline(transaction=True)
            for words in commands:
                pipe.execute_command(*words)
            return pipe.execute()
        case Batch(operations=operations):
            if isinstance(client, aioredis.Redis | aiocluster.RedisCluster):
                return _send_batch_async(client, operations)
            return _send_batch(client, operations)
        case _:
            assert_never(operation)


@functools.cache
def _sha(script: Script) -> str:
    # The name Redis gives a script (EVALSHA).
    return hashlib.sha1(script.source.encode("utf-8")).hexdigest()  # Redis's own naming


def _fill(pipe: Any, operations: tuple[RedisCommand[Any] | ScriptCall[Any], ...]) -> None:
    for op in operations:
        if isinstance(op, ScriptCall):
            # By its words: redis-py blocks a cluster pipeline's `evalsha` method, not the command it routes.
            pipe.execute_command(
                "EVALSHA", _sha(op.script), len(op.keys), *fill_absent_keys(op.keys), *op.args
            )
        else:
            pipe.execute_command(*op.args)


async def _send_transaction_cluster(
    client: aiocluster.RedisCluster, commands: tuple[tuple[str | int | float, ...], ...]
) -> list[Any]:
    # redis-py's asyncio cluster transaction queues each command through `asyncio.run` in a thread of its
    # own: a client not yet initialized would be initialized there, its connections bound to a loop that is
    # then closed. Initialized here first, on this loop (a no-op once done).
    await client.initialize()
    pipe = client.pipeline(transaction=True)
    for words in commands:
        pipe.execute_command(*words)
    return list(await pipe.execute())


def _is_no_script(exc: BaseException) -> bool:
    meaning = classify(exc)
    return meaning is not None and meaning.kind is RedisErrorKind.NO_SCRIPT


def _send_batch(client: Any, operations: tuple[RedisCommand[Any] | ScriptCall[Any], ...]) -> list[Any]:
    # A script the nodes do not know yet (a first use, a restart, a new master) is loaded on every master
    # (SCRIPT LOAD goes to all of a cluster's) and the batch sent again.
    for loaded in (False, True):
        pipe = client.pipeline(transaction=False)
        _fill(pipe, operations)
        try:
            return list(pipe.execute())
        except REDIS_ERRORS as exc:
            if loaded or not _is_no_script(exc):
                raise
            for script in {op.script for op in operations if isinstance(op, ScriptCall)}:
                client.script_load(script.source)
    raise AssertionError("unreachable")


async def _send_batch_async(
    client: Any, operations: tuple[RedisCommand[Any] | ScriptCall[Any], ...]
) -> list[Any]:
    for loaded in (False, True):
        pipe = client.pipeline(transaction=False)
        _fill(pipe, operations)
        try:
            return list(await pipe.execute())
        except REDIS_ERRORS as exc:
            if loaded or not _is_no_script(exc):
                raise
            for script in {op.script for op in operations if isinstance(op, ScriptCall)}:
                await client.script_load(script.source)
    raise AssertionError("unreachable")


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
    """Performs operations and flows on a sync Redis client; `where` names it in errors (password hidden)."""

    def __init__(
        self, client: redis.Redis, *, where: str = "Redis", sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self.client = client
        self.where = where
        self._sleep = sleep
        self._registered: dict[Script, Any] = {}

    def run(self, operation: Operation[T], patience: Patience | None = None) -> T:
        """One round trip: the parsed reply of `operation`, retried while Redis is away within `patience`."""
        if patience is None:
            try:
                return operation.parse(send(self.client, operation, self._registered))
            except REDIS_ERRORS as exc:
                check_layout(exc, self.where)
                raise
        outage = Outage(patience, self.where)
        while True:
            try:
                reply = send(self.client, operation, self._registered)
            except REDIS_ERRORS as exc:
                self._sleep(outage.failed(exc))
                continue
            outage.ended()
            return operation.parse(reply)

    def perform(self, step: Effect | Item[Any], patience: Patience | None = None) -> Any:
        """What a flow gets back for `step` (None for an `Item`)."""
        if isinstance(step, Item):
            return None
        if isinstance(step, BlockingCall):
            return step.call()
        return self.run(step, patience)

    def run_flow(self, flow: Flow[T], patience: Patience | None = None) -> T:
        """Drive `flow` to its end; its result."""
        reply: Any = None
        while not isinstance(step := advance(flow, reply), Done):
            reply = self.perform(step, patience)
        return step.value

    def iter_flow(self, flow: Stream[T], patience: Patience | None = None) -> Iterator[T]:
        """Drive `flow`, yielding each value it emits, as it emits it."""
        reply: Any = None
        while not isinstance(step := advance(flow, reply), Done):
            if isinstance(step, Item):
                yield step.value
            reply = self.perform(step, patience)


class AsyncRunner:
    """`SyncRunner` on an asyncio Redis client; a `BlockingCall` runs in a thread, off the event loop."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        where: str = "Redis",
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.client = client
        self.where = where
        self._sleep = sleep
        self._registered: dict[Script, Any] = {}

    async def run(self, operation: Operation[T], patience: Patience | None = None) -> T:
        """One round trip: the parsed reply of `operation`, retried while Redis is away within `patience`."""
        if patience is None:
            try:
                return operation.parse(await self._send(operation))
            except REDIS_ERRORS as exc:
                check_layout(exc, self.where)
                raise
        outage = Outage(patience, self.where)
        while True:
            try:
                reply = await self._send(operation)
            except REDIS_ERRORS as exc:
                await self._sleep(outage.failed(exc))
                continue
            outage.ended()
            return operation.parse(reply)

    async def _send(self, operation: Operation[T]) -> Any:
        try:
            return await send(self.client, operation, self._registered)
        except AttributeError as exc:
            lost = find_lost_connection(exc)
            if lost is None:
                raise
            raise lost from exc

    async def perform(self, step: Effect | Item[Any], patience: Patience | None = None) -> Any:
        """What a flow gets back for `step` (None for an `Item`)."""
        if isinstance(step, Item):
            return None
        if isinstance(step, BlockingCall):
            return await asyncio.to_thread(step.call)
        return await self.run(step, patience)

    async def run_flow(self, flow: Flow[T], patience: Patience | None = None) -> T:
        """Drive `flow` to its end; its result."""
        reply: Any = None
        while not isinstance(step := advance(flow, reply), Done):
            reply = await self.perform(step, patience)
        return step.value

    async def iter_flow(self, flow: Stream[T], patience: Patience | None = None) -> AsyncIterator[T]:
        """Drive `flow`, yielding each value it emits, as it emits it."""
        reply: Any = None
        while not isinstance(step := advance(flow, reply), Done):
            if isinstance(step, Item):
                yield step.value
            reply = await self.perform(step, patience)
