"""The body of a Bedrock Converse / ConverseStream request (the REST-JSON members other than `modelId`, which
is in the URL). Pure; `bedrock.to_wire` is `build_body`.

    system                   the request's instructions, then the history's system messages: text blocks
    messages                 user and assistant turns alternating (consecutive ones merged); an assistant
                             turn is its re-sendable reasoning, its text, then a `toolUse` per call; every
                             tool result of a round is a `toolResult` block in the one user turn after it, in
                             call order, `status: error` for an error; a conversation ending with the
                             assistant's turn gets a short user turn after it (as `anthropic.build_messages`)
    toolConfig               tools as `toolSpec` {name, description, inputSchema.json}; `toolChoice` auto,
                             any (required) or tool (a name)
    inferenceConfig          maxTokens, temperature, topP, stopSequences
    additionalModelRequestFields
                             reasoning_effort: for Anthropic models `thinking: {type: enabled,
                             budget_tokens}` (the budget of `profiles.anthropic.THINKING_BUDGET_TOKENS`, as
                             `anthropic_request` does), for any other model `reasoning_effort: <effort>`,
                             which OpenAI's open-weight models take; a model that takes neither refuses the
                             call (a ValidationException) rather than dropping the setting unseen

Tool choice `none`: Converse has no such choice, so no tools are offered. Bedrock refuses a request whose
history holds `toolUse` or `toolResult` blocks without a `toolConfig`, so then (and whenever tools are offered
to none but the history has tool blocks, as on a compaction call) the `toolConfig` holds only
`NO_TOOL`, a tool whose description says it is never to be called.

Output schemas go through the answer tool of `structured` (`ANSWER_TOOL`, its input the answer), as for
Anthropic: Converse's `outputConfig.textFormat` (constrained JSON) is taken by a few recent models only and
refused by the others, while every model that calls tools can call the answer tool. Alone, it is forced
(`any`) on the model families that take a tool choice (Anthropic, Amazon Nova, Mistral) unless thinking is
on (Claude cannot force a tool while thinking); beside other tools it is offered.

Not sent: a seed and `parallel_tool_calls` (Converse has neither: the profile refuses them), prompt-cache
points (`cachePoint`, which only some models take).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.model import AssistantMessage, Message, SystemMessage, ToolMessage, UserMessage
from orchestrator.providers.controls import build_extra
from orchestrator.providers.profiles.anthropic import build_thinking_budget
from orchestrator.providers.structured import ANSWER_TOOL, ANSWER_TOOL_DESCRIPTION
from workers.contract import ToolSpec

if TYPE_CHECKING:
    from orchestrator.providers.base import ModelRequest

PROVIDER = "bedrock"
# maxTokens with thinking on and no limit set: the budget plus this, so that the answer keeps room.
DEFAULT_MAX_TOKENS = 4096
# The user turn after a conversation that ends with the assistant's.
CONTINUE_TEXT = "Continue from the results above."
# A tool result with no text: Bedrock refuses a blank text block (and an empty error result).
EMPTY_RESULT_TEXT = "(no output)"
NO_TOOL = "toolloop_no_tool"
NO_TOOL_DESCRIPTION = "No tool is available now. Never call this tool: answer in text."

# The model family of a Bedrock model id, inference profile (`us.`, `global.`…) or ARN.
_FAMILY = re.compile(r"(?:^|[./])(anthropic|amazon|mistral)\.", re.IGNORECASE)
# Families whose models take `toolChoice` any / tool.
_FORCING_FAMILIES = frozenset({"anthropic", "amazon", "mistral"})


def build_body(request: ModelRequest) -> dict[str, Any]:
    """The Converse request body for `request` (the same for ConverseStream); `extra` merged last."""
    body: dict[str, Any] = {"messages": build_messages(request.messages)}
    system = build_system(request)
    if system:
        body["system"] = system
    tool_config = build_tool_config(request, has_tool_blocks=_has_tool_blocks(body["messages"]))
    if tool_config is not None:
        body["toolConfig"] = tool_config
    inference, additional = build_inference(request)
    if inference:
        body["inferenceConfig"] = inference
    if additional:
        body["additionalModelRequestFields"] = additional
    return build_extra(body, request.settings)


def build_model_family(model: str) -> str | None:
    """`anthropic`, `amazon` or `mistral` for a model id, inference profile or ARN naming one; else None."""
    found = _FAMILY.search(model)
    return found.group(1).lower() if found else None


def build_system(request: ModelRequest) -> list[dict[str, Any]]:
    """The `system` blocks: the request's instructions first, then the history's system messages."""
    texts = [request.instructions] if request.instructions else []
    texts.extend(m.content for m in request.messages if isinstance(m, SystemMessage))
    return [{"text": text} for text in texts if text.strip()]


def build_inference(request: ModelRequest) -> tuple[dict[str, Any], dict[str, Any]]:
    """`inferenceConfig` and `additionalModelRequestFields` of the request's settings (see the module)."""
    settings = request.settings
    max_tokens = settings.max_output_tokens or request.max_output_tokens
    additional: dict[str, Any] = {}
    effort = settings.reasoning_effort
    if effort is not None and build_model_family(request.model) == "anthropic":
        budget = build_thinking_budget(effort, max_tokens)
        additional["thinking"] = {"type": "enabled", "budget_tokens": budget}
        # Claude wants maxTokens above the budget; Bedrock's default for the model may be below it.
        max_tokens = max_tokens or budget + DEFAULT_MAX_TOKENS
    elif effort is not None:
        additional["reasoning_effort"] = effort
    fields = {
        "maxTokens": max_tokens,
        "temperature": settings.temperature,
        "topP": settings.top_p,
        "stopSequences": settings.stop or None,
    }
    return {k: v for k, v in fields.items() if v is not None}, additional


