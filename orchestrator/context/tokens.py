"""The token estimate of a request: exact where a tokenizer for the model is installed, else conservative.

The conservative estimate is a token per 3 bytes of a message's text (an assistant message's JSON, with its
calls), plus a few tokens of framing per message. BPE tokenizers average about 4 bytes of English or JSON
per token, and 3 bytes is one character of most non-Latin scripts, so the estimate errs high: a view that
fits by it fits the model. Tool schemas are counted the same way. Where `tiktoken` is importable and knows
an OpenAI model's encoding, it counts instead (it is not a dependency: nothing installs it for you).

Pure functions; the one side effect is loading a tokenizer once per encoding, which is cached.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Protocol

from orchestrator.model import Message, SystemMessage, ToolMessage, UserMessage
from workers.contract import ToolSpec

TokenCounter = Callable[[str], int]
"""Tokens in a text."""

BYTES_PER_TOKEN = 3
# Role, separators and the like that every chat format wraps around a message.
MESSAGE_OVERHEAD_TOKENS = 4
REQUEST_OVERHEAD_TOKENS = 8

# Model-name prefixes whose tokenizer `tiktoken` may know.
_EXACT_PREFIXES = ("gpt-", "o1", "o3", "o4", "chatgpt-", "text-embedding-")


class _Encoding(Protocol):
    def encode(self, text: str, *, disallowed_special: tuple[str, ...] = ()) -> list[int]: ...


def estimate_text_tokens(text: str) -> int:
    """The conservative estimate: a token per `BYTES_PER_TOKEN` bytes of UTF-8, rounded up."""
    return -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def build_token_counter(model: str) -> TokenCounter:
    """The counter for `model` (`provider:model` or a bare name): exact if a tokenizer is installed."""
    name = model.partition(":")[2] or model
    name = name.strip().lower().rsplit("/", 1)[-1]
    if name.startswith(_EXACT_PREFIXES):
        encoding = _load_encoding(name)
        if encoding is not None:
            return lambda text: len(encoding.encode(text, disallowed_special=()))
    return estimate_text_tokens


@lru_cache(maxsize=32)
def _load_encoding(name: str) -> _Encoding | None:
    try:
        tiktoken = importlib.import_module("tiktoken")
        encoding: _Encoding = tiktoken.encoding_for_model(name)
    except Exception:
        # Not installed, a model it does not know, or its encoding file not at hand offline: estimate.
        return None
    return encoding


def count_message_tokens(message: Message, count: TokenCounter = estimate_text_tokens) -> int:
    """Tokens of one message as sent: its text (with a tool result's id and name), or the JSON of an
    assistant message (text, calls, continuation data), plus the framing."""
    if isinstance(message, ToolMessage):
        return (
            MESSAGE_OVERHEAD_TOKENS + count(message.content) + count(f"{message.tool_call_id} {message.name}")
        )
    if isinstance(message, UserMessage | SystemMessage):
        return MESSAGE_OVERHEAD_TOKENS + count(message.content)
    # Rare and small next to tool results: a serialisation is cheap enough here.
    return MESSAGE_OVERHEAD_TOKENS + count(message.model_dump_json(exclude_defaults=True))


def count_tools_tokens(tools: Sequence[ToolSpec], count: TokenCounter = estimate_text_tokens) -> int:
    """Tokens of the tool schemas offered to the model: name, description and parameters of each."""
    if not tools:
        return 0
    schemas = [[t.name, t.description, t.parameters] for t in tools]
    return count(json.dumps(schemas, ensure_ascii=False, separators=(",", ":")))


def count_controls_tokens(
    instructions: str | None,
    output_schema: Mapping[str, Any] | None,
    count: TokenCounter = estimate_text_tokens,
) -> int:
    """Tokens of what a request carries besides its messages and tools: the instructions (sent as a first
    message, or a field that costs the same) and the output schema."""
    tokens = MESSAGE_OVERHEAD_TOKENS + count(instructions) if instructions else 0
    if output_schema:
        tokens += count(json.dumps(output_schema, ensure_ascii=False, separators=(",", ":")))
    return tokens


def count_request_tokens(
    messages: Sequence[Message], tools: Sequence[ToolSpec], count: TokenCounter = estimate_text_tokens
) -> int:
    """Tokens of a whole request: every message, the tool schemas and the request's own framing."""
    return (
        REQUEST_OVERHEAD_TOKENS
        + count_tools_tokens(tools, count)
        + sum(count_message_tokens(m, count) for m in messages)
    )
