"""`toolloop normalize FILE [--provider P] [--status N]`: one provider response, normalised, as JSON.

Exit codes: 0 a Turn was printed; 4 the body is a provider error (its JSON printed); 2 the input cannot
be read as a response at all (missing file, not JSON/SSE, an unknown provider name) — one line on stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.model import ProviderError, Turn
from orchestrator.providers.body import INVALID_RESPONSE
from orchestrator.providers.detect import from_response, resolve_provider

EXIT_PROVIDER_ERROR = 4
EXIT_BAD_INPUT = 2


def build_turn_output(turn: Turn) -> dict[str, Any]:
    """The JSON shape `toolloop normalize` prints for a normalised Turn (scripts read it: keep it)."""
    calls: list[dict[str, Any]] = []
    for call in turn.tool_calls:
        entry: dict[str, Any] = {"id": call.id, "name": call.name, "arguments": call.arguments}
        if call.arguments_error:
            # The call stays in the turn and is answered by a validation failure: show why.
            entry["raw_arguments"] = call.raw_arguments
            entry["arguments_error"] = call.arguments_error
        calls.append(entry)
    return {
        "type": turn.type,
        "text": turn.text,
        "thinking": turn.thinking,
        "tool_calls": calls,
        "usage": {
            "input_tokens": turn.usage.input_tokens,
            "output_tokens": turn.usage.output_tokens,
            "total_tokens": turn.usage.total_tokens,
        },
        "model": turn.model,
        "finish_reason": turn.finish_reason,
    }


def build_error_output(error: ProviderError) -> dict[str, Any]:
    """The JSON shape `toolloop normalize` prints for a provider error body; `details` only when present."""
    output: dict[str, Any] = {
        "provider": error.provider,
        "status": error.status,
        "type": error.type,
        "code": error.code,
        "message": error.message,
        "request_id": error.request_id,
        "retryable": error.retryable,
    }
    if error.details:
        output["details"] = error.details
    return {"error": output}


def _fail(message: str) -> typer.Exit:
    typer.echo(f"toolloop normalize: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


def _read_input(file: str) -> bytes:
    if file == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(file).read_bytes()
    except FileNotFoundError:
        raise _fail(f"{file}: no such file") from None
    except IsADirectoryError:
        raise _fail(f"{file}: is a directory") from None
    except OSError as exc:
        raise _fail(f"{file}: cannot read ({exc.strerror or exc})") from None


def normalize(
    file: Annotated[str, typer.Argument(help="Response body or SSE stream to read; '-' for stdin.")],
    provider: Annotated[
        str | None,
        typer.Option("--provider", help="Provider or wire format (openai, anthropic, gemini, groq …)."),
    ] = None,
    status: Annotated[int | None, typer.Option("--status", help="HTTP status of the response.")] = None,
) -> None:
    """Print the normalised Turn of a provider response body or stream as JSON (exit 4 for an error)."""
    if provider is not None and resolve_provider(provider) is None:
        raise _fail(f"unknown provider {provider!r}")
    result = from_response(_read_input(file), provider=provider, status=status)
    if isinstance(result, ProviderError):
        if result.type == INVALID_RESPONSE and (status is None or status < 400):
            raise _fail(f"{file}: {result.message}")
        typer.echo(json.dumps(build_error_output(result), indent=2, ensure_ascii=False))
        raise typer.Exit(EXIT_PROVIDER_ERROR)
    typer.echo(json.dumps(build_turn_output(result), indent=2, ensure_ascii=False))


def register(app: typer.Typer) -> None:
    """Add `normalize` to `app`."""
    app.command("normalize")(normalize)
