"""The scripted model's brain: an OpenAI Chat Completions request body in, a reply out (pure).

`scripted:<name>` is a deterministic local model served over the OpenAI-compatible wire format by
`scripted.server`, so the demo and the tests exercise the same HTTP path as a real provider. Models:

- `demo` — answers arithmetic ("What is 2+3, times 4?": add, then multiply) and weather questions with the
  offered demo tools, calling in parallel what it can, then states the results (`scripted.demo`); asked for
  a JSON Schema (`response_format`), its final answer is an object filled from the tool results
  (`scripted.typed`).
- `plan` — the first user message holds `{"plan": [round, ...]}`; the round used is the number of assistant
  messages after that message. A round is `{"calls": [{"name", "arguments" | "arguments_raw"}, ...]}`,
  `{"text": "..."}` or `{"error": {"status", "message", "retry_after"?, "times"?}}`; `{"repeat": true}` on
  the last round repeats it forever; past the last round comes a final answer summarising the tool results.
  An error round is answered with that HTTP error on every attempt, or only on the first `times` attempts
  of an identical request, after which the plan goes on with the next round as if the error were not there;
  with `"model": "<name>"` (`plan-down` or `scripted:plan-down`) it answers only requests for that model,
  and the others go on as if it were not there — a fallback list moves on to a model that answers.
  `plan-<anything>` is the same model under another name, so that a fallback list can name two.
- `echo` — a final answer repeating the last user message.

Tool-call ids are derived from the round number, so they are deterministic and unique across a turn.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.providers.scripted.conversation import (
    all_tool_results,
    assistant_count_after_first_user,
    build_summary,
    content_text,
    last_user,
)
from orchestrator.providers.scripted.demo import build_demo_answer
from orchestrator.providers.scripted.typed import build_typed_answer, requested_schema
from orchestrator.providers.scripted.wire import (
    Answer,
    PlannedCall,
    ScriptedReply,
    build_completion,
    build_error_reply,
)

MODELS = ("demo", "plan", "echo")
OWNER = "toolloop"


def build_reply(body: object, *, attempt: int = 0, created: int = 0) -> ScriptedReply:
    """The reply to one `POST /v1/chat/completions` body.

    `attempt` counts earlier identical requests (the server keeps that count), so that a plan's error round
    with `times` can fail a fixed number of times and then let a retry through.
    """
    if not isinstance(body, Mapping):
        return build_error_reply(400, "request body must be a JSON object", "invalid_request_error")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return build_error_reply(400, "'messages' must be a non-empty array", "invalid_request_error")
    model = str(body.get("model", ""))
    name = model.removeprefix("scripted:")
    wire_messages = [m for m in messages if isinstance(m, Mapping)]
    if name == "demo":
        answer = build_demo_answer(wire_messages, _offered_tools(body.get("tools")))
        schema = requested_schema(body)
        if schema is not None and answer.text is not None and not answer.calls:
            answer = Answer(text=build_typed_answer(schema, all_tool_results(wire_messages)))
    elif name == "plan" or name.startswith("plan-"):
        answer = _plan(wire_messages, attempt, name)
    elif name == "echo":
        answer = Answer(text=content_text(last_user(wire_messages)) or "(empty)")
    else:
        return build_error_reply(
            404,
            f"The model `{model}` does not exist. Known: {', '.join(MODELS)}",
            "invalid_request_error",
            code="model_not_found",
        )
    if answer.error is not None:
        return answer.error
    round_number = assistant_count_after_first_user(wire_messages)
    return ScriptedReply(200, build_completion(model, wire_messages, answer, round_number, created))


def build_models_list() -> dict[str, Any]:
    """The `GET /v1/models` body."""
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": 0, "owned_by": OWNER} for name in MODELS],
    }


def request_fingerprint(body: object) -> str:
    """Identifies identical requests, for the server's attempt count."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


# --- the tools a request offers, by name (their parameters schema) ---------------------------------------


