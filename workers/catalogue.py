"""Workers publish the catalogue of the tools they serve to Redis (docs/design/tools.md, "The catalogue").

Each worker keeps one field of the `keys.CATALOGUE` hash — its id → `{"seen_at": epoch, "tools": [spec…]}` —
written when it is ready, refreshed every `keys.CATALOGUE_REFRESH_S` (so tools registered later appear) and
at once when it has vanished (Redis restarted empty, or a failover), and removed on a clean shutdown.
Readers ignore entries older than `keys.CATALOGUE_STALE_S`.

With every publish, and on a clean shutdown, a worker also records when each of its tools was last served,
with its spec: the `keys.TOOLS_SERVED` hash, tool name → `{"served_at": epoch, "spec": spec}`, which outlives
the live entries (`keys.TOOLS_SERVED_TTL_S`). It is what tells a tool whose only worker is restarting from
a tool that is gone: the orchestrator still dispatches a call to a tool served within
TOOLLOOP_TOOL_GONE_AFTER_S, and the call waits in its queue for the next worker.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

import redis
from celery import Celery, signals

from workers import keys
from workers.agents import AgentRegistry, AgentSpec
from workers.agents import agents as agent_registry
from workers.connect import DEFAULT_SSL_CERT_REQS, connect_redis
from workers.contract import ToolSpec
from workers.tools import ToolRegistry, registry

logger = logging.getLogger(__name__)

# How often a worker looks whether its catalogue entry is still there (one HEXISTS).
CHECK_S = 1.0


def build_catalogue_entry(specs: Iterable[ToolSpec], now: float) -> str:
    """The JSON a worker stores under its id in the catalogue hash."""
    tools = [spec.model_dump(mode="json") for spec in sorted(specs, key=lambda s: s.name)]
    return json.dumps({"seen_at": now, "tools": tools}, ensure_ascii=False)


def build_served_specs(tools: ToolRegistry, queues: Collection[str] | None) -> list[ToolSpec]:
    """Specs of the tools a worker consuming `queues` serves (None: every tool)."""
    return [spec for spec in tools.specs() if queues is None or spec.queue in queues]


def build_served_entries(specs: Iterable[ToolSpec], now: float) -> dict[str, str]:
    """The fields a worker stores in the served-tools hash: tool name → `{"served_at", "spec"}` JSON."""
    return {
        spec.name: json.dumps({"served_at": now, "spec": spec.model_dump(mode="json")}, ensure_ascii=False)
        for spec in specs
    }


def publish_catalogue(
    client: redis.Redis, worker_id: str, specs: Iterable[ToolSpec], agents: Iterable[AgentSpec] = ()
) -> None:
    """Write (or refresh) this worker's catalogue entry, the served record of each of its tools, and the
    agents its modules declare (`keys.AGENTS`: the last published wins)."""
    now, served = time.time(), list(specs)
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.CATALOGUE, worker_id, build_catalogue_entry(served, now))
    _record_served(pipe, served, now)
    for spec in agents:
        pipe.hset(keys.AGENTS, spec.name, spec.model_dump_json(exclude_defaults=True))
    pipe.execute()


def remove_catalogue(client: redis.Redis, worker_id: str, specs: Iterable[ToolSpec] = ()) -> None:
    """Remove this worker's entry: its tools are no longer served by it; `specs` were served until now."""
    pipe = client.pipeline(transaction=True)
    _record_served(pipe, list(specs), time.time())
    pipe.hdel(keys.CATALOGUE, worker_id)
    pipe.execute()


def _record_served(pipe: Any, specs: list[ToolSpec], now: float) -> None:
    if specs:
        pipe.hset(keys.TOOLS_SERVED, mapping=build_served_entries(specs, now))
        pipe.expire(keys.TOOLS_SERVED, keys.TOOLS_SERVED_TTL_S)


def prune_served(client: redis.Redis, now: float) -> int:
    """Forget the tools no worker has served for `keys.TOOLS_SERVED_TTL_S` (the hash itself expires only
    when no worker publishes at all); the number forgotten. Malformed fields go too."""
    stale = [
        name
        for name, raw in client.hgetall(keys.TOOLS_SERVED).items()
        if (served_at := _served_at(raw)) is None or now - served_at > keys.TOOLS_SERVED_TTL_S
    ]
    return int(client.hdel(keys.TOOLS_SERVED, *stale)) if stale else 0


