"""The model-client interface and the one shared HTTP path every provider adapter takes.

A provider module is pure: `to_wire(ModelRequest) -> dict` builds the request body, `from_wire(body)`
normalises the response, `error_from_wire(status, body, headers)` maps an error body. `HttpModelClient`
glues one such module to an injected `httpx.AsyncClient` through `post_json`, or, for a call that streams,
through `streaming.call_stream` (a module that can stream also has `to_wire(request, stream=True)` and
`stream_reader()`); nowhere else does HTTP happen. Failures never leave this layer as exceptions::

    httpx.TimeoutException   -> ProviderError(type="timeout", status=None, retryable=True)
    httpx.TransportError     -> ProviderError(type="transport_error", status=None, retryable=True)
    HTTP 4xx/5xx             -> the module's error_from_wire(status, body, headers)
    2xx with a broken body   -> ProviderError(type="invalid_response")

Every HTTP answer, refusal or not, also tells of the provider's rate limits: with a request's
`on_rate_limits`, the module's `parse_rate_limits(status, headers, now)` reads its headers into a neutral
`RateLimitSignal` sent there (the runtime pauses the model for the fleet on it: `orchestrator.model_limits`).

Retryable errors are retried here up to `max_retries` times, with capped exponential backoff and jitter,
waiting what `Retry-After` / `retry-after-ms` say when they say it; a streamed call that already sent a
delta is never retried here (see `streaming`). The orchestrator runtime builds its
clients with `max_retries=0`: its state machine owns model retries and counts them against the turn.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import httpx

from orchestrator.errors import ModelConfigError, build_did_you_mean
from orchestrator.model import Message, ModelSettings, ProviderError, Turn
from orchestrator.providers.body import decode_json, decode_text
from orchestrator.providers.common import IdSource, transport_error
from orchestrator.providers.deltas import DeltaSink
from orchestrator.providers.profiles import CALLABLE
from orchestrator.providers.rate_limits import RateLimitSignal, RateLimitSink
from orchestrator.providers.sending import RequestAuth, build_headers, encode_body
from orchestrator.providers.stream_reader import StreamReader
from orchestrator.providers.streaming import call_stream, read_error_body
from orchestrator.providers.structured import read_answer_tool
from orchestrator.providers.traits import MODEL_TIERS
from workers.contract import ToolSpec

PROVIDERS = CALLABLE
"""The providers a model may name: those with a callable profile (`providers.profiles`)."""
DEFAULT_TIMEOUT = httpx.Timeout(120.0, connect=10.0)
DEFAULT_MAX_RETRIES = 2
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True)
class ModelRef:
    """A model named as `provider:model`, e.g. `openai:gpt-4.1-mini` or `scripted:demo`."""

    provider: str
    model: str

    def __str__(self) -> str:
        return f"{self.provider}:{self.model}"


def parse_model_ref(name: str) -> ModelRef:
    """`"openai:gpt-4.1-mini"` → `ModelRef("openai", "gpt-4.1-mini")`; `ModelConfigError` names what is wrong.

    Only the first colon separates: model names may hold colons themselves (`ollama` tags such as
    `qwen3:8b` behind `openai:`).
    """
    provider, sep, model = name.strip().partition(":")
    provider = provider.strip().lower()
    if not sep or not model.strip():
        raise ModelConfigError(f"model {name!r} is not `provider:model` (providers: {', '.join(PROVIDERS)})")
    if provider not in PROVIDERS:  # a read-only format (ollama, bare) is no model either
        raise ModelConfigError(
            f"unknown provider {provider!r}{build_did_you_mean(provider, PROVIDERS)} in {name!r} "
            f"(providers: {', '.join(PROVIDERS)})"
        )
    return ModelRef(provider, model.strip())


@dataclass(frozen=True)
class ModelRequest:
    """One LLM call: the request-time view of the history, the offered tools and the call's options."""

    model: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = ()
    tool_choice: str | None = None  # "auto" | "required" | "none" | a tool name
    # Seed for synthetic tool-call ids, unique per LLM call of a turn, so that ids stay unique turn-wide.
    id_prefix: str | None = None
    max_output_tokens: int | None = None
    # Ask the provider to stream when its adapter can; False: one plain response body.
    stream: bool = True
    # Model controls: the system prompt (sent first: system/developer message, Anthropic `system`, Responses
    # `instructions`), the model settings, a JSON Schema for the answer (the provider's native structured
    # output), and whether to mark cache breakpoints (Anthropic prompt caching).
    instructions: str | None = None
    settings: ModelSettings = field(default_factory=ModelSettings)
    output_schema: Mapping[str, Any] | None = None
    prompt_cache: bool = True
    # Where the rate-limit signal of each HTTP answer the call gets goes (None: nowhere).
    on_rate_limits: RateLimitSink | None = field(default=None, compare=False)


