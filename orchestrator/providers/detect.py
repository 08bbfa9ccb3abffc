"""Any provider's response body or stream → a Turn or a ProviderError (docs/design/providers.md).

`from_response` takes raw bytes, text (JSON, SSE or NDJSON) or an already-decoded body, finds the wire
format (from the provider name the caller gives, else from the body's shape) and hands it to that
format's module. Every name a provider goes by (`groq`, `deepseek`, `vllm`, `ollama_openai_compat` …)
maps to the module that reads its wire format; most speak OpenAI Chat Completions.

Modules are imported by name when first needed, so each wire format lives in its own module and a
format nobody uses costs nothing.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from typing import Any, Protocol, cast

from orchestrator.model import ProviderError, Turn
from orchestrator.providers.body import (
    decode_json,
    decode_text,
    invalid_response,
    is_error_body,
)
from orchestrator.providers.common import IdSource, parse_sse


class ProviderModule(Protocol):
    """What every wire-format module under `orchestrator.providers` exposes."""

    PROVIDER: str

    def from_wire(self, body: object, *, ids: IdSource | None = None) -> Turn | ProviderError: ...

    def from_stream(self, text: str, *, ids: IdSource | None = None) -> Turn | ProviderError: ...

    def error_from_wire(
        self, status: int | None, body: object, headers: Mapping[str, str] | None = None
    ) -> ProviderError: ...


_OPENAI_COMPATIBLE = [
    "openai_compat",
    "openai_compatible",
    "chat_completions",
    "gemini_openai_compat",
    "ollama_openai_compat",
    "deepseek",
    "groq",
    "mistral",
    "xai",
    "grok",
    "together",
    "together_hf",
    "huggingface",
    "hf",
    "vllm",
    "vllm_crusoe",
    "crusoe",
    "openrouter",
    "lmstudio",
    "lm_studio",
    "llamacpp",
    "llama_cpp",
    "fireworks",
    "perplexity",
    "azure",
    "azure_openai",
    "cerebras",
    "sambanova",
    "deepinfra",
    "nvidia",
    "nim",
    "moonshot",
    "kimi",
    "dashscope",
    "qwen",
    "zai",
    "glm",
    "scripted",
]

ALIASES: dict[str, str] = {
    **dict.fromkeys(_OPENAI_COMPATIBLE, "openai_chat"),
    "openai_chat": "openai_chat",
    "openai": "openai_chat",
    "openai_responses": "openai_responses",
    "responses": "openai_responses",
    "anthropic": "anthropic",
    "claude": "anthropic",
    "gemini": "gemini",
    "google": "gemini",
    "vertex": "gemini",
    "vertex_ai": "gemini",
    "ollama": "ollama",
    "ollama_native": "ollama",
    "bedrock": "bedrock",
    "bedrock_converse": "bedrock",
    "aws_bedrock": "bedrock",
    "cohere": "cohere",
    "cohere_v2": "cohere",
    "bare": "bare",
    "message": "bare",
    "tool_calls": "bare",
    "turn": "bare",
}

# Wire formats whose shape no other format shares: when the body has one, it decides over the name given
# ("openai" serves both Chat Completions and the Responses API; Gemini also serves Chat Completions).
_UNMISTAKABLE = frozenset({"openai_chat", "openai_responses", "anthropic", "gemini", "bedrock"})


def canonical_name(provider: str) -> str:
    """A provider name as the alias table spells it: lower case, `-`, `.` and spaces as `_`."""
    return provider.strip().lower().replace("-", "_").replace(".", "_").replace(" ", "_")


def resolve_provider(provider: str) -> str | None:
    """The module that reads `provider`'s wire format, or None for a name nobody uses."""
    return ALIASES.get(canonical_name(provider))


def load_module(name: str) -> ProviderModule:
    """The wire-format module `orchestrator.providers.<name>`."""
    return cast(ProviderModule, importlib.import_module(f"orchestrator.providers.{name}"))


