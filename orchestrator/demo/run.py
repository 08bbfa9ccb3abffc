"""`toolloop demo` / `make demo`: the whole system once, on this machine, and nothing left running after.

It starts an embedded Redis (unless TOOLLOOP_REDIS_URL is set), a prefork worker serving the example tools
(`toolloop worker`) and an orchestrator (`toolloop orchestrator`, which serves the scripted model itself
when the model is `scripted:*`), submits one multi-tool turn through `orchestrator.Client`, shows its
progress and transcript, and stops every process it started — on success, on error, on Ctrl-C and on
SIGTERM. Each child runs in its own session, so stopping one stops its whole process group.

With `--model`, TOOLLOOP_MODEL, OPENAI_BASE_URL/OPENAI_API_KEY or ANTHROPIC_API_KEY the same turn runs
against that model instead of the scripted one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, cast

import httpx
import redis
from rich.console import Console

from orchestrator.client.redis_client import Client
from orchestrator.commands.flower import is_flower_installed
from orchestrator.demo.view import EventPrinter, print_summary, print_transcript
from orchestrator.errors import DemoError
from orchestrator.model import TurnOutcome
from orchestrator.redis_server import RedisServer
from orchestrator.store import codec
from orchestrator.store.catalogue import read_catalogue
from workers import keys
from workers.connect import connect_redis

DEFAULT_PROMPT = "What is 6 plus 7, what is 6 times 7, and what is the weather in Paris?"
DEMO_TOOLS = ("add", "multiply", "get_weather")
SCRIPTED_MODEL = "scripted:demo"
READY_TIMEOUT_S = 30.0
# The scripted model writes its answer a few characters at a time with this pause, so that it is seen being
# written (TOOLLOOP_SCRIPTED_STREAM_DELAY_S; a real model streams at its own pace).
SCRIPTED_STREAM_DELAY_S = "0.02"
STOP_TIMEOUT_S = 10.0
TOOLLOOP_BIN = Path(sys.executable).parent / "toolloop"


class Processes:
    """The child processes the demo started; `stop_all` stops each one's whole process group (idempotent)."""

    def __init__(self) -> None:
        self.children: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.redis: RedisServer | None = None

    def start(self, name: str, args: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """Start `toolloop <args>` in a new session, its output in a temp log file."""
        log = Path(tempfile.mkstemp(prefix=f"toolloop-demo-{name}-", suffix=".log")[1])
        with _interrupts_held(), log.open("wb") as out:
            process = subprocess.Popen(
                [str(TOOLLOOP_BIN), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
            self.children.append((name, process, log))
        return process

    def log_tail(self, name: str, lines: int = 30) -> str:
        """The end of a child's log, for error messages."""
        for child, _process, log in self.children:
            if child == name and log.exists():
                return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def exited(self, name: str) -> bool:
        """Whether the child `name` has exited."""
        return any(child == name and process.poll() is not None for child, process, _ in self.children)

    def check_alive(self) -> None:
        """DemoError when a child that the turn needs has exited (the API is only a window on it)."""
        for name, process, _log in self.children:
            if name != "api" and process.poll() is not None:
                raise DemoError(f"the {name} exited with {process.returncode}:\n{self.log_tail(name)}")

    def stop_all(self) -> None:
        """SIGTERM every child (newest first, so the orchestrator stops before the worker), then SIGKILL."""
        for _name, process, _log in reversed(self.children):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for _name, process, _log in reversed(self.children):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            # Whatever is left of the group (a pool child, a stuck process) goes now.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        for _name, _process, log in self.children:
            log.unlink(missing_ok=True)
        self.children.clear()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None


def choose_model(explicit: str | None, env: Mapping[str, str]) -> str:
    """The demo's model: --model, TOOLLOOP_MODEL, a configured OpenAI or Anthropic one, else scripted."""
    if explicit:
        return explicit
    if env.get("TOOLLOOP_MODEL"):
        return env["TOOLLOOP_MODEL"]
    if env.get("OPENAI_BASE_URL") or env.get("OPENAI_API_KEY"):
        return "openai:" + env.get("OPENAI_MODEL", "gpt-4.1-mini")
    if env.get("ANTHROPIC_API_KEY"):
        return "anthropic:claude-sonnet-4-5"
    return SCRIPTED_MODEL


class _Held:
    """Signals that came while a child was being started and recorded (None: none is being started)."""

    signals: list[int] | None = None


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    # Ctrl-C between a child's start and its record would leave it running unknown to `stop_all` (seen:
    # an API left behind by an interrupted demo). An interrupt that comes meanwhile is raised once recorded.
    _Held.signals = []
    try:
        yield
    finally:
        held, _Held.signals = _Held.signals, None
    if held:
        raise KeyboardInterrupt(f"signal {held[0]}")


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    # SIGTERM (and SIGHUP) become KeyboardInterrupt like Ctrl-C, so every exit path runs the cleanup.
    # SIGINT is set too: a process started in the background (nohup, `cmd &`, some CI runners) inherits it
    # ignored, and Python then never raises KeyboardInterrupt — the demo would ignore Ctrl-C.
    def interrupt(signum: int, _frame: FrameType | None) -> None:
        if _Held.signals is not None:
            _Held.signals.append(signum)
            return
        raise KeyboardInterrupt(f"signal {signum}")

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, interrupt) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_demo(
    *,
    prompt: str | None = None,
    model: str | None = None,
    timeout_s: float = 60.0,
    console: Console | None = None,
    keep_running: bool = False,
) -> int:
    """Run the demo: 0 when the turn completed, 1 when it ended otherwise or failed, 130 on Ctrl-C.

    With `keep_running`, everything stays up after the turn (the turn page, Flower's broker) until Ctrl-C."""
    out = console or Console()
    processes = Processes()
    atexit.register(processes.stop_all)
    started = time.monotonic()
    try:
        with _interruptible():
            outcome = _run(
                processes,
                out,
                prompt or DEFAULT_PROMPT,
                choose_model(model, os.environ),
                timeout_s,
                keep_running=keep_running,
            )
            out.print(f"[dim]demo took {time.monotonic() - started:.1f} s[/dim]")
            if keep_running:
                out.print("[bold]everything keeps running: Ctrl-C stops it[/bold]")
                while True:
                    processes.check_alive()
                    time.sleep(0.5)
            return 0 if outcome.status == "completed" else 1
    except KeyboardInterrupt:
        out.print("[yellow]interrupted: stopping everything the demo started[/yellow]")
        return 130
    except (DemoError, redis.RedisError, TimeoutError) as exc:
        out.print(f"[red]demo failed:[/red] {exc}")
        return 1
    finally:
        processes.stop_all()
        atexit.unregister(processes.stop_all)
        out.print("[dim]stopped every process the demo started[/dim]")


def _run(
    processes: Processes, out: Console, prompt: str, model: str, timeout_s: float, *, keep_running: bool
) -> TurnOutcome:
    redis_url = os.environ.get("TOOLLOOP_REDIS_URL")
    if not redis_url:
        processes.redis = RedisServer().start()
        redis_url = processes.redis.url
        out.print(f"[green]✓[/green] embedded Redis at {redis_url} (pid {processes.redis.pid})")
    else:
        out.print(f"[green]✓[/green] using Redis at {redis_url}")
    env = {**os.environ, "TOOLLOOP_REDIS_URL": redis_url}
    env.setdefault("TOOLLOOP_TOOL_MODULES", "workers.examples")
    env.setdefault("TOOLLOOP_SCRIPTED_STREAM_DELAY_S", SCRIPTED_STREAM_DELAY_S)
    hostname = f"demo-{uuid.uuid4().hex[:8]}@localhost"
    worker = processes.start(
        "worker", ["worker", "--concurrency=2", f"--hostname={hostname}", "--loglevel=WARNING"], env
    )
    orchestrator = processes.start("orchestrator", ["orchestrator", "--log-level=WARNING"], env)
    out.print(f"[green]✓[/green] worker {hostname} (pid {worker.pid}), orchestrator (pid {orchestrator.pid})")
    api_url, api_pid = _start_api(processes, env)
    _wait_ready(processes, redis_url, hostname)
    shown_url = _api_ready(processes, out, api_url, api_pid)
    out.print(f"[green]✓[/green] worker ready; model [bold]{model}[/bold]")
    client = Client(redis_url)
    try:
        turn_id = client.submit(prompt=prompt, model=model, tools=list(DEMO_TOOLS))
        out.print(f"[green]✓[/green] submitted turn [bold]{turn_id}[/bold]")
        if shown_url is not None:
            page = f"{shown_url}/ui/turns/{turn_id}"
            out.print(f"[green]✓[/green] watch it live: [bold]{page}[/bold]", soft_wrap=True)
        out.print()
        outcome, events = _follow(client, processes, out, turn_id, timeout_s)
    finally:
        client.redis.close()
    print_transcript(out, outcome, events)
    print_summary(
        out, outcome, turn_id, redis_url, keep_running=keep_running, flower_installed=is_flower_installed()
    )
    return outcome


def _start_api(processes: Processes, env: Mapping[str, str]) -> tuple[str, int]:
    """`toolloop api` on a free loopback port: its base URL and pid."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    api = processes.start("api", ["api", "--host=127.0.0.1", f"--port={port}"], env)
    return f"http://127.0.0.1:{port}", api.pid


def _api_ready(processes: Processes, out: Console, url: str, pid: int) -> str | None:
    """The API's base URL once it answers; None (and a line saying why) when it does not: the demo goes on."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=2.0).status_code < 500:
                out.print(f"[green]✓[/green] API at {url} (pid {pid})")
                return url
        if processes.exited("api"):
            break
        time.sleep(0.1)
    out.print(
        f"[yellow]the API did not start; the demo goes on without it[/yellow]\n{processes.log_tail('api')}"
    )
    return None


def _wait_ready(processes: Processes, redis_url: str, hostname: str) -> None:
    client = connect_redis(redis_url, decode_responses=False)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            processes.check_alive()
            if client.hexists(keys.CATALOGUE, hostname) and set(DEMO_TOOLS) <= set(read_catalogue(client)):
                return
            time.sleep(0.1)
    finally:
        client.close()
    raise DemoError(
        f"the worker did not publish its tools in {READY_TIMEOUT_S:g} s:\n{processes.log_tail('worker')}"
    )


def _follow(
    client: Client, processes: Processes, out: Console, turn_id: str, timeout_s: float
) -> tuple[TurnOutcome, list[dict[str, Any]]]:
    """Print the turn's events as they come until it ends; its outcome and every event."""
    deadline = time.monotonic() + timeout_s
    after = "0"
    events: list[dict[str, Any]] = []
    printer = EventPrinter(out)
    stream = keys.turn_events(turn_id)
    while time.monotonic() < deadline:
        processes.check_alive()
        entries = cast(list[tuple[str, dict[str, str]]], client.redis.xrange(stream, min=f"({after}"))
        for stored in codec.parse_entries(turn_id, entries):
            event = {"name": stored.name, "at": stored.at, **stored.data}
            events.append(event)
            printer.show(event)
        if entries:
            after = entries[-1][0]
        outcome = client.outcome(turn_id)
        if outcome is not None:
            return outcome, events
        time.sleep(0.05)
    raise DemoError(
        f"the turn did not finish in {timeout_s:g} s; orchestrator log:\n{processes.log_tail('orchestrator')}"
    )
