"""The parts of a Gemini `generateContent` request (pure; `gemini.to_wire` puts them together): the
conversation's `contents`, the `systemInstruction`, the function declarations and `toolConfig`, and the
`generationConfig` that model controls shape. The same body serves the Gemini API and Vertex AI.

Contents alternate `user` and `model` (consecutive messages of one role share one content). A model turn this
provider wrote goes back as its own parts, verbatim (`provider_data["parts"]`), so that every
`thoughtSignature` returns on the part it came with — Gemini 3 refuses a function call sent back without
its signature; each call's name and arguments are the message's. A model turn from elsewhere (a client's
history) is rebuilt from its text and calls, and for a model that checks signatures its first call carries
the validator-skipping signature Google documents for such history. Every result of a round is one
`functionResponse` part (`{"output": …}`, or `{"error": …}` for a failed call), all of them in one user
content, in the order of the calls, with the call's `id` when the call had one (Vertex AI gives ids).
Thinking text is never sent apart from those parts. A conversation that ends with the model's turn gets a
user turn asking it to go on (toolloop never prefills).

Settings: `temperature`, `topP`, `maxOutputTokens`, `stopSequences`, `seed`; `reasoning_effort` is
`thinkingConfig` with `includeThoughts` (so that thinking is seen): `thinkingBudget` (the budgets of
`THINKING_BUDGET_TOKENS`) on Gemini 1 and 2 models, `thinkingLevel` (the effort's name) on later
ones, which take levels. An output schema is native JSON output (`responseMimeType` and `responseSchema`)
when no tool is offered; beside tools it is the answer tool of `structured` (Gemini before 3 refuses JSON
output with function calling), forced when the turn's `tool_choice` is `none`.

Function declarations and the response schema use the OpenAPI subset Gemini takes (`build_gemini_schema`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from orchestrator.model import (
    AssistantMessage,
    Message,
    ReasoningEffort,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from orchestrator.providers.common import clean_tool_name, join_text
from orchestrator.providers.gemini_response import PROVIDER, is_text_part
from orchestrator.providers.structured import ANSWER_TOOL, ANSWER_TOOL_DESCRIPTION
from workers.contract import ToolSpec

if TYPE_CHECKING:
    from orchestrator.providers.base import ModelRequest

# The user turn after a conversation that ends with the model's (see `build_contents`).
CONTINUE_TEXT = "Continue from the results above."
# What Google documents as the signature of a function call whose real one is not known (history written
# elsewhere): Gemini 3 refuses the call without one.
SKIP_SIGNATURE = "skip_thought_signature_validator"
JSON_MIME_TYPE = "application/json"
# Gemini 1 and 2 models think within a token budget; later ones take a thinking level.
_BUDGET_MODEL = re.compile(r"(?:^|/)gemini-[12](?:[.-]|$)")
# The thinking budget of each effort on those: within every 2.5 model's range (Flash-Lite 512-24576,
# Flash 0-24576, Pro 128-32768).
THINKING_BUDGET_TOKENS: Mapping[ReasoningEffort, int] = MappingProxyType(
    {"minimal": 512, "low": 2048, "medium": 8192, "high": 24576}
)


# --- contents --------------------------------------------------------------------------------------------


@dataclass
class _Contents:
    """The `contents` being built, and what the results need to know of the calls already sent."""

    signed: bool
    contents: list[dict[str, Any]] = field(default_factory=list)
    # Call id → the id Gemini gave that call (None: it gave none), for the call's result.
    wire_ids: dict[str, str | None] = field(default_factory=dict)

    def append(self, role: str, parts: list[dict[str, Any]]) -> None:
        if not parts:
            return  # Gemini refuses a content without parts
        if self.contents and self.contents[-1]["role"] == role:
            self.contents[-1]["parts"].extend(parts)
        else:
            self.contents.append({"role": role, "parts": parts})

    def add_model(self, message: AssistantMessage) -> None:
        parts = build_model_parts(message, signed=self.signed)
        wire_calls = [part["functionCall"] for part in parts if "functionCall" in part]
        for call, wire in zip(message.tool_calls, wire_calls, strict=True):
            self.wire_ids[call.id] = wire.get("id")
        self.append("model", parts)

    def add_result(self, message: ToolMessage) -> None:
        wire_id = self.wire_ids.get(message.tool_call_id)
        self.append("user", [build_function_response(message, wire_id)])

    def build(self) -> list[dict[str, Any]]:
        for content in self.contents:
            if content["role"] == "user":
                # Results first (the machine writes them in the order of their calls, which is how Gemini
                # pairs them), then any text a user turn added after them.
                content["parts"].sort(key=lambda part: "functionResponse" not in part)
        if self.contents and self.contents[-1]["role"] == "model":
            # A last model turn would be read as the start of the answer; toolloop never prefills. Such a
            # turn is history: another provider's calls flattened to text after a fallback, say.
            self.contents.append({"role": "user", "parts": [{"text": CONTINUE_TEXT}]})
        return self.contents


def build_contents(messages: Sequence[Message], *, model: str = "") -> list[dict[str, Any]]:
    """The `contents` array of `messages` (system messages go to `systemInstruction`); `model` says whether
    function calls need a thought signature (Gemini 3 and later)."""
    built = _Contents(signed=needs_signatures(model))
    for message in messages:
        match message:
            case SystemMessage():
                continue
            case UserMessage(content=content):
                built.append("user", [{"text": content}] if content else [])
            case AssistantMessage():
                built.add_model(message)
            case ToolMessage():
                built.add_result(message)
            case _:
                raise TypeError(f"not a message: {message!r}")
    return built.build()


def needs_signatures(model: str) -> bool:
    """True for a model that refuses a function call sent back without its thought signature (Gemini 3
    and later: every model but Gemini 1 and 2's)."""
    return _BUDGET_MODEL.search(model.strip().lower()) is None


def build_model_parts(message: AssistantMessage, *, signed: bool) -> list[dict[str, Any]]:
    """The parts of one model turn: its own parts when this provider wrote it and they still say what the
    message says, else parts rebuilt from its text and calls; with `signed`, the first call carries a
    signature whatever happens."""
    parts = _own_parts(message) if message.provider == PROVIDER else None
    if parts is None:
        parts = _rebuilt_parts(message)
    if signed:
        first_call = next((p for p in parts if "functionCall" in p), None)
        if first_call is not None and not first_call.get("thoughtSignature"):
            first_call["thoughtSignature"] = SKIP_SIGNATURE
    return parts


def _own_parts(message: AssistantMessage) -> list[dict[str, Any]] | None:
    raw = message.provider_data.get("parts")
    if not isinstance(raw, list) or not all(isinstance(p, dict) for p in raw):
        return None
    call_parts = [p["functionCall"] for p in raw if isinstance(p.get("functionCall"), dict)]
    names = [clean_tool_name(c.get("name")) for c in call_parts]
    if names != [c.name for c in message.tool_calls]:
        return None
    text = join_text([p["text"] for p in raw if is_text_part(p) and not p.get("thought")])
    if (text or None) != (message.content or None):
        return None  # the text was changed since (trimmed, say): the message is what is sent
    calls = iter(message.tool_calls)
    parts: list[dict[str, Any]] = []
    for part in raw:
        if isinstance(part.get("functionCall"), dict):
            wire_id = part["functionCall"].get("id")
            parts.append({**copy.deepcopy(part), "functionCall": _call(next(calls), wire_id)})
        elif part.keys() == {"text"} and not part["text"]:
            continue  # an empty fragment with nothing else on it: Gemini refuses empty parts
        else:
            parts.append(copy.deepcopy(part))
    return parts


def _rebuilt_parts(message: AssistantMessage) -> list[dict[str, Any]]:
    own = message.provider == PROVIDER
    signatures = message.provider_data.get("thought_signatures") if own else None
    wire_ids = _wire_call_ids(message.provider_data.get("parts")) if own else set()
    parts: list[dict[str, Any]] = [{"text": message.content}] if message.content else []
    for call in message.tool_calls:
        part: dict[str, Any] = {"functionCall": _call(call, call.id if call.id in wire_ids else None)}
        signature = signatures.get(call.id) if isinstance(signatures, dict) else None
        if isinstance(signature, str) and signature:
            part["thoughtSignature"] = signature
        parts.append(part)
    return parts


def _wire_call_ids(raw: object) -> set[str]:
    ids: set[str] = set()
    for part in raw if isinstance(raw, list) else []:
        call = part.get("functionCall") if isinstance(part, dict) else None
        if isinstance(call, dict) and isinstance(call.get("id"), str):
            ids.add(call["id"])
    return ids


def _call(call: ToolCall, wire_id: object) -> dict[str, Any]:
    wire: dict[str, Any] = {"name": call.name, "args": dict(call.arguments)}
    if isinstance(wire_id, str) and wire_id:
        wire["id"] = wire_id
    return wire


def build_function_response(message: ToolMessage, wire_id: str | None) -> dict[str, Any]:
    """A tool result as a `functionResponse` part: the result under `output`, a failure's under `error`
    (the keys Google documents), with the call's own id when Gemini gave it one."""
    response: dict[str, Any] = {
        "name": message.name,
        "response": {"error" if message.is_error else "output": message.content},
    }
    if wire_id:
        response["id"] = wire_id
    return {"functionResponse": response}


# --- system instruction, tools ---------------------------------------------------------------------------


def build_system_instruction(request: ModelRequest) -> dict[str, Any] | None:
    """`systemInstruction`: the request's instructions first, then the history's system messages."""
    texts = [request.instructions] if request.instructions else []
    texts.extend(m.content for m in request.messages if isinstance(m, SystemMessage) and m.content)
    return {"parts": [{"text": "\n\n".join(texts)}]} if texts else None


def uses_answer_tool(request: ModelRequest) -> bool:
    """True when the request's output schema is given as the answer tool (tools are offered beside it)."""
    return request.output_schema is not None and bool(request.tools)


def build_tools(request: ModelRequest) -> dict[str, Any]:
    """`tools` (one `functionDeclarations` list) and `toolConfig` for the offered tools and the requested
    choice; the answer tool of an output schema beside them."""
    declarations = [build_tool_param(t) for t in request.tools]
    answer = uses_answer_tool(request)
    if answer and request.output_schema is not None:
        declarations.append(build_declaration(ANSWER_TOOL, ANSWER_TOOL_DESCRIPTION, request.output_schema))
    if not declarations:
        return {}
    body: dict[str, Any] = {"tools": [{"functionDeclarations": declarations}]}
    config = build_function_calling_config(request.tool_choice, answer_tool=answer)
    if config is not None:
        body["toolConfig"] = {"functionCallingConfig": config}
    return body


def build_function_calling_config(choice: str | None, *, answer_tool: bool = False) -> dict[str, Any] | None:
    """auto → AUTO, required → ANY, none → NONE (with an answer tool: that tool forced), a tool name →
    ANY with that one name allowed; None leaves Gemini's default (AUTO)."""
    if choice is None:
        return None
    if choice == "auto":
        return {"mode": "AUTO"}
    if choice == "required":
        return {"mode": "ANY"}
    if choice == "none":
        return {"mode": "ANY", "allowedFunctionNames": [ANSWER_TOOL]} if answer_tool else {"mode": "NONE"}
    return {"mode": "ANY", "allowedFunctionNames": [choice]}


def build_tool_param(spec: ToolSpec) -> dict[str, Any]:
    """A Gemini function declaration for a tool, its schema cleaned of what Gemini rejects."""
    return build_declaration(spec.name, spec.description, spec.parameters)


def build_declaration(name: str, description: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A function declaration: name, description and, when it has any, its parameters' schema."""
    declaration: dict[str, Any] = {"name": name, "description": description}
    schema = build_response_schema(parameters)
    # A function without parameters is declared without a schema: Gemini rejects an empty OBJECT.
    if schema.get("properties"):
        declaration["parameters"] = schema
    return declaration


def build_response_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A whole JSON Schema (its `$defs` / `definitions` inlined) in Gemini's subset."""
    defs = {**opt_dict(schema.get("definitions")), **opt_dict(schema.get("$defs"))}
    return build_gemini_schema(schema, defs, frozenset())


# --- generation config -----------------------------------------------------------------------------------


def build_generation_config(request: ModelRequest) -> dict[str, Any]:
    """`generationConfig` of the request's settings and, with no tool offered, its output schema;
    `max_output_tokens` of the settings wins over the request's own."""
    settings = request.settings
    config: dict[str, Any] = {
        "temperature": settings.temperature,
        "topP": settings.top_p,
        "maxOutputTokens": settings.max_output_tokens or request.max_output_tokens,
        "stopSequences": list(settings.stop) if settings.stop else None,
        "seed": settings.seed,
    }
    config = {k: v for k, v in config.items() if v is not None}
    if settings.reasoning_effort is not None:
        thinking: dict[str, Any] = {"includeThoughts": True}
        if _BUDGET_MODEL.search(request.model.strip().lower()):
            thinking["thinkingBudget"] = THINKING_BUDGET_TOKENS[settings.reasoning_effort]
        else:
            thinking["thinkingLevel"] = settings.reasoning_effort.upper()
        config["thinkingConfig"] = thinking
    if request.output_schema is not None and not uses_answer_tool(request):
        config["responseMimeType"] = JSON_MIME_TYPE
        config["responseSchema"] = build_response_schema(request.output_schema)
    return config


# --- JSON Schema → Gemini's schema subset ----------------------------------------------------------------


# Keywords of the OpenAPI 3.0 schema subset Gemini function declarations accept; others are rejected.
_ALLOWED_SCHEMA_KEYS = frozenset(
    {
        "type",
        "format",
        "description",
        "nullable",
        "enum",
        "items",
        "properties",
        "required",
        "anyOf",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "minProperties",
        "maxProperties",
        "default",
        "propertyOrdering",
    }
)
_SUPPORTED_FORMATS = frozenset({"enum", "date-time", "int32", "int64", "float", "double"})


def opt_dict(value: object) -> dict[str, Any]:
    """`value` when it is a dict, else {} (schema fragments written by people can be anything)."""
    return value if isinstance(value, dict) else {}


def build_gemini_schema(
    schema: Mapping[str, Any], defs: Mapping[str, Any], seen: frozenset[str]
) -> dict[str, Any]:
    """A JSON Schema rewritten into Gemini's subset: `$ref`s inlined, unions made `nullable`/`anyOf`,
    `const` made a one-value enum, unsupported formats moved into the description, other keywords dropped.
    """
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        if name in seen or name not in defs:
            # A recursive or dangling reference cannot be inlined: an untyped object is the honest rest.
            return {"type": "object", "description": str(schema.get("description", ""))}
        target = {**opt_dict(defs[name]), **{k: v for k, v in schema.items() if k != "$ref"}}
        return build_gemini_schema(target, defs, seen | {name})
    out: dict[str, Any] = {}
    for union_key in ("anyOf", "oneOf"):
        if isinstance(schema.get(union_key), list):
            out.update(_build_union(schema[union_key], defs, seen))
    for one in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
        if isinstance(one, dict):
            out.update(build_gemini_schema(one, defs, seen))
    _copy_type(schema, out)
    if "const" in schema:
        out["enum"] = [schema["const"]]
    for key, value in schema.items():
        if key in _ALLOWED_SCHEMA_KEYS and key not in ("type", "anyOf", "properties", "items"):
            out[key] = value
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {
            name: build_gemini_schema(opt_dict(sub), defs, seen) for name, sub in schema["properties"].items()
        }
    if isinstance(schema.get("items"), dict):
        out["items"] = build_gemini_schema(schema["items"], defs, seen)
    _fix_enum_and_format(out)
    return out


def _build_union(members: list[Any], defs: Mapping[str, Any], seen: frozenset[str]) -> dict[str, Any]:
    kept = [m for m in members if isinstance(m, dict) and m.get("type") != "null"]
    nullable = len(kept) < len(members)
    options = [build_gemini_schema(m, defs, seen) for m in kept]
    out: dict[str, Any] = options[0] if len(options) == 1 else ({"anyOf": options} if options else {})
    if nullable:
        out["nullable"] = True
    return out


def _copy_type(schema: Mapping[str, Any], out: dict[str, Any]) -> None:
    type_ = schema.get("type")
    if isinstance(type_, list):
        names = [t for t in type_ if isinstance(t, str) and t != "null"]
        if len(names) < len(type_):
            out["nullable"] = True
        if names:
            out["type"] = names[0]
    elif isinstance(type_, str):
        out["type"] = type_


def _fix_enum_and_format(out: dict[str, Any]) -> None:
    enum = out.get("enum")
    if isinstance(enum, list) and not all(isinstance(v, str) for v in enum):
        # Gemini enums are strings only; a number enum keeps its type and says its values in words.
        del out["enum"]
        allowed = ", ".join(str(v) for v in enum)
        description = out.get("description")
        out["description"] = f"{description} (one of: {allowed})" if description else f"One of: {allowed}"
    elif isinstance(enum, list):
        out.setdefault("type", "string")
    fmt = out.get("format")
    if isinstance(fmt, str) and fmt not in _SUPPORTED_FORMATS:
        del out["format"]
        description = out.get("description")
        out["description"] = f"{description} (format: {fmt})" if description else f"Format: {fmt}"
