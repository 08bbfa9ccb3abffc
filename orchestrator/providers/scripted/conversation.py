"""Reading an OpenAI Chat Completions conversation, for the scripted models (pure).

The `demo` and `plan` models (`scripted.demo`, `scripted.brain`) decide from what the request's `messages`
hold: the user's text, the tool calls made so far and their results, and how many rounds have passed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workers.contract import redact


@dataclass(frozen=True)
class ToolResult:
    """One tool message with the call it answers: the tool's name, the call's argument text, the content."""

    name: str
    arguments: str
    content: str


def content_text(message: Mapping[str, Any] | None) -> str | None:
    """A message's text: a string content, or its text parts joined."""
    if message is None:
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping)]
        return "".join(p for p in parts if isinstance(p, str))
    return None


def last_user_index(messages: Sequence[Mapping[str, Any]]) -> int | None:
    """The index of the last user message, or None."""
    return max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)


def last_user(messages: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The last user message, or None."""
    index = last_user_index(messages)
    return None if index is None else messages[index]


def assistant_count_after_first_user(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many assistant messages follow the first user message: the round a plan is at."""
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), len(messages))
    return sum(1 for m in messages[first_user + 1 :] if m.get("role") == "assistant")


def all_tool_results(messages: Sequence[Mapping[str, Any]]) -> list[ToolResult]:
    """Every tool message of `messages`, in order, with the name and argument text of the call it answers."""
    calls: dict[str, tuple[str, str]] = {}
    results: list[ToolResult] = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, Mapping) else {}
            if isinstance(call, Mapping) and isinstance(function, Mapping):
                calls[str(call.get("id"))] = (str(function.get("name")), str(function.get("arguments", "")))
        if message.get("role") == "tool":
            name, arguments = calls.get(str(message.get("tool_call_id")), (str(message.get("name")), ""))
            results.append(ToolResult(name, arguments, content_text(message) or ""))
    return results


def tool_results_after_last_user(messages: Sequence[Mapping[str, Any]]) -> list[ToolResult]:
    """The tool results of the current question: those after the last user message (all, without one)."""
    index = last_user_index(messages)
    return all_tool_results(messages if index is None else messages[index + 1 :])


def build_summary(results: Sequence[ToolResult]) -> str:
    """The tool results as a list a person reads ("- add(a=2, b=3) → 5.0"); "" when there are none."""
    if not results:
        return ""
    lines = [f"- {build_call_text(r.name, r.arguments)} → {r.content}" for r in results]
    return "Here are the tool results:\n" + "\n".join(lines)


def build_call_text(name: str, arguments: str) -> str:
    """A call as a person reads it: `add(a=2, b=3)`; argument text that is not a JSON object as it is.

    Values under sensitive keys are written `***` (`workers.contract.redact`): the answer is text shown to
    people, which no view can redact after the fact."""
    try:
        value = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError:
        return f"{name}({arguments})"
    if not isinstance(value, dict):
        return f"{name}({arguments})"
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in redact(value).items())
    return f"{name}({shown})"
