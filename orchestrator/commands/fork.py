"""`toolloop fork`: a new turn from a turn's messages up to one of them, that message replaced or re-run.

Exit codes: 0 the fork is stored (its id printed); 1 unknown turn; 2 usage error (an `--at` out of range, a
`--replace` that is not a message JSON or does not fit there, a model or tools the fork cannot be served
with); 3 Redis is unreachable. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

from typing import Annotated, Any

import redis
import typer
from pydantic import ValidationError

from orchestrator.commands.controls import build_model_names, read_json_option
from orchestrator.commands.exits import (
    EXIT_NOT_FOUND,
    EXIT_REDIS,
    EXIT_USAGE,
    build_redis_failure,
    describe_validation_error,
    fail,
)
from orchestrator.settings import get_settings


def parse_replace(text: str | None) -> dict[str, Any] | None:
    """`--replace` as a JSON object (a message: `{"role": "tool", …}`): the text itself, or the file after
    `@`; `ValueError` with a one-line reason."""
    if text is None:
        return None
    value, source = read_json_option(text, "--replace")
    if not isinstance(value, dict):
        raise ValueError(f"{source} must be a JSON object (a message), not {type(value).__name__}")
    return value


def fork_command(
    turn_id: Annotated[str, typer.Argument(help="The turn to fork.")],
    *,
    at: Annotated[
        int, typer.Option("--at", help="The index, in the turn's messages (toolloop show), to fork at.")
    ],
    replace: Annotated[
        str | None,
        typer.Option(
            "--replace",
            help="The message put in place of message --at (JSON or @file.json, e.g. an edited tool "
            'result {"role": "tool", "tool_call_id": …, "name": …, "content": …}); without it, message --at '
            "itself, and the turn re-runs from there.",
        ),
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(help="provider:model or a tier for the fork (repeat it for a fallback order)."),
    ] = None,
    instructions: Annotated[str | None, typer.Option(help="The fork's system prompt.")] = None,
) -> None:
    """Fork a turn at message --at: print the new turn's id. It runs with the original's request (tools,
    limits, settings, tenant …), --model and --instructions replacing its own; the original is untouched.

    1: unknown turn. 2: bad input (--at out of range, a --replace that does not fit). 3: no Redis."""
    from orchestrator.client.redis_client import Client, UnknownTurnError

    settings = get_settings()
    try:
        message = parse_replace(replace)
        with Client(settings=settings) as client:
            forked = client.fork(
                turn_id,
                at,
                replace=message,
                model=build_model_names(model),
                instructions=instructions,
            )
    except UnknownTurnError as exc:
        fail(str(exc), EXIT_NOT_FOUND)
    except ValidationError as exc:
        fail(describe_validation_error(exc), EXIT_USAGE)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    except redis.RedisError as exc:
        fail(build_redis_failure(settings.redis_url, exc), EXIT_REDIS)
    typer.echo(forked)


def register(app: typer.Typer) -> None:
    """Add `fork` to `app`."""
    app.command("fork")(fork_command)