def from_response(
    body: str | bytes | object,
    *,
    provider: str | None = None,
    status: int | None = None,
    ids: IdSource | None = None,
    headers: Mapping[str, str] | None = None,
) -> Turn | ProviderError:
    """Normalise one response body or whole stream; never raises on a bad body.

    `provider` is any alias in `ALIASES` (None: detect from the body); `status` the HTTP status (>= 400
    makes it an error body); pass one `ids` through every response of a turn so synthetic tool-call
    ids stay unique across the turn.
    """
    hinted = None
    label = None
    if provider is not None:
        hinted = resolve_provider(provider)
        label = canonical_name(provider)
        if hinted is None:
            known = ", ".join(sorted(ALIASES))
            return ProviderError(
                provider=provider,
                type="unknown_provider",
                message=f"unknown provider {provider!r}; known: {known}",
            )
    source = ids or IdSource()
    if isinstance(body, str | bytes):
        text = decode_text(body, label or "unknown")
        if isinstance(text, ProviderError):
            return text
        result = _from_text(text, hinted, status, source, headers)
    else:
        result = _from_body(body, hinted, status, source, headers)
    if isinstance(result, ProviderError) and label and result.provider != label:
        return result.model_copy(update={"provider": label})
    return result


def _from_text(
    text: str, hinted: str | None, status: int | None, ids: IdSource, headers: Mapping[str, str] | None
) -> Turn | ProviderError:
    stripped = text.strip()
    if not stripped:
        if status is not None and status >= 400:
            return load_module(hinted or "bare").error_from_wire(status, "", headers)
        return invalid_response(hinted or "unknown", "empty response body", retryable=True)
    if status is not None and status >= 400:
        parsed = decode_json(stripped, hinted or "unknown")
        error_body = stripped if isinstance(parsed, ProviderError) else parsed
        return _error(error_body, hinted, status, headers)
    if _looks_like_sse(stripped):
        return _from_sse(text, hinted, ids)
    parsed = decode_json(stripped, hinted or "unknown")
    if isinstance(parsed, ProviderError):
        lines = [line for line in stripped.splitlines() if line.strip()]
        if len(lines) > 1 and all(line.lstrip().startswith("{") for line in lines):
            return _from_ndjson(stripped, lines, hinted, ids)
        return parsed
    return _from_body(parsed, hinted, status, ids, headers)


def _looks_like_sse(text: str) -> bool:
    first = text.lstrip().split("\n", 1)[0]
    return first.startswith(("data:", "event:", ":", "id:", "retry:"))


def _from_body(
    body: object, hinted: str | None, status: int | None, ids: IdSource, headers: Mapping[str, str] | None
) -> Turn | ProviderError:
    if (status is not None and status >= 400) or is_error_body(body) or _is_aws_error(body):
        return _error(body, hinted, status, headers)
    detected = detect_shape(body)
    module = _choose(hinted, detected)
    if module is None:
        return invalid_response(
            "unknown", "unrecognised response shape; name the provider (e.g. --provider openai)"
        )
    if module == "gemini" and isinstance(body, list):
        from orchestrator.providers import gemini

        return gemini.from_chunks(body, ids=ids)
    if module == "bedrock" and isinstance(body, list):
        from orchestrator.providers import bedrock

        return bedrock.from_stream(_dump(body), ids=ids)
    return load_module(module).from_wire(body, ids=ids)


def _choose(hinted: str | None, detected: str | None) -> str | None:
    if hinted is None:
        return detected
    if detected is not None and detected != hinted and (detected in _UNMISTAKABLE or hinted == "bare"):
        # A clear shape beats the name: "openai" with a Responses body, "gemini" at its OpenAI endpoint.
        return detected
    return hinted


def _error(
    body: object, hinted: str | None, status: int | None, headers: Mapping[str, str] | None
) -> ProviderError:
    module = hinted or _error_family(body)
    return load_module(module).error_from_wire(status, body, headers)


def _error_family(body: object) -> str:
    if not isinstance(body, dict):
        return "bare"
    if body.get("type") == "error":
        return "anthropic"
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("status"), str):
        return "gemini"
    if isinstance(error, str):
        return "ollama"
    if _is_aws_error(body):
        return "bedrock"
    return "openai_chat" if isinstance(error, dict) else "bare"


