"""`toolloop flower [--port P] [--address A] [FLOWER OPTIONS]`: Flower on the workers' broker, with auth.

`celery flower` run without `--broker` watches AMQP on localhost, not toolloop's Redis. This command builds
the Celery app the workers build (`workers.app.create_app`: the broker of `TOOLLOOP_BROKER_URL` or
`TOOLLOOP_REDIS_URL`, with the same `broker_use_ssl` for `rediss://`, and for a `sentinel://` URL the
`master_name` transport option from `TOOLLOOP_REDIS_MASTER_NAME`, which Flower's broker view reads too) and
runs Flower on it. Basic auth is Flower's own, from `FLOWER_BASIC_AUTH=user:password`; Flower's HTTP API
stays behind it (`FLOWER_UNAUTHENTICATED_API=false` unless set). Bound to an address other machines reach,
it refuses to start without authentication unless told `--allow-no-auth`. Any other option is Flower's own
and passed on as is (`--tasks_columns=name,uuid,state,kwargs`, `--basic_auth=user:password`, …).

Exit codes: 0 stopped (SIGTERM, SIGINT); 2 usage error (no authentication on a non-loopback address).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
from typing import Annotated

import typer

from orchestrator.commands.exits import EXIT_USAGE, fail

# Once Flower has stopped serving, how long the process may take to exit before it leaves without waiting for
# Flower's threads (see `_exit_within`).
EXIT_WITHIN_S = 2.0
# Flower's own variables and options for basic auth or an OAuth provider (either guards its pages and API).
AUTH_VARIABLES = ("FLOWER_BASIC_AUTH", "FLOWER_AUTH")
AUTH_OPTIONS = ("--basic_auth", "--auth")
FLOWER_INSTALL_HINT = "pip install 'celery-toolloop[ops]'"


def build_flower_argv(port: int, address: str, flower_options: list[str]) -> list[str]:
    """The `celery` command line (after the program name) that runs Flower on the app it is given."""
    return ["flower", f"--port={port}", f"--address={address}", *flower_options]


def is_flower_installed() -> bool:
    """Whether Flower can be imported: it comes with the `ops` extra, not with the package itself."""
    return importlib.util.find_spec("flower") is not None


def is_authenticated(environ: dict[str, str], flower_options: list[str]) -> bool:
    """Whether Flower will ask for credentials: basic auth or OAuth, from its variables or its options."""
    given = {option.split("=", 1)[0] for option in flower_options}
    return any(environ.get(name) for name in AUTH_VARIABLES) or bool(given & set(AUTH_OPTIONS))


def flower_command(
    ctx: typer.Context,
    port: Annotated[int, typer.Option("--port", "-p", help="Port of Flower's web UI.")] = 5555,
    address: Annotated[str, typer.Option("--address", help="Address to bind.")] = "127.0.0.1",
    allow_no_auth: Annotated[
        bool,
        typer.Option(
            "--allow-no-auth",
            help="Serve without FLOWER_BASIC_AUTH on a non-loopback address: anyone who reaches it may "
            "revoke tasks.",
        ),
    ] = False,
) -> None:
    """Run Flower on the workers' broker (TOOLLOOP_REDIS_URL, TOOLLOOP_BROKER_URL) behind basic auth."""
    from orchestrator.commands.exposure import build_exposure_refusal
    from workers.app import create_app
    from workers.settings import get_worker_settings

    if not is_flower_installed():
        fail(f"Flower is not installed here: {FLOWER_INSTALL_HINT}", EXIT_USAGE)

    refusal = build_exposure_refusal(
        what="Flower",
        host=address,
        authenticated=is_authenticated(dict(os.environ), ctx.args),
        allowed_open=allow_no_auth,
        how_to_authenticate="set FLOWER_BASIC_AUTH=user:password",
        opt_out="--allow-no-auth",
    )
    if refusal is not None:
        fail(refusal, EXIT_USAGE)
    # Flower reads this one from the environment only; its API can revoke tasks, so it stays authenticated.
    os.environ.setdefault("FLOWER_UNAUTHENTICATED_API", "false")
    # Worker settings only: Flower needs the broker, never a model credential.
    app = create_app(get_worker_settings(), main="toolloop-flower")
    # SIGINT stops Flower as it does in a terminal even when this process was started with SIGINT ignored (a
    # background job of a shell script inherits that, and Python then installs no KeyboardInterrupt).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    app.start(build_flower_argv(port, address, ctx.args))
    _exit_within(EXIT_WITHIN_S)


def _exit_within(seconds: float) -> None:
    # With the broker gone, a thread of Flower's pool retries its periodic `enable_events` broadcast forever
    # (kombu publishes it with retry=True and no limit), and the interpreter joins that thread at exit: a
    # stopped Flower would hang until SIGKILL. The normal exit gets `seconds`; then the process leaves.
    def leave() -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(0)

    timer = threading.Timer(seconds, leave)
    timer.daemon = True
    timer.start()


def register(app: typer.Typer) -> None:
    """Add `flower` to `app`."""
    # Options it does not know are Flower's: passed on, not refused.
    app.command("flower", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
        flower_command
    )
