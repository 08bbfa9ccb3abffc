"""How a `toolloop` command ends when it fails: an exit code, and one line on stderr, never a traceback.

The codes the commands share: 1 what was asked about is not there or did not complete (an unknown turn, a
turn or a tool call that ended without completing); 2 usage error (bad input, a bad setting); 3 Redis is
unreachable; 4 a wait ran out while the work went on. Each command's docstring says which of its failures
end with which. The command modules import this one, never each other, for what they share.
"""

from __future__ import annotations

from typing import NoReturn

import redis
import typer
from pydantic import ValidationError

from orchestrator.errors import RedisUnavailableError
from orchestrator.store.connection import build_shown_url

EXIT_NOT_FOUND = 1
# A turn that ended stopped, failed or cancelled: `submit --wait` fails as `toolloop call` does for a failed
# outcome, with the same code.
EXIT_NOT_COMPLETED = 1
EXIT_USAGE = 2
EXIT_REDIS = 3
EXIT_TIMEOUT = 4


def fail(message: str, code: int) -> NoReturn:
    """End the command with `code`, saying `message` on stderr as `error: message`."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def describe_validation_error(exc: ValidationError, whole: str = "request") -> str:
    """A pydantic error in one line: each field's path (`whole` when it is about all of it) and message."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or whole}: {e['msg']}" for e in exc.errors())


def build_redis_failure(redis_url: str, exc: redis.RedisError) -> str:
    """The one line a command says when Redis failed it: the URL (password hidden) and why.

    The clients ride out a restart (`store.runner.Patience`): what gets here outlasted their patience, and
    says so itself, or is a refusal no retry mends (a wrong password)."""
    if isinstance(exc, RedisUnavailableError):
        return str(exc)
    return f"cannot reach Redis at {build_shown_url(redis_url)}: {' '.join(str(exc).split())}"
