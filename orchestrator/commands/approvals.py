"""`toolloop approve TURN_ID CALL_ID`: answer a tool call waiting for a person; `toolloop pending`: every call
that waits for one (docs/design/approvals.md).

Approve as the model asked, approve with edited `--arguments` (run instead of the model's, once they pass
the tool's schema), or `--deny` with a `--reason` the model sees in the call's result; `--by` says who
answers (kept with the reason in the turn's `approvals`). Exit codes: 0 the answer was recorded; 1 the turn
is unknown or had already ended; 2 usage error (arguments that are not a JSON object or fail the tool's
schema, arguments with --deny); 3 Redis is unreachable.

`toolloop result TURN_ID CALL_ID (--result JSON | --error MSG)` answers a call of a client-side tool (one the
turn's caller runs): its result, which the model reads as the tool's output, or an error. Same exit codes.

`toolloop pending` prints one line per waiting call, the longest waiting first, with the command that
answers it (`approve`, or `result` for a client-side tool's call; `--json`: the calls as JSON); exit code 0,
or 3 when Redis is unreachable.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, Any

import redis
import typer

from orchestrator.commands.exits import (
    EXIT_NOT_FOUND,
    EXIT_REDIS,
    EXIT_USAGE,
    build_redis_failure,
    fail,
)
from orchestrator.commands.stream_printer import build_answer_command, build_duration
from orchestrator.settings import get_settings

if TYPE_CHECKING:
    from orchestrator.store.turn_view import PendingApproval

# A turn that has ended takes no answer: nothing was recorded, as for an unknown turn.
EXIT_ENDED = 1


def parse_arguments(text: str | None) -> dict[str, Any] | None:
    """`--arguments` as a JSON object; ValueError with a one-line reason."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--arguments is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"--arguments must be a JSON object, not {type(value).__name__}")
    return value


def approve_command(
    turn_id: Annotated[str, typer.Argument(help="The turn waiting for an answer.")],
    call_id: Annotated[str, typer.Argument(help="The tool call's id (toolloop show lists them).")],
    *,
    deny: Annotated[bool, typer.Option("--deny", help="Deny the call instead of approving it.")] = False,
    arguments: Annotated[
        str | None,
        typer.Option(help="Approve with these arguments (a JSON object) instead of the model's."),
    ] = None,
    reason: Annotated[
        str | None, typer.Option(help="Why: with --deny, the model reads it in the call's result.")
    ] = None,
    by: Annotated[
        str | None, typer.Option("--by", help="Who answers (kept with the reason in the turn's approvals).")
    ] = None,
) -> None:
    """Approve (or --deny) a tool call that waits for confirmation; print `approved` or `denied`."""
    from orchestrator.client.redis_client import Client, UnknownTurnError
    from orchestrator.errors import CallNotWaitingError

    settings = get_settings()
    try:
        edited = parse_arguments(arguments)
        if deny and edited is not None:
            raise ValueError("--arguments edit an approved call; a denial says why with --reason")
        with Client(settings=settings) as client:
            accepted = client.approve(
                turn_id, call_id, not deny, arguments=edited, reason=reason, decided_by=by
            )
    except UnknownTurnError:
        fail(f"unknown turn {turn_id!r}", EXIT_NOT_FOUND)
    except CallNotWaitingError as exc:
        fail(str(exc), EXIT_ENDED)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    except redis.RedisError as exc:
        fail(build_redis_failure(settings.redis_url, exc), EXIT_REDIS)
    if not accepted:
        fail(f"turn {turn_id} has already ended", EXIT_ENDED)
    typer.echo("denied" if deny else "approved")


def build_pending_line(turn_id: str, pending: PendingApproval, now: float) -> str:
    """One waiting call as `toolloop pending` prints it: how long it has waited, what it is, how long it may
    still wait, and the command that answers it."""
    waited = f"{build_duration(now - pending.since)} ago" if pending.since is not None else "waiting"
    arguments = json.dumps(pending.arguments, ensure_ascii=False, separators=(",", ":"))
    left = ""
    if pending.wait_deadline is not None:
        if pending.waiting_for == "client_result":
            then = "a timeout"  # what the model reads when the caller sends nothing
        else:
            then = "denied" if pending.on_timeout != "approve" else "approved"
        left = f" ({then} in {build_duration(max(pending.wait_deadline - now, 0.0))} without an answer)"
    command = build_answer_command(turn_id, pending.call_id, pending.waiting_for)
    return f"{waited}  {pending.tool}({arguments}){left}\n    {command}"


def result_command(
    turn_id: Annotated[str, typer.Argument(help="The turn waiting for the result.")],
    call_id: Annotated[str, typer.Argument(help="The client-side tool's call id (from `call_waiting`).")],
    *,
    result: Annotated[str | None, typer.Option("--result", help="The tool's result (any JSON).")] = None,
    error: Annotated[
        str | None, typer.Option("--error", help="The tool failed: what the model reads.")
    ] = None,
) -> None:
    """Answer a call of a client-side tool with --result or --error; print `recorded`."""
    from orchestrator.client.redis_client import Client, UnknownTurnError
    from orchestrator.errors import CallNotWaitingError

    settings = get_settings()
    try:
        if (result is None) == (error is None):
            raise ValueError("give exactly one of --result and --error")
        try:
            value = json.loads(result) if result is not None else None
        except json.JSONDecodeError as exc:
            raise ValueError(f"--result is not valid JSON: {exc}") from exc
        with Client(settings=settings) as client:
            accepted = client.submit_tool_result(turn_id, call_id, result=value, error=error)
    except UnknownTurnError:
        fail(f"unknown turn {turn_id!r}", EXIT_NOT_FOUND)
    except CallNotWaitingError as exc:
        fail(str(exc), EXIT_ENDED)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    except redis.RedisError as exc:
        fail(build_redis_failure(settings.redis_url, exc), EXIT_REDIS)
    if not accepted:
        fail(f"turn {turn_id} has already ended", EXIT_ENDED)
    typer.echo("recorded")


def pending_command(
    *,
    as_json: Annotated[bool, typer.Option("--json", help="Print the calls as JSON.")] = False,
) -> None:
    """List every tool call waiting for a person, the longest waiting first, with the command that answers
    it."""
    from orchestrator.client.redis_client import Client
    from orchestrator.store import flows
    from orchestrator.store.runner import SyncRunner

    settings = get_settings()
    try:
        with Client(settings=settings) as client:
            found = SyncRunner(client.redis).run_flow(flows.list_pending())
    except redis.RedisError as exc:
        fail(build_redis_failure(settings.redis_url, exc), EXIT_REDIS)
    if as_json:
        listed = [{"turn_id": turn_id, **p.model_dump(mode="json")} for turn_id, p in found]
        typer.echo(json.dumps(listed, indent=2, ensure_ascii=False))
        return
    if not found:
        typer.echo("no call waits for a person")
        return
    now = time.time()
    for turn_id, pending in found:
        typer.echo(build_pending_line(turn_id, pending, now))
