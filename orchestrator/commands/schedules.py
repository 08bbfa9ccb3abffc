"""`toolloop beat`, `toolloop schedule add|rm`, `toolloop schedules`: turns on a schedule.

`schedule add NAME --cron EXPR | --every-s N [--overlap skip|queue|cancel_previous]` takes every option of
`toolloop submit` (read from its signature, so the two never drift apart) except `--wait`, `--stream` and
`--timeout`, and checks them as `submit` does. Exit codes: 0 ok; 1 `schedule rm` of an unknown schedule;
2 bad input (a bad cron expression, an unknown tool, a bad model name …); 3 Redis is unreachable.
"""

from __future__ import annotations

import inspect
import json
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import redis
import typer
from pydantic import ValidationError

from orchestrator.commands.controls import (
    build_model_names,
    build_model_settings,
    parse_client_tools,
    parse_output_schema,
)
from orchestrator.commands.exits import (
    EXIT_NOT_FOUND,
    EXIT_REDIS,
    EXIT_USAGE,
    build_redis_failure,
    describe_validation_error,
    fail,
)
from orchestrator.commands.turns_api import build_limits, parse_context, parse_tools, submit_command
from orchestrator.schedules.schedule import ScheduleView
from orchestrator.settings import get_settings
from workers import keys

# `submit`'s options that are about waiting for the one turn it submits, not about the turn.
NOT_SCHEDULED = frozenset({"wait", "stream", "timeout"})

schedule_app = typer.Typer(
    help="Add or remove a schedule (list them: toolloop schedules).", no_args_is_help=True
)


def build_submit_arguments(options: dict[str, Any]) -> dict[str, Any]:
    """The arguments of `Client.submit` from `toolloop submit`'s options (as typer gives them)."""
    return {
        "prompt": options["prompt"],
        "tools": parse_tools(options["tools"]),
        "model": build_model_names(options["model"]),
        "limits": build_limits(
            options["max_llm_calls"],
            options["deadline_s"],
            max_output_retries=options["max_output_retries"],
            max_model_retries=options["max_model_retries"],
            max_total_tokens=options["max_total_tokens"],
            max_cost_usd=options["max_cost_usd"],
        ),
        "context": parse_context(options["context"]),
        "conversation_id": options["conversation"],
        "tenant": options["tenant"],
        "priority": options["priority"],
        "instructions": options["instructions"],
        "model_settings": build_model_settings(
            temperature=options["temperature"],
            top_p=options["top_p"],
            max_output_tokens=options["max_output_tokens"],
            stop=options["stop"],
            seed=options["seed"],
            reasoning_effort=options["reasoning_effort"],
            parallel_tool_calls=options["parallel_tool_calls"],
            settings=options["setting"],
        ),
        "output_schema": parse_output_schema(options["output_schema"]),
        "client_tools": parse_client_tools(options["client_tools"]),
    }


def schedule_add_command(
    name: str, cron: str | None, every_s: float | None, overlap: str, **options: Any
) -> None:
    """Add a schedule (or replace the one of that name): each run submits the turn the options describe,
    as `toolloop submit` would, on the cron expression (five fields, UTC) or every N seconds.

    `toolloop beat` submits the runs. 2: bad input (a bad cron expression, an unknown tool, a bad model).
    3: no Redis."""
    from orchestrator.client.redis_client import Client

    settings = get_settings()
    try:
        arguments = build_submit_arguments(options)
        with Client(settings=settings) as client:
            view = client.schedule(name, cron=cron, every_s=every_s, overlap=overlap, **arguments)
    except ValidationError as exc:
        fail(describe_validation_error(exc), EXIT_USAGE)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    except redis.RedisError as exc:
        fail(build_redis_failure(settings.redis_url, exc), EXIT_REDIS)
    typer.echo(f"schedule {name}: {view.schedule.timing}, next run {build_time_text(view.next_run_at)}")


def _build_add_signature() -> inspect.Signature:
    keyword = inspect.Parameter.KEYWORD_ONLY
    own = [
        inspect.Parameter(
            "name",
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            annotation=Annotated[str, typer.Argument(help="The schedule's name (letters, digits, _ . -).")],
        ),
        inspect.Parameter(
            "cron",
            keyword,
            default=None,
            annotation=Annotated[
                str | None, typer.Option(help='A five-field cron expression, in UTC ("*/5 * * * *").')
            ],
        ),
        inspect.Parameter(
            "every_s",
            keyword,
            default=None,
            annotation=Annotated[float | None, typer.Option("--every-s", help="Or: seconds between runs.")],
        ),
        inspect.Parameter(
            "overlap",
            keyword,
            default="skip",
            annotation=Annotated[
                str,
                typer.Option(
                    help="While the previous run has not finished: skip (the default), queue (submit "
                    "anyway) or cancel_previous."
                ),
            ],
        ),
    ]
    submits = [
        parameter
        for parameter in inspect.signature(submit_command, eval_str=True).parameters.values()
        if parameter.name not in NOT_SCHEDULED
    ]
    return inspect.Signature([*own, *submits], return_annotation=None)


