"""The store, client and API tests' own Redis database, and what an orchestrator writes into it.

A database of their own, so that flushing it never touches the catalogue or queues that session-wide workers
keep in database 0:

    url = empty_db_url(redis_url)                    # database STORE_TEST_DB, emptied
    await wait_blocked(store.redis, "xread", reader)   # once Redis lists the reader as blocked (CLIENT LIST)
    finish_in_thread(redis_url, turn_id).join()      # a turn's last events and outcome, from another thread

A test that needs a reader blocked before it writes waits until Redis lists that reader as blocked in its
command; none measures how long a read took.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis

from orchestrator.model import AssistantMessage, TurnOutcome, UserMessage
from orchestrator.store.turns import TurnStore
from tests.support.waiting import async_wait_until, wait_until

STORE_TEST_DB = 3


def store_db_url(redis_url: str, db: int = STORE_TEST_DB) -> str:
    """`redis_url` pointed at database `db`."""
    parts = urlsplit(redis_url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def empty_db_url(redis_url: str, db: int = STORE_TEST_DB) -> str:
    """`store_db_url`, that database emptied first: what a test of the API or the clients starts from."""
    url = store_db_url(redis_url, db)
    flusher = redis.Redis.from_url(url)
    try:
        flusher.flushdb()
    finally:
        flusher.close()
    return url


def is_blocked(clients: Iterable[Mapping[str, Any]], command: str) -> bool:
    """Whether CLIENT LIST's `clients` show a client of the test database blocked in `command` (`xread`,
    `blmove`)."""
    return any(c["db"] == str(STORE_TEST_DB) and c["cmd"] == command and "b" in c["flags"] for c in clients)


def blocked_in(redis_url: str, command: str) -> bool:
    """Whether a client of the test database is blocked in `command` now."""
    with redis.Redis.from_url(store_db_url(redis_url), decode_responses=True) as admin:
        return is_blocked(admin.client_list(), command)


async def wait_blocked(admin: aioredis.Redis, command: str, reader: asyncio.Task[Any]) -> None:
    """Until a client of the test database is blocked in `command` (as `admin`, any client of that Redis,
    reads CLIENT LIST): the reader's read, unless the reader ended first (the caller's assertions then show
    why)."""

    async def blocked() -> bool:
        return reader.done() or is_blocked(await admin.client_list(), command)

    await async_wait_until(blocked, f"a reader blocked in {command.upper()}")


class Finisher(threading.Thread):
    """What an orchestrator does at the end of a turn, from another thread: once a reader of the test
    database is blocked in XREAD (the client waiting, or streaming the events; unless `wait_reader` is
    off), and `quiet_s` more of silence, the turn's last `events` and its outcome. `join` raises what went
    wrong in the thread."""

    def __init__(
        self, redis_url: str, turn_id: str, events: tuple[str, ...], quiet_s: float, wait_reader: bool
    ) -> None:
        super().__init__(name=f"finish-{turn_id}", daemon=True)
        self.redis_url, self.turn_id, self.events = redis_url, turn_id, events
        self.quiet_s, self.wait_reader = quiet_s, wait_reader
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.wait_reader:
                wait_until(lambda: blocked_in(self.redis_url, "xread"), "a reader blocked in XREAD")
            # Silence longer than a socket timeout, where a test needs it: a scenario, not a synchronisation.
            time.sleep(self.quiet_s)
            asyncio.run(self._finish())
        except BaseException as exc:  # re-raised by join, in the test's thread
            self.error = exc

    async def _finish(self) -> None:
        store = TurnStore.from_url(store_db_url(self.redis_url))
        try:
            for name in self.events:
                await store.append_event(self.turn_id, name, {"turn_id": self.turn_id})
            outcome = TurnOutcome(
                turn_id=self.turn_id,
                status="completed",
                text="4",
                messages=[UserMessage(content="2+2?"), AssistantMessage(content="4")],
                llm_calls=1,
            )
            await store.save_outcome(self.turn_id, outcome)
        finally:
            await store.aclose()

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error


def finish_in_thread(
    redis_url: str,
    turn_id: str,
    events: tuple[str, ...] = (),
    *,
    quiet_s: float = 0.0,
    wait_reader: bool = True,
) -> Finisher:
    """Start a `Finisher` of the turn."""
    thread = Finisher(redis_url, turn_id, events, quiet_s, wait_reader)
    thread.start()
    return thread
