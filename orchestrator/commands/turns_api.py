"""`toolloop submit`, `show`, `cancel`, `approve`, `pending`, `api`: turns from the command line, and the HTTP
API.

Exit codes: 0 ok (for `submit --wait`: the turn completed); 1 the turn ended without completing (stopped,
failed or cancelled: its outcome is printed all the same), `show` or `cancel` of an unknown turn, or
`cancel` of a turn that has already ended; 2 usage error (bad
JSON, a turn with nothing to answer, tools no live worker serves, a model name that is neither
`provider:model` nor a tier, a model setting the provider cannot honour, an output schema that is not a JSON
Schema); 3 Redis is unreachable; 4 `--wait` timed out while the turn was still queued,
running or waiting (it goes on). `submit --stream` ends as `--wait` does, `--timeout` included. Errors are
one line on stderr, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from typing import Annotated, Any

import redis
import typer
from pydantic import ValidationError

from orchestrator.commands.approvals import approve_command, pending_command, result_command
from orchestrator.commands.controls import (
    build_model_names,
    build_model_settings,
    parse_client_tools,
    parse_output_schema,
)
from orchestrator.commands.exits import (
    EXIT_NOT_COMPLETED,
    EXIT_NOT_FOUND,
    EXIT_REDIS,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    build_redis_failure,
    describe_validation_error,
    fail,
)
from orchestrator.model import TurnOutcome, TurnPriority, TurnStatus
from orchestrator.settings import get_settings
from workers.connect import check_redis_url


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


def parse_tools(given: list[str] | None) -> list[str] | None:
    """`--tools a,b` or `--tools a --tools b` (or both) as one list of names, in order, each once (None: every
    non-sensitive tool)."""
    if given is None:
        return None
    names = [name.strip() for text in given for name in text.split(",") if name.strip()]
    return list(dict.fromkeys(names))


def build_limits(max_llm_calls: int | None, deadline_s: float | None, **more: float | None) -> dict[str, Any]:
    """The limits given on the command line (`more`: other `Limits` fields by name); the others keep their
    defaults."""
    given = {"max_llm_calls": max_llm_calls, "deadline_s": deadline_s, **more}
    return {name: value for name, value in given.items() if value is not None}


def build_timeout_message(turn_id: str, status: TurnStatus | None, timeout_s: float) -> str:
    """What `submit --wait` says when the turn has not ended in time: where it stands, and what to check."""
    if status is TurnStatus.QUEUED:
        return (
            f"turn {turn_id} is still queued after {timeout_s:g} s: is an orchestrator running? "
            "(start one: toolloop orchestrator)"
        )
    if status is TurnStatus.WAITING:
        return (
            f"turn {turn_id} did not end within {timeout_s:g} s: it waits for a person to approve a tool "
            f"call (toolloop show {turn_id})"
        )
    state = f"still {status.value}" if status is not None else "its status is unknown"
    return f"turn {turn_id} did not end within {timeout_s:g} s ({state}; toolloop show {turn_id})"


def submit_command(
    *,
    prompt: Annotated[str, typer.Option("--prompt", help="The user's message.")],
    model: Annotated[
        list[str] | None,
        typer.Option(
            help="provider:model or a tier (fast, default, smart); default: the orchestrator's "
            "TOOLLOOP_MODEL. Repeat it for a fallback order: the next model takes a call the previous "
            "one failed after its retries."
        ),
    ] = None,
    instructions: Annotated[
        str | None, typer.Option(help="The system prompt of this turn (not stored in the conversation).")
    ] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature (0 to 2).")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", help="Nucleus sampling (0 to 1).")] = None,
    max_output_tokens: Annotated[
        int | None, typer.Option("--max-output-tokens", help="The most tokens one answer may have.")
    ] = None,
    stop: Annotated[list[str] | None, typer.Option(help="A stop sequence (repeatable).")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed, where the provider has one.")] = None,
    reasoning_effort: Annotated[
        str | None, typer.Option("--reasoning-effort", help="minimal, low, medium or high.")
    ] = None,
    parallel_tool_calls: Annotated[
        bool | None,
        typer.Option(
            "--parallel-tool-calls/--no-parallel-tool-calls",
            help="Whether the model may call several tools at once (default: the provider's).",
        ),
    ] = None,
    setting: Annotated[
        list[str] | None,
        typer.Option(help="KEY=JSON, a provider-specific request field passed through (repeatable)."),
    ] = None,
    output_schema: Annotated[
        str | None,
        typer.Option(
            "--output-schema",
            help="The JSON Schema of the answer (JSON text or @file.json); the outcome's output is the "
            "parsed answer.",
        ),
    ] = None,
    max_output_retries: Annotated[
        int | None,
        typer.Option("--max-output-retries", help="Times an answer breaking the schema is sent back."),
    ] = None,
    max_model_retries: Annotated[
        int | None,
        typer.Option("--max-model-retries", help="Retries of a failing model before the next of --model."),
    ] = None,
    max_total_tokens: Annotated[
        int | None, typer.Option("--max-total-tokens", help="Token budget of the turn.")
    ] = None,
    max_cost_usd: Annotated[
        float | None, typer.Option("--max-cost-usd", help="Cost budget of the turn (USD).")
    ] = None,
    tools: Annotated[
        list[str] | None,
        typer.Option(help="Tool names the model may call: comma-separated, or the option repeated."),
    ] = None,
    client_tools: Annotated[
        str | None,
        typer.Option(
            "--client-tools",
            help="Tools you run yourself (a JSON list of {name, description, parameters}, or @file.json); "
            "answer their calls with `toolloop result`.",
        ),
    ] = None,
    max_llm_calls: Annotated[
        int | None, typer.Option("--max-llm-calls", help="Limit on model calls.")
    ] = None,
    deadline_s: Annotated[
        float | None, typer.Option("--deadline-s", help="Deadline of the turn (s).")
    ] = None,
    context: Annotated[str | None, typer.Option(help="JSON object handed to tools as their context.")] = None,
    conversation: Annotated[str | None, typer.Option(help="Conversation id: continue its history.")] = None,
    tenant: Annotated[
        str | None,
        typer.Option(help='Whose turn it is (default: "default"): tools get it as ctx.tenant.'),
    ] = None,
    priority: Annotated[
        TurnPriority | None,
        typer.Option(help="The turn's lane: interactive, normal (default) or batch."),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait and print the outcome as JSON.")] = False,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream/--no-stream",
            help="Print the answer as it is written (tools on stderr) until the end.",
        ),
    ] = False,
    timeout: Annotated[float, typer.Option(help="How long --wait waits (s).")] = 300.0,
) -> None:
    """Submit a turn; print its id, or with --wait its terminal outcome as JSON (with --output-schema, its
    `output` is the parsed answer).

    With --stream, the id goes to stderr and the answer to stdout as it is written, tool calls, progress and
    outcomes to stderr, until the turn ends. With --wait or --stream, the exit code says how the turn ended:
    0 completed, 1 stopped, failed or cancelled.

    4: not ended within --timeout (the turn goes on). 2: bad input (unknown tool, bad model). 3: no Redis.
    """
    from orchestrator.client.redis_client import Client, RedisUnavailableError
    from orchestrator.commands.stream_printer import StreamPrinter

    settings = get_settings()
    try:
        request_context = parse_context(context)
        model_settings = build_model_settings(
            temperature=temperature,
            top_p=top_p,
            max_output_tokens=max_output_tokens,
            stop=stop,
            seed=seed,
            reasoning_effort=reasoning_effort,
            parallel_tool_calls=parallel_tool_calls,
            settings=setting,
        )
        limits = build_limits(
            max_llm_calls,
            deadline_s,
            max_output_retries=max_output_retries,
            max_model_retries=max_model_retries,
            max_total_tokens=max_total_tokens,
            max_cost_usd=max_cost_usd,
        )
        schema = parse_output_schema(output_schema)
        with Client(settings=settings) as client:
            turn_id = client.submit(
                prompt=prompt,
                tools=parse_tools(tools),
                model=build_model_names(model),
                limits=limits,
                context=request_context,
                conversation_id=conversation,
                tenant=tenant,
                priority=priority,
                instructions=instructions,
                model_settings=model_settings,
                output_schema=schema,
                client_tools=parse_client_tools(client_tools),
            )
            if stream:
                typer.echo(turn_id, err=True)
                printer = StreamPrinter()
                with _deadline(timeout):
                    try:
                        streamed = printer.follow(client.stream(turn_id))
                    except _StreamTimedOut:
                        printer.end_line()
                        status = client.store.get_status(turn_id)
                        fail(build_timeout_message(turn_id, status, timeout), EXIT_TIMEOUT)
                _end_streamed(turn_id, streamed)
                return
            if not wait:
                typer.echo(turn_id)
                return
            try:
                outcome = client.wait(turn_id, timeout=timeout)
            except RedisUnavailableError:
                raise  # a TimeoutError too, but the turn's status cannot be read: Redis is what failed
            except TimeoutError:
                status = client.store.get_status(turn_id)
                fail(build_timeout_message(turn_id, status, timeout), EXIT_TIMEOUT)
    except ValidationError as exc:
        fail(describe_validation_error(exc), EXIT_USAGE)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    except redis.RedisError as exc:
        fail(build_redis_failure(settings.redis_url, exc), EXIT_REDIS)
    typer.echo(json.dumps(outcome.model_dump(mode="json"), indent=2, ensure_ascii=False))
    if outcome.status != TurnStatus.COMPLETED.value:
        reason = f" ({outcome.stop_reason})" if outcome.stop_reason else ""
        typer.echo(f"error: turn {turn_id} ended {outcome.status}{reason}", err=True)
        raise typer.Exit(EXIT_NOT_COMPLETED)


class _StreamTimedOut(BaseException):
    """`--timeout` ran out while `--stream` followed the turn (raised by the interval timer's handler)."""


@contextlib.contextmanager
def _deadline(timeout_s: float) -> Iterator[None]:
    # A Redis read blocks inside the events iterator: only a signal gets the main thread out of it in time.
    def expire(signum: int, frame: object) -> None:
        raise _StreamTimedOut

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(timeout_s, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _end_streamed(turn_id: str, outcome: TurnOutcome | None) -> None:
    if outcome is None:
        fail(f"turn {turn_id} is gone: it expired before its end was read", EXIT_NOT_COMPLETED)
    if outcome.status != TurnStatus.COMPLETED.value:
        reason = f" ({outcome.stop_reason})" if outcome.stop_reason else ""
        fail(f"turn {turn_id} ended {outcome.status}{reason}", EXIT_NOT_COMPLETED)


def show_command(turn_id: Annotated[str, typer.Argument(help="The turn id submit printed.")]) -> None:
    """Print a turn's status, request, transcript so far and outcome as JSON.

    A turn lost when Redis came back without its data shows as failed, its error saying so (and one line on
    stderr); for an unknown id, the data losses Redis is known to have had are named.
    """
    from orchestrator.client.redis_client import Client, UnknownTurnError
    from orchestrator.store import losses
    from orchestrator.store.runner import SyncRunner

    settings = get_settings()
    try:
        with Client(settings=settings) as client:
            try:
                view = client.get(turn_id)
            except UnknownTurnError as exc:
                known = SyncRunner(client.redis).run(losses.read_losses())
                fail(losses.build_unknown_turn_message(exc.args[0], known), EXIT_NOT_FOUND)
    except redis.RedisError as exc:
        fail(build_redis_failure(settings.redis_url, exc), EXIT_REDIS)
    typer.echo(json.dumps(view.model_dump(mode="json"), indent=2, ensure_ascii=False))
    if losses.is_lost_outcome(view.outcome):
        assert view.outcome is not None and view.outcome.error is not None
        typer.echo(f"error: turn {turn_id} was lost: {view.outcome.error.message}", err=True)


def cancel_command(turn_id: Annotated[str, typer.Argument(help="The turn to cancel.")]) -> None:
    """Ask a turn to stop: print `cancelling` (it ends `cancelled`, its calls in flight revoked), or fail when
    it is unknown or has already ended."""
    from orchestrator.client.redis_client import Client, UnknownTurnError

    settings = get_settings()
    try:
        with Client(settings=settings) as client:
            asked = client.cancel(turn_id)
    except UnknownTurnError:
        fail(f"unknown turn {turn_id!r}", EXIT_NOT_FOUND)
    except redis.RedisError as exc:
        fail(build_redis_failure(settings.redis_url, exc), EXIT_REDIS)
    if not asked:
        fail(f"turn {turn_id} has already ended", EXIT_NOT_COMPLETED)
    typer.echo("cancelling")


# How long a stopping API lets requests in progress finish before it closes them (an SSE stream ends at
# once; a request waiting on an unresponsive Redis would otherwise hold the stop for its socket timeout).
API_STOP_S = 3


def api_command(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    allow_no_token: Annotated[
        bool,
        typer.Option(
            "--allow-no-token",
            envvar="TOOLLOOP_API_ALLOW_NO_TOKEN",
            help="Serve without TOOLLOOP_API_TOKEN on a non-loopback address: anyone who reaches it may "
            "submit turns and list tools.",
        ),
    ] = False,
) -> None:
    """Serve the HTTP API (uvicorn) until SIGTERM/SIGINT.

    Bound to an address other machines reach, it needs TOOLLOOP_API_KEYS or TOOLLOOP_API_TOKEN, or
    --allow-no-token (TOOLLOOP_API_ALLOW_NO_TOKEN=1) to serve it open on purpose. A TOOLLOOP_API_KEYS it
    cannot use stops it at once, saying why (exit 2).
    """
    import uvicorn

    from orchestrator.api.access import Access
    from orchestrator.api.app import create_app
    from orchestrator.commands.exposure import build_exposure_refusal
    from orchestrator.errors import ApiKeysError

    settings = get_settings()
    check_redis_url(settings.redis_url)  # a RedisConfigError in one line now, not uvicorn's traceback later
    token = settings.api_token.get_secret_value().strip() if settings.api_token else ""
    try:
        has_keys = bool(Access.from_settings(settings).keys)
    except ApiKeysError as exc:
        fail(str(exc), EXIT_USAGE)
    refusal = build_exposure_refusal(
        what="the API",
        host=host,
        authenticated=bool(token) or has_keys,
        allowed_open=allow_no_token,
        how_to_authenticate="set TOOLLOOP_API_KEYS or TOOLLOOP_API_TOKEN",
        opt_out="--allow-no-token or TOOLLOOP_API_ALLOW_NO_TOKEN=1",
    )
    if refusal is not None:
        fail(refusal, EXIT_USAGE)
    if not token:
        # A blank TOOLLOOP_API_TOKEN (compose passes `${TOOLLOOP_API_TOKEN:-}`) is no token, not one no client
        # could ever send.
        settings = settings.model_copy(update={"api_token": None})
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level="info",
        timeout_graceful_shutdown=API_STOP_S,
    )


def register(app: typer.Typer) -> None:
    """Add `submit`, `show`, `cancel`, `approve`, `result`, `pending` and `api` to `app`."""
    app.command("submit")(submit_command)
    app.command("show")(show_command)
    app.command("cancel")(cancel_command)
    app.command("approve")(approve_command)
    app.command("result")(result_command)
    app.command("pending")(pending_command)
    app.command("api")(api_command)
