"""Worker settings: environment variables with the prefix `TOOLLOOP_`.

What a tool worker needs and nothing more: where Redis and the broker are, which tool modules to serve, the
broker's redelivery timeout. Model keys, tiers, the API token and leases are the orchestrator's
(`orchestrator.settings.Settings`, which extends this class), so a tool worker never reads a model credential.

There is no queue setting (`TOOLLOOP_DEFAULT_QUEUE` is gone): each tool names its queue (`@tool(queue=...)`,
by default its own, `tool.<name>`), and a worker consumes exactly the queues of the tools it serves.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from workers import keys, packing
from workers.connect import build_sentinel_broker_url, is_sentinel_url

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# The query options of a Redis URL that kombu understands as a broker URL: it folds `ssl_*` into its SSL
# settings and hands any other option to its Connection, which refuses redis-py's (socket_timeout, …).
_BROKER_QUERY_PREFIX = "ssl_"


class WorkerSettings(BaseSettings):
    """Configuration of a tool worker, and the connection settings every toolloop process shares.

    Unknown `TOOLLOOP_*` variables are ignored.
    """

    model_config = SettingsConfigDict(env_prefix="TOOLLOOP_", extra="ignore", populate_by_name=True)

    redis_url: str = DEFAULT_REDIS_URL
    # For a Sentinel URL (`sentinel://h1:26379;sentinel://h2:26379/0`): the master its sentinels monitor.
    redis_master_name: str | None = None
    # For rediss:// URLs: "required" (default), "optional" or "none" — never silently unchecked.
    redis_ssl_cert_reqs: str = "required"
    # The state Redis is a Redis Cluster (TOOLLOOP_REDIS_CLUSTER): `redis_url` names any of its nodes, keys
    # carry hash tags (`workers.keys`), and the broker is elsewhere (kombu speaks no cluster): `broker_url`
    # is required.
    redis_cluster: bool = False
    # Broker URL when it is not the state Redis (e.g. RabbitMQ); default: the same Redis.
    broker_url: str | None = None
    tool_modules: str = "workers.examples"
    # An unacked message is redelivered after this: keep it above the longest hard limit plus queue wait.
    visibility_timeout_s: int = 3 * 3600
    # Where a finished outcome Redis refused past its hard limit waits to be written (`workers.spool`);
    # default: `toolloop-spool` in the temp folder. Keep it on a disk that survives the worker's restart.
    spool_dir: str | None = None
    # Retention of tool outcomes: an outcome key no turn consumed, e.g. of `toolloop call`
    # (TOOLLOOP_OUTCOME_TTL_S, 7 days); a consumed outcome's stub and late outcomes, for audit
    # (TOOLLOOP_AUDIT_TTL_S, 7 days).
    outcome_ttl_s: int = Field(default=keys.OUTCOME_TTL_S, gt=0)
    audit_ttl_s: int = Field(default=keys.AUDIT_TTL_S, gt=0)
    # MCP servers whose tools the worker serves too, as a JSON list (TOOLLOOP_MCP_SERVERS); read and checked
    # by `workers.mcp.config.parse_servers` when the worker starts.
    mcp_servers: str = ""
    # Spans record message content (tool arguments and results, model messages), redacted; off by default
    # (TOOLLOOP_TRACE_CONTENT). Spans themselves follow the OTEL_* variables (`workers.tracing`).
    trace_content: bool = False
    # Serve the worker's own Prometheus `/metrics` (refused messages, `workers.metrics`) on this port
    # (TOOLLOOP_WORKER_METRICS_PORT); unset, none.
    worker_metrics_port: int | None = Field(default=None, gt=0, lt=65536)
    # Large tool outcomes and history entries are written zlib-compressed (TOOLLOOP_COMPRESSION, `zlib`);
    # `off` writes them plain, for a deployment that still runs a release that cannot read them
    # (`workers.packing`). Every release since reads both, whatever this says.
    compression: Literal["zlib", "off"] = "zlib"

    @model_validator(mode="after")
    def _cluster_needs_a_broker(self) -> WorkerSettings:
        if self.redis_cluster and not self.broker_url:
            raise ValueError(
                "TOOLLOOP_REDIS_CLUSTER is on: set TOOLLOOP_BROKER_URL to the broker (a Redis of its own, or "
                "RabbitMQ), since Celery's Redis transport does not speak Redis Cluster"
            )
        if self.redis_cluster != keys.is_cluster_layout():
            # The layout was read from the environment at import; settings built otherwise (a test, a CLI
            # flag) set it here, before any key is named.
            keys.use_cluster_layout(self.redis_cluster)
        return self

    @model_validator(mode="after")
    def _apply_compression(self) -> WorkerSettings:
        # Read from the environment at import too; settings built otherwise (a test, a CLI flag) set it here.
        packing.use_compression(self.compression == "zlib")
        return self

    @property
    def tool_module_list(self) -> list[str]:
        """The modules of `tool_modules` (comma-separated) whose tools a worker serves."""
        return [m.strip() for m in self.tool_modules.split(",") if m.strip()]

    @property
    def effective_broker_url(self) -> str:
        """`broker_url` as given, else the state Redis URL without the options only redis-py knows."""
        return self.broker_url or build_broker_url(self.redis_url)


def build_broker_url(redis_url: str) -> str:
    """A redis-py URL as a Celery broker URL: its query keeps only the `ssl_*` options kombu understands.

    `redis://h:6379/0?socket_timeout=1&ssl_cert_reqs=required` → `redis://h:6379/0?ssl_cert_reqs=required`.
    A Sentinel URL gets its database and credentials on every part (`build_sentinel_broker_url`). Other
    schemes (e.g. amqp://) are returned as they are.
    """
    if is_sentinel_url(redis_url):
        return build_sentinel_broker_url(redis_url)
    parts = urlsplit(redis_url)
    if parts.scheme not in {"redis", "rediss"} or not parts.query:
        return redis_url
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(key, value) for key, value in query if key.startswith(_BROKER_QUERY_PREFIX)]
    return urlunsplit(parts._replace(query=urlencode(kept)))


@lru_cache(maxsize=1)
def get_worker_settings() -> WorkerSettings:
    """Worker settings read once per process from the environment."""
    return WorkerSettings()
