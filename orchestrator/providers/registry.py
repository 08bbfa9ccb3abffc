"""Model clients by name: `provider:model` → an HttpModelClient for that provider's wire format.

Providers: `openai` (Chat Completions at OPENAI_BASE_URL, which includes `/v1` as in the OpenAI SDK; any
OpenAI-compatible server), `openai_responses` (the Responses API at the same base URL), `anthropic`
(Messages at ANTHROPIC_BASE_URL, which does not include `/v1`, as in the Anthropic SDK) and `scripted` (the
project's own deterministic model: the Chat Completions adapter pointed at a scripted server's base URL).

`build_model_client` builds one client. A provider's own API (OPENAI_BASE_URL unset or api.openai.com,
ANTHROPIC_BASE_URL unset or api.anthropic.com) without its key in this process's environment gets a
`MissingKeyClient`: every call answers a non-retryable `ProviderError` that names the variable to set, so a
turn fails at its first model call with that message instead of retrying a 401 (a local OpenAI-compatible
server needs no key). `ModelClients` is what a process asks for clients: one per model name, and the scripted
server's lifecycle — a `scripted:` model with no `TOOLLOOP_SCRIPTED_BASE_URL` starts the in-process scripted
server once, the first time one is asked for, and `aclose()` stops it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from orchestrator.errors import ModelConfigError
from orchestrator.model import ProviderError, Turn
from orchestrator.providers import anthropic, openai_chat, openai_responses
from orchestrator.providers.base import (
    DEFAULT_TIMEOUT,
    HttpModelClient,
    ModelClient,
    ModelRef,
    ModelRequest,
    RetryPolicy,
    WireFormat,
    parse_model_ref,
)
from orchestrator.providers.deltas import DeltaSink
from orchestrator.providers.scripted.server import ScriptedServer
from orchestrator.settings import Settings

log = logging.getLogger("toolloop.orchestrator")

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_DEFAULT_BASE_URL = "https://api.anthropic.com"
MISSING_KEY_ERROR = "missing_api_key"


@dataclass
class MissingKeyClient:
    """The client of a provider's own API when this process has no key for it: a `ModelClient` whose every
    call answers a non-retryable `ProviderError` saying which variable to set, and where."""

    provider: str
    message: str

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> Turn | ProviderError:
        """The missing-key error; nothing is sent."""
        del request, on_delta  # the answer is the same whatever is asked
        return ProviderError(
            provider=self.provider, type=MISSING_KEY_ERROR, code=MISSING_KEY_ERROR, message=self.message
        )


def build_missing_key_client(
    ref: ModelRef, base_url: str, key_variable: str, url_variable: str
) -> ModelClient:
    """A `MissingKeyClient` for `ref`, logging once (per model) what the orchestrator lacks."""
    message = (
        f"model {ref} needs {key_variable} in the orchestrator's environment: {base_url} is the provider's "
        f"own API and this orchestrator has no key for it. Set {key_variable} where `toolloop orchestrator` "
        f"runs (a submitting process's environment is not read), or point {url_variable} at a compatible "
        "server that needs none"
    )
    log.error("%s", message)
    return MissingKeyClient(ref.provider, message)


def is_official_api(base_url: str, default_base_url: str) -> bool:
    """True when `base_url` is on the host of the provider's own API (`default_base_url`)."""
    return urlsplit(base_url).hostname == urlsplit(default_base_url).hostname


