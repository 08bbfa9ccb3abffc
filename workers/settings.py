"""The one settings object (SPEC §8.1): environment variables with the prefix `TOOLLOOP_`.

It lives in the leaf package so that workers and orchestrator read the same settings without the workers
importing orchestrator code. Provider keys keep their vendors' usual names (OPENAI_API_KEY, …).
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# The query options of a Redis URL that kombu understands as a broker URL: it folds `ssl_*` into its SSL
# settings and hands any other option to its Connection, which refuses redis-py's (socket_timeout, …).
_BROKER_QUERY_PREFIX = "ssl_"


class Settings(BaseSettings):
    """Configuration of every toolloop process. Unknown `TOOLLOOP_*` variables are ignored."""

    model_config = SettingsConfigDict(env_prefix="TOOLLOOP_", extra="ignore", populate_by_name=True)

    redis_url: str = DEFAULT_REDIS_URL
    # For rediss:// URLs: "required" (default), "optional" or "none" — never silently unchecked.
    redis_ssl_cert_reqs: str = "required"
    # Broker URL when it is not the state Redis (e.g. RabbitMQ); default: the same Redis.
    broker_url: str | None = None
    tool_modules: str = "workers.examples"
    default_queue: str = "tools"
    model: str = "scripted:demo"
    # Model tiers (SPEC §6.3): a turn may name "fast", "default" or "smart" instead of a model.
    model_fast: str | None = None
    model_default: str | None = None
    model_smart: str | None = None
    api_token: SecretStr | None = None
    # Broker redelivery of an unacked message; above the longest hard limit plus queue wait (ARCHITECTURE).
    visibility_timeout_s: int = 3 * 3600
    # How long past a call's hard limit a missing outcome is declared lost (not the visibility timeout).
    lost_call_grace_s: float = 5.0
    lease_ttl_s: float = 15.0
    orchestrator_max_turns: int = 10_000

    openai_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_API_KEY", "TOOLLOOP_OPENAI_API_KEY")
    )
    openai_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("OPENAI_BASE_URL", "TOOLLOOP_OPENAI_BASE_URL")
    )
    anthropic_api_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("ANTHROPIC_API_KEY", "TOOLLOOP_ANTHROPIC_API_KEY")
    )
    anthropic_base_url: str | None = Field(
        default=None, validation_alias=AliasChoices("ANTHROPIC_BASE_URL", "TOOLLOOP_ANTHROPIC_BASE_URL")
    )

    # Base URL (ending in /v1) of a running scripted model server, for `scripted:<name>` models.
    scripted_base_url: str | None = None

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
    Other schemes (e.g. amqp://) are returned as they are.
    """
    parts = urlsplit(redis_url)
    if parts.scheme not in {"redis", "rediss"} or not parts.query:
        return redis_url
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(key, value) for key, value in query if key.startswith(_BROKER_QUERY_PREFIX)]
    return urlunsplit(parts._replace(query=urlencode(kept)))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings read once per process from the environment."""
    return Settings()
