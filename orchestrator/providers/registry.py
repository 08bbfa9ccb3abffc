"""Model clients by name: `provider:model` → an HttpModelClient built from the provider's profile.

Every provider is a profile (`providers.profiles`): its wire module, its endpoint (the default base URL,
the variable that overrides it, the key's variable and header, or what authorises each call) and whether it
serves itself (the scripted model). `build_model_client` reads the endpoint's variables from the settings
(`Settings.provider_variables`), picks the base URL (the variable, else what the profile builds from the
others, else the default), and builds the client; nothing here names a provider.

A provider's own API (its default host) without its key in this process's environment gets a
`MissingKeyClient`: every call answers a non-retryable `ProviderError` that names the variable to set, so a
turn fails at its first model call with that message instead of retrying a 401 (a local compatible server
needs no key). `ModelClients` is what a process asks for clients: one per model name, and the scripted
server's lifecycle — a model of a profile that serves itself, with no base URL configured, starts the
in-process scripted server once, the first time one is asked for, and `aclose()` stops it.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from orchestrator.errors import ModelConfigError
from orchestrator.model import ProviderError, Turn
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
from orchestrator.providers.profile import ProviderProfile
from orchestrator.providers.profiles import find_profile
from orchestrator.providers.scripted.server import ScriptedServer
from orchestrator.settings import Settings

log = logging.getLogger("toolloop.orchestrator")

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
    ref: ModelRef, base_url: str, key_variable: str, url_variable: str | None
) -> ModelClient:
    """A `MissingKeyClient` for `ref`, logging once (per model) what the orchestrator lacks."""
    message = (
        f"model {ref} needs {key_variable} in the orchestrator's environment: {base_url} is the provider's "
        f"own API and this orchestrator has no key for it. Set {key_variable} where `toolloop orchestrator` "
        "runs (a submitting process's environment is not read)"
        + (f", or point {url_variable} at a compatible server that needs none" if url_variable else "")
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

    `scripted_base_url` is the base URL of a provider that serves itself (the in-process scripted server).
    Raises `ModelConfigError` for an unknown provider, or one whose base URL nothing gives (naming the
    variable to set). A provider's own API without its key gets a `MissingKeyClient`.
    """
    profile = find_profile(ref.provider)
    if profile is None or profile.endpoint is None:
        raise ModelConfigError(f"unknown provider {ref.provider!r}")
    endpoint = profile.endpoint
    values = settings.provider_variables(endpoint.variables)
    base_url = _find_base_url(ref, profile, values, scripted_base_url)
    key = values.get(endpoint.key_variable) if endpoint.key_variable else None
    official = endpoint.default_base_url
    if endpoint.key_variable and not key and official and is_official_api(base_url, official):
        return build_missing_key_client(ref, base_url, endpoint.key_variable, endpoint.base_url_variable)
    headers = dict(endpoint.headers)
    if key and endpoint.auth == "bearer":
        headers["authorization"] = f"Bearer {key}"
    elif key and endpoint.auth == "header":
        headers[endpoint.key_header] = key
    auth = endpoint.auth_builder(values) if endpoint.auth_builder is not None else None
    wire: WireFormat = importlib.import_module(profile.wire)
    return HttpModelClient(
        ref.provider,
        wire,
        http,
        base_url,
        headers,
        timeout,
        RetryPolicy(max_retries=max_retries),
        url_builder=getattr(wire, endpoint.url_builder),
        auth=auth,
    )


def _find_base_url(
    ref: ModelRef, profile: ProviderProfile, values: Mapping[str, str], served_at: str | None
) -> str:
    endpoint = profile.endpoint
    assert endpoint is not None
    named = values.get(endpoint.base_url_variable) if endpoint.base_url_variable else None
    if profile.serves_itself:
        named = served_at or named
    built = endpoint.base_url_builder(values) if named is None and endpoint.base_url_builder else None
    base_url = named or built or endpoint.default_base_url
    if not base_url:
        variable = endpoint.base_url_variable or " or ".join(endpoint.other_variables)
        raise ModelConfigError(f"model {ref} needs {variable} in the orchestrator's environment")
    return base_url.rstrip("/")


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
            profile = find_profile(ref.provider)
            if profile is not None and profile.serves_itself and not self._settings.scripted_base_url:
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