class ModelClient(Protocol):
    """What the runtime calls: one request in, a normalised Turn or a ProviderError out; never raises.

    With `on_delta`, a client that streams sends the answer's pieces there as they arrive; one that does
    not (or a server that answered with a plain body) sends none, and the Turn is all there is.
    """

    provider: str

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> Turn | ProviderError: ...


class WireFormat(Protocol):
    """The pure functions of a provider module (`openai_chat`, `openai_responses`, `anthropic`)."""

    PROVIDER: str

    def to_wire(self, request: ModelRequest) -> dict[str, Any]: ...

    def from_wire(self, body: object, *, ids: IdSource | None = None) -> Turn | ProviderError: ...

    def error_from_wire(
        self, status: int | None, body: object, headers: Mapping[str, str] | None = None
    ) -> ProviderError: ...

    def parse_rate_limits(
        self, status: int | None, headers: Mapping[str, str], now: float
    ) -> RateLimitSignal: ...


@runtime_checkable
class StreamingWireFormat(WireFormat, Protocol):
    """A provider module that can also stream: a body asking for a stream, and a reader for the answer."""

    def to_wire(self, request: ModelRequest, *, stream: bool = False) -> dict[str, Any]: ...

    def stream_reader(self, request: ModelRequest | None = None) -> StreamReader: ...


ErrorMapper = Callable[[int | None, object, Mapping[str, str] | None], ProviderError]
AnswerHook = Callable[[int, Mapping[str, str]], None]
"""Told the status and headers of each HTTP answer (`HttpModelClient.build_answer_hook`)."""
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class RetryPolicy:
    """How `post_json` retries: attempts after the first, and the capped exponential backoff."""

    max_retries: int = DEFAULT_MAX_RETRIES
    backoff_base_s: float = BACKOFF_BASE_S
    backoff_max_s: float = BACKOFF_MAX_S

    def delay_s(self, retry_number: int, error: ProviderError) -> float | None:
        """Seconds to wait before retry `retry_number` (1-based); None when the error must not be retried."""
        if not error.retryable or retry_number > self.max_retries:
            return None
        if error.retry_after_s is not None:
            # A server asking for longer than we would ever wait is answered at once, with its hint.
            return error.retry_after_s if error.retry_after_s <= self.backoff_max_s else None
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2.0 ** (retry_number - 1))
        # "Equal jitter": at least half the backoff, so that retries never bunch at zero.
        return ceiling / 2 + random.uniform(0, ceiling / 2)


async def post_json(
    http: httpx.AsyncClient,
    url: str,
    body: Mapping[str, Any],
    *,
    provider: str,
    error_from_wire: ErrorMapper,
    headers: Mapping[str, str] | None = None,
    http_timeout: httpx.Timeout = DEFAULT_TIMEOUT,
    retry: RetryPolicy | None = None,
    sleep: Sleep = asyncio.sleep,
    on_answer: AnswerHook | None = None,
    auth: RequestAuth | None = None,
) -> object | ProviderError:
    """POST `body` as JSON; the decoded 2xx response body, or a ProviderError. Never raises for I/O.
    `on_answer` is told the status and headers of each answer; `auth` authorises each attempt."""
    policy = retry or RetryPolicy()
    content = encode_body(body)
    retry_number = 0
    while True:
        sent = await build_headers(provider, url, headers or {}, content, auth)
        if isinstance(sent, ProviderError):
            result: object | ProviderError = sent
        else:
            result = await _post_once(
                http,
                url,
                content,
                provider=provider,
                error_from_wire=error_from_wire,
                headers=sent,
                http_timeout=http_timeout,
                on_answer=on_answer,
            )
        if not isinstance(result, ProviderError):
            return result
        retry_number += 1
        delay = policy.delay_s(retry_number, result)
        if delay is None:
            return result
        await sleep(delay)


async def _post_once(
    http: httpx.AsyncClient,
    url: str,
    content: bytes,
    *,
    provider: str,
    error_from_wire: ErrorMapper,
    headers: dict[str, str],
    http_timeout: httpx.Timeout,
    on_answer: AnswerHook | None,
) -> object | ProviderError:
    try:
        response = await http.post(url, content=content, headers=headers, timeout=http_timeout)
    except httpx.TimeoutException as exc:
        error = transport_error(provider, f"request to {url} timed out ({type(exc).__name__})")
        return error.model_copy(update={"type": "timeout"})
    except httpx.TransportError as exc:
        return transport_error(provider, f"request to {url} failed: {type(exc).__name__}: {exc}")
    if on_answer is not None:
        on_answer(response.status_code, response.headers)
    if response.status_code >= 400:
        return error_from_wire(response.status_code, read_error_body(response), response.headers)
    text = decode_text(response.content, provider)
    if isinstance(text, ProviderError):
        return text
    return decode_json(text, provider)