def _offered_tools(raw: object) -> dict[str, Mapping[str, Any]]:
    offered: dict[str, Mapping[str, Any]] = {}
    for entry in raw if isinstance(raw, list) else []:
        function = entry.get("function") if isinstance(entry, Mapping) else None
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            parameters = function.get("parameters")
            offered[function["name"]] = parameters if isinstance(parameters, Mapping) else {}
    return offered


# --- plan ------------------------------------------------------------------------------------------------


def _plan(messages: Sequence[Mapping[str, Any]], attempt: int, name: str) -> Answer:
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), None)
    if first_user is None:
        return Answer(error=build_error_reply(400, "plan: no user message", "invalid_request_error"))
    plan = find_plan(content_text(messages[first_user]) or "")
    if plan is None:
        return Answer(error=build_error_reply(400, 'plan: the first user message has no {"plan": [...]}'))
    steps = _group_steps(plan)
    round_number = assistant_count_after_first_user(messages)
    if round_number >= len(steps):
        if steps and steps[-1].repeat:
            round_number = len(steps) - 1
        else:
            return Answer(text=build_summary(all_tool_results(messages)) or "Done.")
    return _play_step(steps[round_number], attempt, messages, name)


@dataclass(frozen=True)
class _Step:
    errors: tuple[Mapping[str, Any], ...]
    entry: Mapping[str, Any] | None
    repeat: bool


def find_plan(text: str) -> list[Mapping[str, Any]] | None:
    """The `{"plan": [...]}` object in a message, possibly after other text; None when there is none."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and isinstance(value.get("plan"), list):
            return [r for r in value["plan"] if isinstance(r, Mapping)]
    return None


def _group_steps(plan: Sequence[Mapping[str, Any]]) -> list[_Step]:
    # Error rounds produce no assistant message, so they attach to the next answering round.
    steps: list[_Step] = []
    errors: list[Mapping[str, Any]] = []
    for entry in plan:
        if "error" in entry:
            errors.append(entry)
            continue
        steps.append(_Step(tuple(errors), entry, bool(entry.get("repeat"))))
        errors = []
    if errors:
        steps.append(_Step(tuple(errors), None, bool(errors[-1].get("repeat"))))
    return steps


def _play_step(step: _Step, attempt: int, messages: Sequence[Mapping[str, Any]], name: str) -> Answer:
    used = 0
    for entry in step.errors:
        error = entry["error"] if isinstance(entry["error"], Mapping) else {}
        if not _error_round_applies(error.get("model", entry.get("model")), name):
            continue
        times = error.get("times", entry.get("times"))
        if not isinstance(times, int) or attempt < used + times:
            return Answer(error=_error_round(error))
        used += times
    if step.entry is None:
        return Answer(text=build_summary(all_tool_results(messages)) or "Done.")
    if "calls" in step.entry:
        return Answer(calls=tuple(_planned_call(c) for c in step.entry["calls"] if isinstance(c, Mapping)))
    return Answer(text=str(step.entry.get("text", "")))


def _error_round_applies(model: object, name: str) -> bool:
    return not isinstance(model, str) or model.removeprefix("scripted:") == name


def _error_round(error: Mapping[str, Any]) -> ScriptedReply:
    status = error.get("status", 500)
    retry_after = error.get("retry_after")
    return build_error_reply(
        status if isinstance(status, int) else 500,
        str(error.get("message", "scripted error")),
        error.get("type") if isinstance(error.get("type"), str) else None,
        code=error.get("code") if isinstance(error.get("code"), str) else None,
        retry_after_s=float(retry_after) if isinstance(retry_after, int | float) else None,
    )


def _planned_call(raw: Mapping[str, Any]) -> PlannedCall:
    arguments = raw.get("arguments")
    arguments_raw = raw.get("arguments_raw")
    return PlannedCall(
        name=str(raw.get("name", "")),
        arguments=dict(arguments) if isinstance(arguments, Mapping) else None,
        arguments_raw=arguments_raw if isinstance(arguments_raw, str) else None,
    )
