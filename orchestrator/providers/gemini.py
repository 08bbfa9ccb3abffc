"""Google Gemini `generateContent` and `streamGenerateContent`, both ways, on the Gemini API and on Vertex
AI: the provider's profile, the one module the registry knows it by. Responses and errors are read by
`gemini_response`, streams by `gemini_stream`, and requests are built by `gemini_request`; all three sit
below this one, which gathers them.

The model is in the URL and so is streaming (`:streamGenerateContent?alt=sse`), never in the body:
`build_url` gives the Gemini API's (`{base}/v1beta/models/{model}:…`, the key in `x-goog-api-key`),
`build_vertex_url` Vertex AI's (`{base}/models/{model}:…` under the publisher base URL of a project and a
location, `google_auth.build_vertex_base_url`; a bearer token from `google_auth.GoogleAuth`). `to_wire`
builds one body for both.

Model controls: temperature, top_p, max_output_tokens, stop, seed and reasoning_effort are honoured
(`gemini_request`); what Gemini refuses (parallel_tool_calls false, more than five stop sequences, the
fields `extra` may not replace) is its profile's (`profiles.gemini`). `extra` is merged into the body last.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from orchestrator.model import ProviderError, Turn
from orchestrator.providers.body import is_error_body
from orchestrator.providers.common import IdSource
from orchestrator.providers.controls import build_extra
from orchestrator.providers.gemini_request import (
    build_contents,
    build_gemini_schema,
    build_generation_config,
    build_system_instruction,
    build_tool_param,
    build_tools,
    opt_dict,
    uses_answer_tool,
)
from orchestrator.providers.gemini_response import PROVIDER, error_from_wire, from_chunks, from_wire
from orchestrator.providers.gemini_stream import GeminiStreamReader
from orchestrator.providers.rate_limits import RateLimitSignal, parse_retry_after, read_header
from orchestrator.providers.stream_reader import StreamReader, read_stream_text
from orchestrator.providers.structured import ANSWER_TOOL

if TYPE_CHECKING:
    from orchestrator.providers.base import ModelRequest

__all__ = [
    "API_VERSION",
    "DEFAULT_BASE_URL",
    "PROVIDER",
    "build_gemini_schema",
    "build_tool_param",
    "build_url",
    "build_vertex_url",
    "error_from_wire",
    "from_chunks",
    "from_stream",
    "from_wire",
    "opt_dict",
    "parse_rate_limits",
    "stream_reader",
    "to_wire",
]

DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
API_VERSION = "v1beta"
# A base URL that already names an API version (a gateway's `…/v1beta`) gets none added.
_VERSIONED = re.compile(r"/v1(?:alpha|beta\d*)?$")


# --- URLs ------------------------------------------------------------------------------------------------


def build_url(base_url: str, model: str, *, stream: bool) -> str:
    """The Gemini API URL of one call of `model` at `base_url` (`GEMINI_BASE_URL`, default
    `DEFAULT_BASE_URL`): `{base}/v1beta/models/{model}:generateContent`, or
    `:streamGenerateContent?alt=sse` to stream. A base URL that ends with its version keeps it."""
    root = base_url.rstrip("/")
    if not _VERSIONED.search(root):
        root = f"{root}/{API_VERSION}"
    return f"{root}/models/{_model_segment(model)}:{_method(stream)}"


def build_vertex_url(base_url: str, model: str, *, stream: bool) -> str:
    """The Vertex AI URL of one call of `model` under a publisher base URL (`build_vertex_base_url`):
    `{base}/models/{model}:generateContent`, or `:streamGenerateContent?alt=sse` to stream."""
    return f"{base_url.rstrip('/')}/models/{_model_segment(model)}:{_method(stream)}"


def _model_segment(model: str) -> str:
    # `models/gemini-2.5-flash` (the API's own resource name) and `gemini-2.5-flash` are one model.
    return quote(model.strip().removeprefix("models/"), safe="")


def _method(stream: bool) -> str:
    return "streamGenerateContent?alt=sse" if stream else "generateContent"


# --- rate limits -----------------------------------------------------------------------------------------


def parse_rate_limits(status: int | None, headers: Mapping[str, str], now: float) -> RateLimitSignal:
    """Gemini states no remaining quota in its headers: a 429 (`RESOURCE_EXHAUSTED`) is a refusal, with the
    `retry-after` a gateway in front may add (Gemini's own wait, a `RetryInfo` detail in the body, is read
    into the error by `error_from_wire`). `now` is unused."""
    del now
    return RateLimitSignal(
        refused=status == 429, retry_after_s=parse_retry_after(read_header(headers, "retry-after"))
    )


# --- stream -> Turn --------------------------------------------------------------------------------------


def stream_reader(request: ModelRequest | None = None) -> StreamReader:
    """A reader for one streamed response (`gemini_stream.GeminiStreamReader`); for a request whose output
    schema is the answer tool, one that streams that tool's arguments as the answer's text."""
    answer_tool = ANSWER_TOOL if request is not None and uses_answer_tool(request) else None
    return GeminiStreamReader(answer_tool=answer_tool)


def from_stream(text: str, *, ids: IdSource | None = None) -> Turn | ProviderError:
    """A Turn from a whole `streamGenerateContent?alt=sse` body (LF or CRLF), accumulated."""
    return read_stream_text(stream_reader(), text, ids)


# --- request ---------------------------------------------------------------------------------------------


def to_wire(request: ModelRequest, *, stream: bool = False) -> dict[str, Any]:
    """The `generateContent` body for `request` (pure), the same streamed or not (the URL says which):
    contents, system instruction, tools and tool config, generation config, then `extra`."""
    del stream  # Gemini asks for a stream in the URL, never in the body
    body: dict[str, Any] = {"contents": build_contents(request.messages, model=request.model)}
    system = build_system_instruction(request)
    if system is not None:
        body["systemInstruction"] = system
    body.update(build_tools(request))
    config = build_generation_config(request)
    if config:
        body["generationConfig"] = config
    return build_extra(body, request.settings)


# --- detection (`detect`: which wire format an unlabelled body has) -----------------------------------------


def sniff_body(body: object) -> bool:
    """True for a `generateContent` response, or a JSON array of stream chunks."""
    if isinstance(body, list):
        return bool(body) and all(
            isinstance(c, dict) and ("candidates" in c or "usageMetadata" in c) for c in body
        )
    return isinstance(body, dict) and bool(body.keys() & {"candidates", "promptFeedback", "usageMetadata"})


def sniff_event(event_name: str | None, data: object) -> bool:
    """True for a stream chunk: a response with candidates or usage."""
    del event_name  # Gemini's events are unnamed
    return (
        isinstance(data, dict)
        and not is_error_body(data)
        and bool(data.keys() & {"candidates", "usageMetadata"})
    )


def sniff_error(body: dict[str, Any]) -> bool:
    """True for Google's error envelope, whose `error.status` is a word (`RESOURCE_EXHAUSTED`)."""
    error = body.get("error")
    return isinstance(error, dict) and isinstance(error.get("status"), str)
