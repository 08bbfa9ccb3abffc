"""How an MCP `tools/call` answer becomes a toolloop result (pure; the answer as its wire JSON).

- `isError: true` → `McpToolError` with the answer's text: the call ends `execution_error`, its message
  `McpToolError: <text>` (never retried: the tool ran and failed);
- `structuredContent` → the outcome's `result` (that object), and the text blocks, joined by newlines, its
  `content` (what the model sees); with no text block, the content is the result's JSON;
- text blocks only → the text, joined by newlines: `result` and `content` both;
- other blocks (images, audio, resources) → `result` is the list of blocks as the server sent them, and
  `content` the text blocks with a line for each other block (`[image: image/png, 2048 bytes]`,
  `[resource: file:///a.txt]`; an embedded text resource shows its text).

The size cap (`max_result_bytes`) applies to the content, and the result is left in the envelope only
while its JSON fits too (`workers.outcomes.build_success`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workers.errors import McpToolError
from workers.outcomes import ShownResult

NO_ERROR_TEXT = "the tool reported an error without saying what"


def build_result(answer: Mapping[str, Any]) -> Any:
    """The result of a call whose `tools/call` answer is `answer`; raises `McpToolError` for `isError`."""
    blocks = [block for block in answer.get("content") or [] if isinstance(block, Mapping)]
    texts = [str(block.get("text", "")) for block in blocks if block.get("type") == "text"]
    if answer.get("isError"):
        raise McpToolError("\n".join(texts).strip() or NO_ERROR_TEXT)
    structured = answer.get("structuredContent")
    if structured is not None:
        return ShownResult(structured, "\n".join(texts)) if texts else structured
    if len(texts) == len(blocks):
        return "\n".join(texts)
    return ShownResult([dict(block) for block in blocks], "\n".join(describe_block(b) for b in blocks))


def describe_block(block: Mapping[str, Any]) -> str:
    """A content block as a line of text for the model."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "audio"):
        return f"[{kind}: {block.get('mimeType', '?')}, {_decoded_bytes(block.get('data'))} bytes]"
    if kind == "resource_link":
        return f"[resource: {block.get('uri', '?')}]"
    if kind == "resource":
        resource = block.get("resource")
        if isinstance(resource, Mapping):
            if isinstance(resource.get("text"), str):
                return str(resource["text"])
            size = _decoded_bytes(resource.get("blob"))
            return f"[resource: {resource.get('uri', '?')}, {resource.get('mimeType') or '?'}, {size} bytes]"
    return f"[{kind or 'unknown'} content]"


def _decoded_bytes(data: object) -> int:
    # base64: 4 characters for 3 bytes, less the padding.
    if not isinstance(data, str):
        return 0
    return len(data) * 3 // 4 - data[-2:].count("=")