def _served_at(raw: bytes | str) -> float | None:
    try:
        return float(json.loads(raw)["served_at"])
    except (ValueError, KeyError, TypeError):
        return None


class CataloguePublisher:
    """A daemon thread that republishes a worker's catalogue every `interval_s` until stopped."""

    def __init__(
        self,
        client: redis.Redis,
        worker_id: str,
        specs: Callable[[], list[ToolSpec]],
        interval_s: float = keys.CATALOGUE_REFRESH_S,
        agents: AgentRegistry = agent_registry,
    ) -> None:
        self.client = client
        self.worker_id = worker_id
        self.specs = specs
        self.agents = agents
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._published_at = float("-inf")
        self._thread = threading.Thread(target=self._loop, name="toolloop-catalogue", daemon=True)

    def start(self) -> None:
        """Publish once now, then keep refreshing in the background (a first publish Redis refused — down,
        out of memory — is only logged: the refresh publishes it as soon as Redis takes it)."""
        self._publish()
        try:
            prune_served(self.client, time.time())  # once per worker start: the hash changes slowly
        except redis.RedisError as exc:
            logger.warning("could not prune the served-tools record: %r", exc)
        self._thread.start()

    def publish_now(self) -> None:
        """Publish at once (the served tools changed), from any thread; a refusal is logged as `start`'s."""
        self._publish()

    def _publish(self) -> None:
        try:
            publish_catalogue(self.client, self.worker_id, self.specs(), self.agents.specs())
        except redis.RedisError as exc:
            # Redis briefly away: the next check republishes; readers tolerate a late entry. One line, no
            # traceback: an outage repeats this every check.
            logger.warning("could not publish the tool catalogue: %r", exc)
            return
        self._published_at = time.monotonic()

    def _missing(self) -> bool:
        # A Redis restarted empty (or failed over to a replica that never had the entry) drops it: without
        # this check, every turn would find these tools unserved (`not_found`) until the next refresh.
        try:
            return not self.client.hexists(keys.CATALOGUE, self.worker_id)
        except redis.RedisError:
            return True

    def _loop(self) -> None:
        while not self._stop.wait(min(self.interval_s, CHECK_S)):
            if time.monotonic() - self._published_at >= self.interval_s or self._missing():
                self._publish()

    def stop(self, *, remove: bool = True) -> None:
        """Stop refreshing and (on a clean shutdown) remove the entry."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        if remove:
            try:
                remove_catalogue(self.client, self.worker_id, self.specs())
            except redis.RedisError as exc:
                # Left for readers to ignore once stale (`keys.CATALOGUE_STALE_S`).
                logger.warning("could not remove the tool catalogue entry: %r", exc)


# The publishers of this process's ready workers (one, in a worker): `republish_catalogues` reaches them.
_live_publishers: list[CataloguePublisher] = []


def republish_catalogues() -> None:
    """Publish this process's catalogue entries now: its served tools changed (an MCP server's listing)."""
    for publisher in list(_live_publishers):
        publisher.publish_now()


def connect_catalogue_publisher(app: Celery, tools: ToolRegistry = registry) -> None:
    """Publish the worker's catalogue when it is ready and remove it when it shuts down cleanly."""
    publishers = _live_publishers

    def on_ready(sender: Any = None, **_: Any) -> None:
        consumer_app = getattr(sender, "app", None)
        if consumer_app is not app:
            return
        queues = set(app.amqp.queues.consume_from or app.amqp.queues)
        settings = getattr(app, "settings", None)
        url = settings.redis_url if settings is not None else app.conf.broker_url
        cert_reqs = settings.redis_ssl_cert_reqs if settings is not None else DEFAULT_SSL_CERT_REQS
        publisher = CataloguePublisher(
            connect_redis(url, cert_reqs, decode_responses=False),
            str(sender.hostname),
            lambda: build_served_specs(tools, queues),
        )
        publisher.start()
        publishers.append(publisher)

    def on_shutdown(**_: Any) -> None:
        while publishers:
            publishers.pop().stop()

    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_shutdown.connect(on_shutdown, weak=False)
