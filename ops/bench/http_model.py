"""A fast OpenAI-compatible model server for the benchmark's HTTP variant, as its own process.

The shipped scripted server's app (`providers.scripted.server.build_app`: a plain body, or SSE chunks when
the request asks for a stream, no pause between chunks) with one change the benchmark needs: every tool call
gets a random id, as real providers give them (`instant.give_unique_ids`), rather than the brain's per-round
numbers (`call_r1_0`): the id is in every key and message of the call, so its length and its spread are
those of production.

It runs apart from the orchestrator so that the model's CPU is the model server's, not the orchestrator's,
and the orchestrator pays exactly what it pays in production: building the request, the socket, reading the
answer.

    python -m ops.bench.http_model --port P      # http://127.0.0.1:P/v1; ready when GET /v1/models answers
"""

from __future__ import annotations

import sys
import time

import httpx
import typer
import uvicorn

from ops.bench.instant import give_unique_ids
from ops.bench.procs import Proc
from ops.redis_server import find_free_port
from orchestrator.providers.scripted.server import build_app

HOST = "127.0.0.1"


class ModelServer:
    """The model server subprocess; `base_url` ends in `/v1`, as OPENAI_BASE_URL does."""

    def __init__(self) -> None:
        self.port = find_free_port(HOST)
        self.base_url = f"http://{HOST}:{self.port}/v1"
        command = [sys.executable, "-m", "ops.bench.http_model", f"--port={self.port}"]
        self.proc = Proc(command, {}, "model")

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until `GET /v1/models` answers (an orchestrator may start before: it calls no model then)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise RuntimeError(f"model server exited early:\n{self.proc.log_text()}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"model server not ready after {timeout_s} s:\n{self.proc.log_text()}")


def serve(port: int = typer.Option(..., help="Port on 127.0.0.1.")) -> None:
    """Serve until SIGTERM/SIGINT."""
    app = build_app(amend=give_unique_ids)
    uvicorn.run(app, host=HOST, port=port, lifespan="off", log_level="warning", access_log=False)


if __name__ == "__main__":
    typer.run(serve)