def _is_aws_error(body: object) -> bool:
    return isinstance(body, dict) and isinstance(body.get("__type"), str) and "output" not in body


def detect_shape(body: object) -> str | None:
    """The module whose wire format `body` has, from the keys only that format uses; None if unknown."""
    if isinstance(body, list):
        if body and all(isinstance(c, dict) and ("candidates" in c or "usageMetadata" in c) for c in body):
            return "gemini"
        if body and all(isinstance(e, dict) and e.keys() & _BEDROCK_EVENTS for e in body):
            return "bedrock"
        return "bare"
    if not isinstance(body, dict):
        return None
    if body.keys() & {"candidates", "promptFeedback", "usageMetadata"}:
        return "gemini"
    if "choices" in body:
        return "openai_chat"
    if body.get("object") == "response" or isinstance(body.get("output"), list):
        return "openai_responses"
    if body.get("type") == "message" or (isinstance(body.get("content"), list) and "stop_reason" in body):
        return "anthropic"
    if isinstance(body.get("output"), dict) or "stopReason" in body:
        return "bedrock"
    if isinstance(body.get("message"), dict):
        return _message_family(body)
    if body.get("type") in ("tool_calls", "final_answer") or body.keys() & {"role", "tool_calls", "content"}:
        return "bare"
    return None


def _message_family(body: dict[str, Any]) -> str:
    message: dict[str, Any] = body["message"]
    if body.keys() & {"done", "done_reason", "created_at", "eval_count", "prompt_eval_count"}:
        return "ollama"
    if "tool_plan" in message or isinstance(message.get("content"), list) or "finish_reason" in body:
        return "cohere"
    return "ollama"


_BEDROCK_EVENTS = frozenset(
    {"messageStart", "contentBlockStart", "contentBlockDelta", "contentBlockStop", "messageStop", "metadata"}
)
_ANTHROPIC_EVENTS = frozenset(
    {"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta"}
)
_COHERE_EVENTS = frozenset(
    {"message-start", "content-start", "content-delta", "tool-plan-delta", "tool-call-start", "message-end"}
)


def _from_sse(text: str, hinted: str | None, ids: IdSource) -> Turn | ProviderError:
    detected = None
    first_error: object = None
    for event in parse_sse(text):
        data = decode_json(event.data, "unknown") if event.data.strip() not in ("", "[DONE]") else None
        if first_error is None and is_error_body(data):
            first_error = data
        detected = _stream_family(event.event, data)
        if detected is not None:
            break
    module = _choose(hinted, detected)
    if module is not None:
        return load_module(module).from_stream(text, ids=ids)
    if first_error is not None:
        # A stream of nothing but an error event says nothing of its format: the common reader takes it.
        return _error(first_error, None, None, None)
    return invalid_response(
        "unknown", "unrecognised event stream; name the provider (e.g. --provider gemini)"
    )


def _stream_family(event_name: str | None, data: object) -> str | None:
    kind = data.get("type") if isinstance(data, dict) else None
    names = {event_name, kind if isinstance(kind, str) else None}
    if any(isinstance(n, str) and n.startswith("response.") for n in names):
        return "openai_responses"
    if names & _ANTHROPIC_EVENTS:
        return "anthropic"
    if names & _COHERE_EVENTS:
        return "cohere"
    if not isinstance(data, dict) or is_error_body(data):
        return None
    if data.keys() & {"candidates", "usageMetadata"}:
        return "gemini"
    if "choices" in data or data.get("object") == "chat.completion.chunk":
        return "openai_chat"
    return None


def _from_ndjson(text: str, lines: list[str], hinted: str | None, ids: IdSource) -> Turn | ProviderError:
    first = decode_json(lines[0], hinted or "unknown")
    detected = "bedrock" if isinstance(first, dict) and first.keys() & _BEDROCK_EVENTS else "ollama"
    module = hinted if hinted in ("ollama", "bedrock") else detected
    return load_module(module).from_stream(text, ids=ids)


def _dump(body: object) -> str:
    return json.dumps(body)
