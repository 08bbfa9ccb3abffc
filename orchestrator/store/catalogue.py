"""Reading the live tool catalogue that workers publish to Redis, sync and async.

`get_catalogue` is the operation (`orchestrator.store.effects`); `read_catalogue` / `aread_catalogue` run it
on a sync or an asyncio client. `get_tool_catalogue` reads it together with when each tool was last served
(`workers.catalogue`, `keys.TOOLS_SERVED`), as a `ToolCatalogue`: what tells a tool whose worker is
restarting (its calls wait in their queue) from one that is gone (`not_found`), by
`machine.validation.classify_tool` and TOOLLOOP_TOOL_GONE_AFTER_S. `LiveCatalogue` is the orchestrator's
view at dispatch time: read at most once per `LIVE_CATALOGUE_MAX_AGE_S`, so a burst of dispatches costs one
read. `RecentCatalogue` is a client's, for checking the tools a submitted turn names: a burst of submits
costs one read too.

The orchestrator never imports tool code: this merged view (name → ToolSpec) is all it knows of tools.
Entries of workers not seen for `keys.CATALOGUE_STALE_S` are ignored; when several live workers serve a
tool, the most recently published spec wins.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis
from pydantic import ValidationError

from orchestrator.machine.validation import ToolAvailability, classify_tool
from orchestrator.store.effects import RedisCommand, Transaction
from orchestrator.store.runner import AsyncRunner, SyncRunner
from workers import keys
from workers.contract import ToolSpec

logger = logging.getLogger(__name__)


# How long the dispatcher trusts its last read: well under a worker's refresh period, so a stopped worker
# (whose entry its clean shutdown removes) is noticed within about a second.
LIVE_CATALOGUE_MAX_AGE_S = 1.0

# Parsed entries by (worker, raw JSON): every turn started while a worker's entry is unchanged gets the same
# (frozen) ToolSpec objects instead of a private copy each — a parked turn's state shares them.
_PARSED_MAX = 256
_parsed: dict[tuple[bytes | str, bytes | str], tuple[float, list[ToolSpec]] | None] = {}


def build_catalogue(
    entries: Mapping[bytes | str, bytes | str], now: float, stale_s: float = keys.CATALOGUE_STALE_S
) -> dict[str, ToolSpec]:
    """Merge the raw catalogue hash into name → ToolSpec, skipping stale and malformed entries."""
    newest: dict[str, tuple[float, ToolSpec]] = {}
    for worker, raw in entries.items():
        parsed = _parse_entry(worker, raw)
        if parsed is None:
            continue
        seen_at, specs = parsed
        if now - seen_at > stale_s:
            continue
        for spec in specs:
            if spec.name not in newest or newest[spec.name][0] < seen_at:
                newest[spec.name] = (seen_at, spec)
    return {name: newest[name][1] for name in sorted(newest)}


def _parse_entry(worker: bytes | str, raw: bytes | str) -> tuple[float, list[ToolSpec]] | None:
    key = (worker, raw)
    if key in _parsed:
        return _parsed[key]
    parsed: tuple[float, list[ToolSpec]] | None
    try:
        entry = json.loads(raw)
        parsed = float(entry["seen_at"]), [ToolSpec.model_validate(item) for item in entry["tools"]]
    except (ValueError, KeyError, TypeError, ValidationError):
        logger.warning("ignoring a malformed catalogue entry of worker %r", worker)
        parsed = None
    if len(_parsed) >= _PARSED_MAX:
        # Workers republish every CATALOGUE_REFRESH_S with a new `seen_at`: old entries are never asked for
        # again, so forgetting them all at once is as good as an LRU and simpler.
        _parsed.clear()
    _parsed[key] = parsed
    return parsed


@dataclass(frozen=True)
class ToolCatalogue:
    """The tools live workers serve now (`live`), and of every tool recently served, when a worker last
    served it and its spec then (`served`: name → (epoch seconds, spec))."""

    live: dict[str, ToolSpec] = field(default_factory=dict)
    served: dict[str, tuple[float, ToolSpec]] = field(default_factory=dict)

    def availability(self, name: str, now: float, gone_after_s: float) -> ToolAvailability:
        """Whether a call of `name` is sent to a live worker, sent to wait for one, or `not_found`."""
        served_at = {name: self.served[name][0]} if name in self.served else {}
        return classify_tool(name, self.live, served_at, now, gone_after_s)

    def known(self, now: float, gone_after_s: float) -> dict[str, ToolSpec]:
        """Every tool a call may be sent to (by name, sorted): the live ones, with their live specs, and the
        ones a worker served within `gone_after_s`, with the spec it served."""
        known = dict(self.live)
        for name, (_, spec) in self.served.items():
            waiting = ToolAvailability.WAITING_FOR_WORKER
            if name not in known and self.availability(name, now, gone_after_s) is waiting:
                known[name] = spec
        return {name: known[name] for name in sorted(known)}


def build_served(entries: Mapping[bytes | str, bytes | str]) -> dict[str, tuple[float, ToolSpec]]:
    """The served-tools hash as name → (served_at, spec), skipping malformed fields."""
    served: dict[str, tuple[float, ToolSpec]] = {}
    for name, raw in entries.items():
        try:
            entry = json.loads(raw)
            spec = ToolSpec.model_validate(entry["spec"])
            served[spec.name] = (float(entry["served_at"]), spec)
        except (ValueError, KeyError, TypeError, ValidationError):
            logger.warning("ignoring a malformed served-tool record %r", name)
    return served


def get_tool_catalogue(now: float) -> Transaction[ToolCatalogue]:
    """The operation that reads the live catalogue and the served-tools record together (one MULTI)."""
    commands = (("HGETALL", keys.CATALOGUE), ("HGETALL", keys.TOOLS_SERVED))
    return Transaction(
        commands, lambda replies: ToolCatalogue(build_catalogue(replies[0], now), build_served(replies[1]))
    )


class RecentCatalogue:
    """The catalogue a client read last, trusted for `LIVE_CATALOGUE_MAX_AGE_S` when it has every tool asked.

    A tool missing from it is never taken as gone: the caller reads again (a worker may have just come up),
    as `LiveCatalogue` does. One that left within the last second is still accepted: the orchestrator's own
    view of the catalogue answers its calls (`not_found`). Safe to share between threads: the view is one
    attribute, replaced whole.
    """

    def __init__(self, max_age_s: float = LIVE_CATALOGUE_MAX_AGE_S) -> None:
        self._max_age_s = max_age_s
        self._view: tuple[float, ToolCatalogue] | None = None

    def serving(
        self, names: Sequence[str], now: float, gone_after_s: float = keys.TOOL_GONE_AFTER_S
    ) -> dict[str, ToolSpec] | None:
        """The tools a call may be sent to (`ToolCatalogue.known`), if read less than `max_age_s` before
        `now` and they include all of `names`; else None."""
        view = self._view
        if view is None or not 0 <= now - view[0] < self._max_age_s:
            return None
        catalogue = view[1].known(now, gone_after_s)
        return catalogue if all(name in catalogue for name in names) else None

    def keep(self, catalogue: ToolCatalogue, read_at: float) -> None:
        """Remember a catalogue read at `read_at`."""
        self._view = (read_at, catalogue)


def get_catalogue(now: float) -> RedisCommand[dict[str, ToolSpec]]:
    """The operation that reads the catalogue hash and merges it as of `now` (epoch seconds)."""
    return RedisCommand(("HGETALL", keys.CATALOGUE), lambda entries: build_catalogue(entries, now))


def read_catalogue(client: redis.Redis) -> dict[str, ToolSpec]:
    """The live catalogue, read with a sync client."""
    return SyncRunner(client).run(get_catalogue(time.time()))


async def aread_catalogue(client: aioredis.Redis) -> dict[str, ToolSpec]:
    """The live catalogue, read with an asyncio client."""
    return await AsyncRunner(client).run(get_catalogue(time.time()))


class LiveCatalogue:
    """The catalogue (`ToolCatalogue`) on an asyncio client, read at most once per `max_age_s` (seconds).

    Concurrent readers of a stale view wait for the one read under way instead of each starting their own.
    Times are epoch seconds, comparable with a turn's `started_at`. Redis errors propagate
    (`redis.RedisError`); a failed read is not cached.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        max_age_s: float = LIVE_CATALOGUE_MAX_AGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._max_age_s = max_age_s
        self._clock = clock
        self._lock = asyncio.Lock()
        self._value: ToolCatalogue | None = None
        self._read_at = 0.0

    async def read(self, *, newer_than: float | None = None) -> ToolCatalogue:
        """The tools live workers serve and when each tool was last served, as read at most `max_age_s`
        ago — and, with `newer_than`, by a read that started at or after that time."""
        async with self._lock:
            age_s = self._clock() - self._read_at
            if self._value is None or age_s >= self._max_age_s or self._read_at < (newer_than or 0.0):
                started = self._clock()
                self._value = await AsyncRunner(self._client).run(get_tool_catalogue(started))
                self._read_at = started
            return self._value