UrlBuilder = Callable[..., str]
"""A wire module's `build_url(base_url, model, *, stream)`."""


@dataclass
class HttpModelClient:
    """A ModelClient for one provider module over HTTP: to_wire → post_json → from_wire, or, when the
    request may stream, a sink is given and the module can stream, `streaming.call_stream`."""

    provider: str
    wire: WireFormat
    http: httpx.AsyncClient
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: httpx.Timeout = field(default_factory=lambda: DEFAULT_TIMEOUT)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    sleep: Sleep = asyncio.sleep
    # With `url_builder`, `url` is the base URL and each call's URL is built from it, the model and whether
    # it streams (Gemini and Bedrock put both in the path); without, `url` is every call's URL.
    url_builder: UrlBuilder | None = None
    auth: RequestAuth | None = None

    def build_url(self, request: ModelRequest, *, stream: bool) -> str:
        """The URL of one call of `request`."""
        if self.url_builder is None:
            return self.url
        return self.url_builder(self.url, request.model, stream=stream)

    async def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None
    ) -> Turn | ProviderError:
        """One LLM call, normalised; errors as values. Deltas go to `on_delta` when the answer streams."""
        if on_delta is not None and request.stream and isinstance(self.wire, StreamingWireFormat):
            streamed = await call_stream(self, self.wire, request, on_delta)
            return self._own(streamed, request)
        body = self.wire.to_wire(request)
        result = await post_json(
            self.http,
            self.build_url(request, stream=False),
            body,
            provider=self.provider,
            error_from_wire=self.wire.error_from_wire,
            headers=self.headers,
            http_timeout=self.timeout,
            retry=self.retry,
            sleep=self.sleep,
            on_answer=self.build_answer_hook(request),
            auth=self.auth,
        )
        if isinstance(result, ProviderError):
            return result.model_copy(update={"provider": self.provider})
        ids = IdSource(request.id_prefix) if request.id_prefix else None
        return self._own(self.wire.from_wire(result, ids=ids), request)

    def build_answer_hook(self, request: ModelRequest) -> AnswerHook | None:
        """What tells `request.on_rate_limits` of each answer: the wire module's reading of its headers."""
        sink = request.on_rate_limits
        if sink is None:
            return None
        parse = self.wire.parse_rate_limits

        def answered(status: int, headers: Mapping[str, str]) -> None:
            sink(parse(status, headers, time.time()))

        return answered

    def _own(self, answer: Turn | ProviderError, request: ModelRequest) -> Turn | ProviderError:
        # A structured answer given through the answer tool (Anthropic) is the final answer's JSON text.
        if isinstance(answer, Turn) and request.output_schema is not None:
            answer = read_answer_tool(answer)
        return answer.model_copy(update={"provider": self.provider})


def check_model_name(model: str | list[str] | None) -> None:
    """A turn's `model` must be None or blank (the orchestrator's default), a tier, or `provider:model` with a
    known provider; `ModelConfigError` (a `ValueError`) otherwise, before anything is stored. A list (the
    fallback order) must hold at least one model, each one of those."""
    if isinstance(model, list):
        if not model:
            raise ModelConfigError("model: an empty list names no model")
        for each in model:
            check_model_name(each)
        return
    name = (model or "").strip()
    if not name or name in MODEL_TIERS:
        return
    if ":" not in name:
        raise ModelConfigError(
            f"model {model!r}{build_did_you_mean(name, MODEL_TIERS)} is neither `provider:model` "
            f"(e.g. openai:gpt-4.1-mini, scripted:demo) nor a tier ({', '.join(MODEL_TIERS)})"
        )
    parse_model_ref(name)


def resolve_model(name_or_tier: str | None, *, default: str, tiers: Mapping[str, str]) -> str:
    """The `provider:model` to use: a `provider:model` name as is, a tier (fast/default/smart) from `tiers`.

    None means the `default` tier when configured, else `default`. An unknown tier is a `ModelConfigError`
    naming the configured ones.
    """
    if name_or_tier is None or not name_or_tier.strip():
        return tiers.get("default", default)
    name = name_or_tier.strip()
    if ":" in name:
        provider, _, model = name.partition(":")
        if not provider or not model:
            raise ModelConfigError(f"model {name!r} must be 'provider:model'")
        return name
    if name in tiers:
        return tiers[name]
    if name == "default":
        return default
    known = sorted({*tiers, "default"})
    raise ModelConfigError(
        f"unknown model tier {name!r}{build_did_you_mean(name, known)}: use 'provider:model' or one of the "
        f"tiers {', '.join(known)}"
    )