def build_model_client(
    ref: ModelRef,
    settings: Settings,
    http: httpx.AsyncClient,
    *,
    max_retries: int = 2,
    scripted_base_url: str | None = None,
    timeout: httpx.Timeout = DEFAULT_TIMEOUT,
) -> ModelClient:
    """A client for `ref`. The runtime passes `max_retries=0`: its state machine counts model retries.

    Raises `ModelConfigError` for an unknown provider, or a scripted model with no server URL (neither the
    argument nor `TOOLLOOP_SCRIPTED_BASE_URL`). A provider's own API without its key gets a
    `MissingKeyClient`.
    """
    retry = RetryPolicy(max_retries=max_retries)
    if ref.provider in ("openai", "openai_responses"):
        base_url = (settings.openai_base_url or OPENAI_DEFAULT_BASE_URL).rstrip("/")
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
        if not key and is_official_api(base_url, OPENAI_DEFAULT_BASE_URL):
            return build_missing_key_client(ref, base_url, "OPENAI_API_KEY", "OPENAI_BASE_URL")
        headers = {"authorization": f"Bearer {key}"} if key else {}
        wire: WireFormat = openai_chat if ref.provider == "openai" else openai_responses
        path = openai_chat.CHAT_PATH if ref.provider == "openai" else openai_responses.RESPONSES_PATH
        url = f"{base_url}{path}"
        return HttpModelClient(ref.provider, wire, http, url, headers, timeout, retry)
    if ref.provider == "anthropic":
        base_url = (settings.anthropic_base_url or ANTHROPIC_DEFAULT_BASE_URL).rstrip("/")
        if not settings.anthropic_api_key and is_official_api(base_url, ANTHROPIC_DEFAULT_BASE_URL):
            return build_missing_key_client(ref, base_url, "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")
        headers = {"anthropic-version": anthropic.API_VERSION}
        if settings.anthropic_api_key:
            headers["x-api-key"] = settings.anthropic_api_key.get_secret_value()
        url = f"{base_url}{anthropic.MESSAGES_PATH}"
        return HttpModelClient(ref.provider, anthropic, http, url, headers, timeout, retry)
    if ref.provider == "scripted":
        scripted_url = scripted_base_url or settings.scripted_base_url
        if not scripted_url:
            raise ModelConfigError(
                f"model {ref} needs a scripted server: start one (providers.scripted.server) and set "
                "TOOLLOOP_SCRIPTED_BASE_URL to its base URL"
            )
        url = f"{scripted_url.rstrip('/')}{openai_chat.CHAT_PATH}"
        return HttpModelClient(ref.provider, openai_chat, http, url, {}, timeout, retry)
    raise ModelConfigError(f"unknown provider {ref.provider!r}")


class ModelClients:
    """The model clients of one process, one per model name, sharing one HTTP client (one connection pool).

    Owns the in-process scripted model: started inside the running event loop the first time a `scripted:`
    model is asked for without `TOOLLOOP_SCRIPTED_BASE_URL`, and stopped by `aclose()`.
    """

    def __init__(self, settings: Settings, http: httpx.AsyncClient, *, max_retries: int = 2) -> None:
        self._settings = settings
        self._http = http
        self._max_retries = max_retries
        self._clients: dict[str, ModelClient] = {}
        self._scripted: ScriptedServer | None = None
        self._scripted_lock = asyncio.Lock()

    async def get(self, model: str) -> ModelClient:
        """The client for `model` (`provider:model`); `ModelConfigError` for a name no client can serve."""
        client = self._clients.get(model)
        if client is None:
            ref = parse_model_ref(model)
            scripted_url = None
            if ref.provider == "scripted" and not self._settings.scripted_base_url:
                scripted_url = await self._scripted_url()
            # Nothing from the server for `model_timeout_s` (TOOLLOOP_MODEL_TIMEOUT_S): a retryable timeout.
            timeout = httpx.Timeout(self._settings.model_timeout_s, connect=DEFAULT_TIMEOUT.connect)
            client = build_model_client(
                ref,
                self._settings,
                self._http,
                max_retries=self._max_retries,
                scripted_base_url=scripted_url,
                timeout=timeout,
            )
            self._clients[model] = client
        return client

    @property
    def scripted_base_url(self) -> str | None:
        """The base URL of the in-process scripted model while it runs; None when none was started."""
        return self._scripted.base_url if self._scripted is not None else None

    async def _scripted_url(self) -> str:
        # Started once, inside this event loop, the first time a turn names a scripted model.
        async with self._scripted_lock:
            if self._scripted is None:
                server = ScriptedServer(chunk_delay_s=self._settings.scripted_stream_delay_s)
                await server.__aenter__()
                self._scripted = server
                log.info("scripted model serving at %s", server.base_url)
            return self._scripted.base_url

    async def aclose(self) -> None:
        """Stop the in-process scripted model if one was started (the HTTP client is the caller's)."""
        if self._scripted is not None:
            await self._scripted.__aexit__(None, None, None)
            self._scripted = None
