"""Orchestrator settings: the worker's connection settings plus what only the orchestrator side
reads — the model, its tiers and provider credentials, the API token, leases and the lost-call grace.

Provider variables keep their vendors' usual names (OPENAI_API_KEY, AWS_REGION, …): each provider's profile
names its own (`providers.profiles`). Tool workers load
`workers.settings.WorkerSettings` only, so a worker process never reads a model credential.

Design notes: docs/design/storage.md, "Settings".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import lru_cache

from pydantic import Field, SecretStr, field_validator, model_validator

from orchestrator.machine.state import DEFAULT_LOST_CALL_WAIT_S
from orchestrator.model_limits import ModelLimit
from orchestrator.providers.profiles import PROFILES
from orchestrator.providers.traits import MODEL_TIERS
from orchestrator.tenant_limits import TenantLimit
from workers import keys
from workers.settings import WorkerSettings

ENV_PREFIX = "TOOLLOOP_"
PROVIDER_VARIABLES: tuple[str, ...] = tuple(
    dict.fromkeys(
        name
        for profile in PROFILES.values()
        if profile.endpoint is not None
        for name in profile.endpoint.variables
        if not name.startswith(ENV_PREFIX)
    )
)
"""Every provider variable a profile names, outside toolloop's own settings."""


class Settings(WorkerSettings):
    """Configuration of the orchestrator, the API, the clients and the CLI. Unknown variables are ignored."""

    model: str = "scripted:demo"
    # Model tiers: a turn may name "fast", "default" or "smart" instead of a model.
    model_fast: str | None = None
    model_default: str | None = None
    model_smart: str | None = None
    # A blank token is no token: no client could send it, and `toolloop api` treats it as unset.
    api_token: SecretStr | None = None
    # The API's keys, a JSON object: key (or "sha256:<hex>" of it) → {"tenant", "scopes", "tools"}. Read by
    # `toolloop api` only (`api.access`), which refuses to start with a table it cannot use; blank is none.
    api_keys: SecretStr | None = None
    # How long past a call's hard limit a missing outcome is declared lost (not the visibility timeout).
    lost_call_grace_s: float = 5.0
    # How much longer a lost call waits when its worker has not reported in since the call's hard limit: cut
    # off from Redis, it may hold the result in its spool (TOOLLOOP_LOST_CALL_WAIT_S; 0: no wait).
    lost_call_wait_s: float = Field(default=DEFAULT_LOST_CALL_WAIT_S, ge=0)
    # A tool no live worker serves, though one did within this many seconds, is between workers (a restart,
    # a deploy): its calls are sent to wait in their queue, and a turn naming it is accepted. Only a tool no
    # worker has served for longer is answered `not_found` (TOOLLOOP_TOOL_GONE_AFTER_S).
    tool_gone_after_s: float = Field(default=keys.TOOL_GONE_AFTER_S, gt=0, le=keys.TOOLS_SERVED_TTL_S)
    lease_ttl_s: float = 15.0
    orchestrator_max_turns: int = 10_000
    # How deep sub-agents may nest when a turn's `limits.max_agent_depth` does not say
    # (TOOLLOOP_MAX_AGENT_DEPTH): a child turn is depth 1, its own children 2, …
    max_agent_depth: int = Field(default=3, ge=0)
    # The API's Redis connections (`orchestrator.api.connections`): requests share a pool of at most this many
    # (TOOLLOOP_API_REDIS_MAX_CONNECTIONS); every open SSE stream shares one more, /healthz one of its own.
    api_redis_max_connections: int = Field(default=20, ge=1)
    # Events held for one SSE stream whose client reads slower than its turn writes; past it the stream
    # catches up from its own last event id instead (TOOLLOOP_API_STREAM_BUFFER_EVENTS).
    api_stream_buffer_events: int = Field(default=256, ge=1)
    # How often an SSE stream with nothing to send writes a keep-alive comment (TOOLLOOP_API_SSE_KEEPALIVE_S).
    api_sse_keepalive_s: float = Field(default=10.0, gt=0)
    # How long an API request (and the opening of an SSE stream) waits for a Redis that does not answer
    # before it is a 503 with Retry-After (TOOLLOOP_API_REDIS_RETRY_S): long enough to ride out a restart.
    api_redis_retry_s: float = Field(default=10.0, ge=0)

    # The providers' own variables (OPENAI_API_KEY, GEMINI_BASE_URL, AWS_REGION …: each profile's endpoint
    # names its own, `providers.profiles`), read from the environment under their vendors' usual names or
    # with the TOOLLOOP_ prefix; a blank one is unset. Given directly, `Settings(provider_env={...})`.
    provider_env: dict[str, SecretStr] = Field(default_factory=dict, exclude=True)

    # Base URL (ending in /v1) of a running scripted model server, for `scripted:<name>` models.
    scripted_base_url: str | None = None
    # At most this many model calls in flight at once per orchestrator, each on a connection of its own
    # (TOOLLOOP_MODEL_MAX_CONNECTIONS); a call beyond waits for one to end (`providers.transport`).
    model_max_connections: int = Field(default=1000, ge=1)
    # A model call that sends nothing for this long (no first byte, or a stream gone silent) has failed, as a
    # retryable timeout (TOOLLOOP_MODEL_TIMEOUT_S). Reasoning models may think for minutes before a byte.
    model_timeout_s: float = Field(default=120.0, gt=0)

    # Streaming: model calls stream when the provider can and the turn does not say `stream: false`;
    # their text and thinking deltas are coalesced into one event per turn at most every `stream_flush_s`
    # (TOOLLOOP_STREAM_FLUSH_S). The scripted model pauses `scripted_stream_delay_s` between the pieces it
    # streams (TOOLLOOP_SCRIPTED_STREAM_DELAY_S; the demo sets it so that its answer is seen being written).
    stream_flush_s: float = Field(default=0.2, gt=0)
    scripted_stream_delay_s: float = Field(default=0.0, ge=0)
    # Flower's address as a person's browser reaches it (TOOLLOOP_FLOWER_URL): the turn page links each tool
    # call to its task there.
    flower_url: str | None = None
    # Model controls: Anthropic prompt caching — cache breakpoints on the instructions, the tools
    # and the conversation's stable prefix (TOOLLOOP_PROMPT_CACHING, on); prices in USD per million tokens
    # that extend or correct the maintained price list (`orchestrator.pricing`), as JSON
    # `{"<provider:model or model>": {"input": 2.0, "output": 8.0, "cache_read": 0.5, "cache_write": 2.5}}`
    # (TOOLLOOP_MODEL_PRICES).
    prompt_caching: bool = True
    model_prices: dict[str, dict[str, float]] = Field(default_factory=dict)
    # The archive hook (`orchestrator.archive`): the Celery task name each finished turn's record is sent to
    # (TOOLLOOP_ARCHIVE_TASK, e.g. `myapp.archive_turn`; unset: no archive), on this queue
    # (TOOLLOOP_ARCHIVE_QUEUE), which the team's own Celery worker consumes.
    archive_task: str | None = None
    archive_queue: str = "toolloop.archive"
    # The attention hook (`orchestrator.attention`): the Celery task told of each call that starts waiting
    # for a person (TOOLLOOP_ATTENTION_TASK, e.g. `myapp.ask_approval`; unset: none is told), on this queue
    # (TOOLLOOP_ATTENTION_QUEUE), which the team's own Celery worker consumes.
    attention_task: str | None = None
    attention_queue: str = "toolloop.attention"

    # The context budget (`orchestrator.context`): windows of models the maintained list lacks or gets wrong,
    # as JSON `{"<provider:model or model>": tokens}`, the longest matching name first
    # (TOOLLOOP_CONTEXT_WINDOWS); the tokens kept for the answer (TOOLLOOP_CONTEXT_OUTPUT_RESERVE_TOKENS;
    # unset: an eighth of the window, 256 to 32,000); older history summarised by a model call before
    # exchanges are dropped (TOOLLOOP_COMPACTION, off by default).
    context_windows: dict[str, int] = Field(default_factory=dict)
    # Models known by another name, as JSON `{"<provider:model>": "<provider:model>"}`
    # (TOOLLOOP_MODEL_ALIASES): a gateway's alias (`openai:gw-model`) priced and fitted as the model it stands
    # for (`openai:gpt-5-mini`). The request still names the alias: the gateway decides where it goes.
    model_aliases: dict[str, str] = Field(default_factory=dict)
    # Model rate limits shared by the fleet (`orchestrator.model_limits`), as JSON
    # `{"<provider:model or provider>": {"requests_per_minute": 500, "tokens_per_minute": 200000,
    # "window_s": 60}}` (TOOLLOOP_MODEL_LIMITS; unset: only the providers' own signals pause a model).
    model_limits: dict[str, ModelLimit] = Field(default_factory=dict)
    # Limits per tenant (`orchestrator.tenant_limits`), as JSON `{"<tenant or default>": {"max_running_turns":
    # 2, "tokens_per_minute": 100000, "tokens_per_day": 5000000}}` (TOOLLOOP_TENANT_LIMITS; "default" is the
    # limit of each tenant without an entry; unset: no tenant is limited).
    tenant_limits: dict[str, TenantLimit] = Field(default_factory=dict)
    context_output_reserve_tokens: int | None = Field(default=None, ge=0)
    compaction: bool = False

    # Retention (docs/operations/durability.md, "Retention settings"): a finished turn's request, state,
    # outcome, events and control, and the history list of a turn without a conversation
    # (TOOLLOOP_TURN_TTL_S, 7 days); a conversation's history list and head, from its last turn's end: a
    # conversation in use never expires (TOOLLOOP_CONVERSATION_TTL_S, 30 days). The outcome and audit TTLs
    # are the workers' (`WorkerSettings`).
    turn_ttl_s: int = Field(default=keys.TURN_TTL_S, gt=0)
    conversation_ttl_s: int = Field(default=keys.CONVERSATION_TTL_S, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _read_provider_env(cls, data: object) -> object:
        if not isinstance(data, dict) or "provider_env" in data:
            return data
        found = {}
        for name in PROVIDER_VARIABLES:
            value = os.environ.get(name) or os.environ.get(f"{ENV_PREFIX}{name}")
            if value and value.strip():
                found[name] = value.strip()
        return {**data, "provider_env": found}

    def provider_variables(self, names: Iterable[str]) -> dict[str, str]:
        """The values of a provider's variables that are set, by name (a `TOOLLOOP_` one is a setting)."""
        values: dict[str, str] = {}
        for name in names:
            if name.startswith(ENV_PREFIX):
                value = getattr(self, name.removeprefix(ENV_PREFIX).lower(), None)
            else:
                secret = self.provider_env.get(name)
                value = secret.get_secret_value() if secret is not None else None
            if isinstance(value, str) and value.strip():
                values[name] = value.strip()
        return values

    @field_validator("api_token", "api_keys", mode="after")
    @classmethod
    def _blank_token_is_none(cls, token: SecretStr | None) -> SecretStr | None:
        return None if token is None or not token.get_secret_value().strip() else token

    @property
    def retention(self) -> keys.Retention:
        """The four retention settings, as the stores take them."""
        return keys.Retention(self.turn_ttl_s, self.conversation_ttl_s, self.outcome_ttl_s, self.audit_ttl_s)

    @property
    def model_tiers(self) -> dict[str, str]:
        """The configured tiers, tier name → `provider:model`."""
        names = (self.model_fast, self.model_default, self.model_smart)
        return {tier: name for tier, name in zip(MODEL_TIERS, names, strict=True) if name}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings read once per process from the environment."""
    return Settings()
