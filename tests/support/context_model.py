"""A model server with a small context window, speaking OpenAI Chat Completions, for the long-conversation
end-to-end test (`tests/e2e/test_long_conversation.py`).

It refuses a request over `window_tokens` exactly as OpenAI does — 400, `context_length_exceeded`, the
window and the request's size stated in the message — and otherwise plays a simple agent: to a user
message it answers with one call of `fetch_page`, to a tool result with a final answer. A request's size
in tokens is its body's bytes / 4, about what a BPE tokenizer makes of English and JSON. Every request body
is kept, with the answer it got, for the test to read.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

BYTES_PER_TOKEN = 4


@dataclass(frozen=True)
class Received:
    """One request the server received, its size in tokens and whether it was refused."""

    body: dict[str, Any]
    tokens: int
    refused: bool


def build_overflow_body(window_tokens: int, tokens: int) -> dict[str, Any]:
    """OpenAI's 400 body for a request over the model's context window, word for word."""
    return {
        "error": {
            "message": (
                f"This model's maximum context length is {window_tokens} tokens. However, your messages "
                f"resulted in {tokens} tokens. Please reduce the length of the messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def build_answer(body: dict[str, Any], number: int) -> dict[str, Any]:
    """A call of `fetch_page` after a user message (the page it names, else page `number`); a final answer
    after a tool result."""
    messages = body.get("messages") or [{}]
    last = messages[-1]
    message: dict[str, Any]
    if last.get("role") == "tool":
        text = f"The page says: {str(last.get('content', ''))[:60]}"
        message, finish = {"role": "assistant", "content": text}, "stop"
    else:
        named = re.search(r"page (\d+)", str(last.get("content", "")))
        page = named.group(1) if named else number
        arguments = json.dumps({"url": f"https://example.test/page/{page}"})
        call = {
            "id": f"call_{number}",
            "type": "function",
            "function": {"name": "fetch_page", "arguments": arguments},
        }
        message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    return {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


class SmallWindowModelServer:
    """`with SmallWindowModelServer(15_000) as server:`; `server.base_url` ends in `/v1` (OPENAI_BASE_URL)."""

    def __init__(self, window_tokens: int) -> None:
        self.window_tokens = window_tokens
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="small-window-model", daemon=True
        )

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def answer(self, raw: bytes) -> tuple[int, dict[str, Any]]:
        """The status and body answering one request."""
        body = json.loads(raw)
        tokens = len(raw) // BYTES_PER_TOKEN
        refused = tokens > self.window_tokens
        with self._lock:
            self.received.append(Received(body, tokens, refused))
            number = len(self.received)
        if refused:
            return 400, build_overflow_body(self.window_tokens, tokens)
        return 200, build_answer(body, number)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, body = server.answer(raw)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the test reads `received`

        return Handler