schedule_add_command.__signature__ = _build_add_signature()  # type: ignore[attr-defined]  # typer reads it


def schedule_rm_command(name: Annotated[str, typer.Argument(help="The schedule's name.")]) -> None:
    """Remove a schedule (its runs' turns stay). 1: no such schedule. 3: no Redis."""
    from orchestrator.client.redis_client import Client

    settings = get_settings()
    try:
        with Client(settings=settings) as client:
            removed = client.unschedule(name)
    except redis.RedisError as exc:
        fail(build_redis_failure(settings.redis_url, exc), EXIT_REDIS)
    if not removed:
        fail(f"no schedule named {name!r} (toolloop schedules lists them)", EXIT_NOT_FOUND)
    typer.echo(f"schedule {name} removed")


def build_time_text(epoch_s: float | None) -> str:
    """A time as a person reads it in a listing: UTC, to the second; '-' for none."""
    if epoch_s is None:
        return "-"
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def build_schedule_lines(views: list[ScheduleView]) -> list[str]:
    """`toolloop schedules`' table: one line per schedule, its last run (time and turn id) and next run."""
    header = ("NAME", "WHEN", "OVERLAP", "LAST RUN", "LAST TURN", "NEXT RUN", "SKIPPED", "ERROR")
    rows = [header] + [
        (
            view.schedule.name,
            view.schedule.timing,
            view.schedule.overlap,
            build_time_text(view.state.last_run_at),
            view.state.last_turn_id or "-",
            build_time_text(view.next_run_at),
            str(view.state.skipped),
            view.state.last_error or "-",
        )
        for view in views
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return [
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in rows
    ]


def schedules_command(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print them as JSON: each schedule, its state and next run.")
    ] = False,
) -> None:
    """List the schedules: when each runs, its last run (time, turn id), its next run, skipped ticks and
    last error. 3: no Redis."""
    from orchestrator.client.redis_client import Client

    settings = get_settings()
    try:
        with Client(settings=settings) as client:
            views = client.schedules()
    except redis.RedisError as exc:
        fail(build_redis_failure(settings.redis_url, exc), EXIT_REDIS)
    if as_json:
        typer.echo(json.dumps([view.model_dump(mode="json") for view in views], indent=2, ensure_ascii=False))
        return
    if not views:
        typer.echo("no schedules (add one: toolloop schedule add NAME --every-s 60 --prompt ...)")
        return
    for line in build_schedule_lines(views):
        typer.echo(line)


def beat_command(
    beat_id: Annotated[
        str | None, typer.Option("--id", help="This beat's id (default: host-pid-random).")
    ] = None,
    lease_ttl_s: Annotated[
        float,
        typer.Option(
            "--lease-ttl-s",
            help="The active beat's lease: a standby takes over this long after the active one died.",
        ),
    ] = keys.BEAT_LEASE_TTL_S,
    heartbeat_file: Annotated[
        Path | None,
        typer.Option(
            "--heartbeat-file",
            help="Touch this file on each pass of the loop (about every second): a liveness probe reads its "
            "age.",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(envvar="TOOLLOOP_LOG_LEVEL", help="Logging level.")] = "INFO",
) -> None:
    """Run Celery beat on toolloop's schedules: submit each due run as a turn, until SIGTERM/SIGINT.

    Safe to run two or more: one holds a lease in Redis and submits, the others stand by and take over
    when it dies."""
    from orchestrator.schedules.beat import run_beat

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_beat(get_settings(), beat_id=beat_id, lease_ttl_s=lease_ttl_s, heartbeat_file=heartbeat_file)


def register(app: typer.Typer) -> None:
    """Add `beat`, `schedule add|rm` and `schedules` to `app`."""
    schedule_app.command("add")(schedule_add_command)
    schedule_app.command("rm")(schedule_rm_command)
    app.add_typer(schedule_app, name="schedule")
    app.command("schedules")(schedules_command)
    app.command("beat")(beat_command)
