"""The scripted model's wire format: OpenAI Chat Completions response bodies, chunks and errors (pure).

The brain (`scripted.brain`) decides an `Answer`; this module writes it as a `CreateChatCompletionResponse`,
as the `chat.completion.chunk` objects that stream it, or as an HTTP error in OpenAI's error format.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ScriptedReply:
    """What the server sends: a 200 completion body, or an HTTP error with OpenAI's error body."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PlannedCall:
    """One tool call the brain decided: parsed arguments, or raw argument text sent as is."""

    name: str
    arguments: dict[str, Any] | None = None
    arguments_raw: str | None = None


@dataclass(frozen=True)
class Answer:
    """The brain's decision before it is put into the wire format."""

    text: str | None = None
    calls: tuple[PlannedCall, ...] = ()
    error: ScriptedReply | None = None


def build_error_reply(
    status: int,
    message: str,
    error_type: str | None = None,
    *,
    code: str | None = None,
    retry_after_s: float | None = None,
) -> ScriptedReply:
    """An HTTP error in OpenAI's error format, with `Retry-After` when asked for."""
    kind = error_type or ("server_error" if status >= 500 else "invalid_request_error")
    headers = {"retry-after": _format_seconds(retry_after_s)} if retry_after_s is not None else {}
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return ScriptedReply(status, body, headers)


def build_completion(
    model: str, messages: Sequence[Mapping[str, Any]], answer: Answer, round_number: int, created: int
) -> dict[str, Any]:
    """A CreateChatCompletionResponse body for the brain's answer."""
    tool_calls = [
        {
            "id": f"call_r{round_number}_{index}",
            "type": "function",
            "function": {
                "name": call.name,
                "arguments": call.arguments_raw
                if call.arguments_raw is not None
                else json.dumps(call.arguments or {}, separators=(",", ":")),
            },
        }
        for index, call in enumerate(answer.calls)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": answer.text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    prompt_tokens = _estimate_tokens(json.dumps(list(messages), sort_keys=True, default=str))
    completion_tokens = _estimate_tokens((answer.text or "") + json.dumps(tool_calls))
    digest = hashlib.sha256(json.dumps([model, list(messages)], sort_keys=True, default=str).encode())
    return {
        "id": f"chatcmpl-scripted-{digest.hexdigest()[:20]}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def build_stream_chunks(completion: Mapping[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` objects that stream `completion`: text a word or so a chunk (as a model
    writes it), then tool calls by index, each call's arguments in two pieces."""
    choice = completion["choices"][0]
    message = choice["message"]
    base = {k: completion[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        entry = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return base | {"choices": [entry]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    for piece in split_text(message.get("content") or ""):
        chunks.append(chunk({"content": piece}))
    for index, call in enumerate(message.get("tool_calls", [])):
        head = {"index": index, "id": call["id"], "type": "function"}
        chunks.append(
            chunk({"tool_calls": [head | {"function": {"name": call["function"]["name"], "arguments": ""}}]})
        )
        for piece in _split_in_two(call["function"]["arguments"]):
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append(base | {"choices": [], "usage": completion["usage"]})
    return chunks


def _estimate_tokens(text: str) -> int:
    # About four characters a token, as a rough real tokenizer would count; never zero.
    return max(1, len(text) // 4)


# A word with the whitespace after it; a long word goes out a few characters at a time.
_WORD = re.compile(r"\S*\s*")
_PIECE_CHARS = 12


def split_text(text: str) -> list[str]:
    """`text` as the pieces a streamed answer sends: a word each, at most `_PIECE_CHARS` characters."""
    return [
        word[i : i + _PIECE_CHARS] for word in _WORD.findall(text) for i in range(0, len(word), _PIECE_CHARS)
    ]


def _split_in_two(text: str) -> list[str]:
    if len(text) < 2:
        return [text] if text else []
    middle = len(text) // 2
    return [text[:middle], text[middle:]]


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)