def build_tool_spec(spec: ToolSpec) -> dict[str, Any]:
    """A tool spec as a Converse tool: `toolSpec` {name, description, inputSchema.json}."""
    schema = dict(spec.parameters)
    schema.setdefault("type", "object")
    tool: dict[str, Any] = {"name": spec.name, "inputSchema": {"json": schema}}
    if spec.description.strip():
        tool["description"] = spec.description
    return {"toolSpec": tool}


def build_tool_choice(choice: str | None) -> dict[str, Any] | None:
    """auto → auto, required → any, a tool name → that tool; none and None → None (nothing sent)."""
    if choice is None or choice == "none":
        return None
    if choice == "auto":
        return {"auto": {}}
    if choice == "required":
        return {"any": {}}
    return {"tool": {"name": choice}}


def build_tool_config(request: ModelRequest, *, has_tool_blocks: bool) -> dict[str, Any] | None:
    """`toolConfig`: the offered tools, the answer tool of an output schema, or `NO_TOOL` (see the module)."""
    offered = request.tool_choice != "none"
    tools = [build_tool_spec(t) for t in request.tools] if offered else []
    choice = build_tool_choice(request.tool_choice) if tools else None
    if request.output_schema is not None:
        schema = dict(request.output_schema)
        schema.setdefault("type", "object")
        answer = {
            "name": ANSWER_TOOL,
            "description": ANSWER_TOOL_DESCRIPTION,
            "inputSchema": {"json": schema},
        }
        alone = not tools
        tools.append({"toolSpec": answer})
        if alone:
            choice = _answer_choice(request)
    if not tools:
        if not has_tool_blocks:
            return None
        stub = {
            "name": NO_TOOL,
            "description": NO_TOOL_DESCRIPTION,
            "inputSchema": {"json": {"type": "object"}},
        }
        return {"tools": [{"toolSpec": stub}]}
    return {"tools": tools, "toolChoice": choice} if choice is not None else {"tools": tools}


def _answer_choice(request: ModelRequest) -> dict[str, Any] | None:
    family = build_model_family(request.model)
    thinking = request.settings.reasoning_effort is not None and family == "anthropic"
    return {"any": {}} if family in _FORCING_FAMILIES and not thinking else None


def _has_tool_blocks(messages: list[dict[str, Any]]) -> bool:
    return any("toolUse" in b or "toolResult" in b for m in messages for b in m["content"])


def build_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The `messages` array: user and assistant turns alternating, tool results in the user turn after."""
    merged: list[dict[str, Any]] = []
    for message in messages:
        role, blocks = _blocks(message)
        if not blocks:
            continue  # Bedrock refuses empty content; system messages go to `system`
        if merged and merged[-1]["role"] == role:
            merged[-1]["content"].extend(blocks)
        else:
            merged.append({"role": role, "content": blocks})
    for entry in merged:
        if entry["role"] == "user":
            # A round's results first, in call order (the sort is stable), then any text.
            entry["content"].sort(key=lambda b: "toolResult" not in b)
    if merged and merged[-1]["role"] == "assistant":
        # A last assistant turn would be read as the start of the answer (a prefill, which Claude's thinking
        # refuses); toolloop never prefills, so such a turn is history and the model is asked to go on.
        merged.append({"role": "user", "content": [{"text": CONTINUE_TEXT}]})
    return merged


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    match message:
        case SystemMessage():
            return "system", []
        case UserMessage(content=content):
            return "user", [{"text": content}] if content.strip() else []
        case AssistantMessage():
            return "assistant", _assistant_blocks(message)
        case ToolMessage():
            result: dict[str, Any] = {
                "toolUseId": message.tool_call_id,
                "content": [{"text": message.content if message.content.strip() else EMPTY_RESULT_TEXT}],
            }
            if message.is_error:
                result["status"] = "error"
            return "user", [{"toolResult": result}]
    raise TypeError(f"not a message: {message!r}")


def _assistant_blocks(message: AssistantMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.provider == PROVIDER:
        # Signed or redacted reasoning goes back unchanged and first; reasoning of another provider never.
        blocks.extend({"reasoningContent": r} for r in build_resendable_reasoning(message.provider_data))
    if message.content and message.content.strip():
        blocks.append({"text": message.content})
    for call in message.tool_calls:
        blocks.append({"toolUse": {"toolUseId": call.id, "name": call.name, "input": dict(call.arguments)}})
    return blocks


def build_resendable_reasoning(provider_data: dict[str, Any]) -> list[dict[str, Any]]:
    """The `reasoningContent` blocks of `provider_data["reasoning"]` Bedrock takes back: reasoning text with
    its signature (unmodified), or redacted content. Unsigned reasoning (models that sign none) is not sent:
    only the model that wrote it could read it, and Claude refuses it."""
    kept: list[dict[str, Any]] = []
    raw = provider_data.get("reasoning")
    for block in raw if isinstance(raw, list) else []:
        if not isinstance(block, dict):
            continue
        text_block = block.get("reasoningText")
        redacted = block.get("redactedContent")
        if (
            isinstance(text_block, dict)
            and isinstance(text_block.get("signature"), str)
            and text_block["signature"]
        ):
            text = text_block.get("text")
            kept.append(
                {
                    "reasoningText": {
                        "text": text if isinstance(text, str) else "",
                        "signature": text_block["signature"],
                    }
                }
            )
        elif isinstance(redacted, str) and redacted:
            kept.append({"redactedContent": redacted})
    return kept
