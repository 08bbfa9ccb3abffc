"""`toolloop submit`, `toolloop show`, `toolloop api`: turns from the command line, and the HTTP API server.

Exit codes: 0 ok; 1 unknown turn, or `--wait` timed out; 2 usage error (bad JSON, a turn with nothing to
answer); 3 Redis is unreachable. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, NoReturn

import redis
import typer
from pydantic import ValidationError

from orchestrator.settings import get_settings

EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_REDIS = 3


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def parse_context(text: str | None) -> dict[str, Any]:
    """`--context` as a JSON object; ValueError with a one-line reason."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--context is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"--context must be a JSON object, not {type(value).__name__}")
    return value


def parse_tools(text: str | None) -> list[str] | None:
    """`--tools a,b` as a list of names (None: every non-sensitive tool)."""
    if text is None:
        return None
    return [name.strip() for name in text.split(",") if name.strip()]


def build_limits(max_llm_calls: int | None, deadline_s: float | None) -> dict[str, Any]:
    """The limits given on the command line; the others keep their defaults."""
    limits: dict[str, Any] = {}
    if max_llm_calls is not None:
        limits["max_llm_calls"] = max_llm_calls
    if deadline_s is not None:
        limits["deadline_s"] = deadline_s
    return limits


def _one_line(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}" for e in exc.errors())


def submit_command(
    *,
    prompt: Annotated[str, typer.Option("--prompt", help="The user's message.")],
    model: Annotated[
        str | None, typer.Option(help="provider:model or a tier (fast, default, smart).")
    ] = None,
    tools: Annotated[str | None, typer.Option(help="Comma-separated tool names the model may call.")] = None,
    max_llm_calls: Annotated[
        int | None, typer.Option("--max-llm-calls", help="Limit on model calls.")
    ] = None,
    deadline_s: Annotated[
        float | None, typer.Option("--deadline-s", help="Deadline of the turn (s).")
    ] = None,
    context: Annotated[str | None, typer.Option(help="JSON object handed to tools as their context.")] = None,
    conversation: Annotated[str | None, typer.Option(help="Conversation id: continue its history.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait and print the outcome as JSON.")] = False,
    timeout: Annotated[float, typer.Option(help="How long --wait waits (s).")] = 300.0,
) -> None:
    """Submit a turn; print its id, or with --wait its terminal outcome as JSON."""
    from orchestrator.client import Client

    settings = get_settings()
    try:
        request_context = parse_context(context)
        with Client(settings=settings) as client:
            turn_id = client.submit(
                prompt=prompt,
                tools=parse_tools(tools),
                model=model,
                limits=build_limits(max_llm_calls, deadline_s),
                context=request_context,
                conversation_id=conversation,
            )
            if not wait:
                typer.echo(turn_id)
                return
            outcome = client.wait(turn_id, timeout=timeout)
    except ValidationError as exc:
        _fail(_one_line(exc), EXIT_USAGE)
    except ValueError as exc:
        _fail(str(exc), EXIT_USAGE)
    except TimeoutError as exc:
        _fail(str(exc), EXIT_NOT_FOUND)
    except redis.RedisError as exc:
        _fail(f"cannot reach Redis at {settings.redis_url}: {exc}", EXIT_REDIS)
    typer.echo(json.dumps(outcome.model_dump(mode="json"), indent=2, ensure_ascii=False))


def show_command(turn_id: Annotated[str, typer.Argument(help="The turn id submit printed.")]) -> None:
    """Print a turn's status, request, transcript so far and outcome as JSON."""
    from orchestrator.client import Client, UnknownTurnError

    settings = get_settings()
    try:
        with Client(settings=settings) as client:
            view = client.get(turn_id)
    except UnknownTurnError as exc:
        _fail(f"{exc.args[0]} (never submitted, or expired)", EXIT_NOT_FOUND)
    except redis.RedisError as exc:
        _fail(f"cannot reach Redis at {settings.redis_url}: {exc}", EXIT_REDIS)
    typer.echo(json.dumps(view.model_dump(mode="json"), indent=2, ensure_ascii=False))


def api_command(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
) -> None:
    """Serve the HTTP API (uvicorn)."""
    import uvicorn

    from orchestrator.api import create_app

    uvicorn.run(create_app(get_settings()), host=host, port=port, log_level="info")


def register(app: typer.Typer) -> None:
    """Add `submit`, `show` and `api` to `app`."""
    app.command("submit")(submit_command)
    app.command("show")(show_command)
    app.command("api")(api_command)
