"""Clients ride out Redis restarts (issue 12, item 2): every kind of waiting client, Redis restarted under it.

A real Redis with AOF is stopped and started again on the same port (~2 s down) while turns run on a real
prefork worker and orchestrator (`FaultEnv`). Each client kind follows a turn through the restarts:
`toolloop submit --wait` (a subprocess), `Client.wait`, `Client.events`, `AsyncClient.wait`,
`AsyncClient.events`. After each: no client raised, each received its turn's outcome (the stored one), and
each follower's events are the turn's stored events stream exactly — no gap, no duplicate.

The turns are held running until the last restart is over, in one of two ways (`Hold`):
- `approval`: the turn waits for a person to approve a call (no tool runs while Redis is away), approved
  once the restarts are over; short tool calls before and after it.
- `tool`: a gate tool runs through the restarts (released through a file, not Redis), after rounds of short
  tool calls that keep events coming between the restarts — the workers ride the restarts out too.
The quick variant (one restart, `approval`) runs in `make test`; the long ones (five restarts, each hold) in
`make test-faults`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

from orchestrator.client.redis_client import AsyncClient, Client
from orchestrator.model import TurnOutcome
from tests.faults.env import PLAN_MODEL, FaultEnv, call, check_turn, is_running
from tests.support.processes import ROOT, TOOLLOOP_BIN
from tests.support.turns import event_ids
from tests.support.waiting import wait_at_most, wait_for
from workers import keys, tool

pytestmark = [pytest.mark.e2e]

T = TypeVar("T")
THIS_MODULE = __name__
TOOLS = ["restart_nap", "restart_gate", "restart_approval"]
DOWN_S = 2.0
UP_S = 1.5
CLIENT_TIMEOUT_S = 150.0


@tool(soft_time_limit=30, time_limit=40)
def restart_nap(seconds: float, round_number: int) -> str:
    """Works `seconds`; touches no Redis, so a restart does not fail the tool itself. `round_number` makes
    each round's call a new one (the repeat guard stops a turn asking for the same call again and again)."""
    time.sleep(seconds)
    return "rested"


@tool(soft_time_limit=150, time_limit=170)
def restart_gate(flag: str, max_s: float = 140.0) -> str:
    """Holds its turn running until the file `flag` exists (the restarts are over), at most `max_s`."""
    wait_at_most(Path(flag).exists, max_s)
    return "opened"


@tool(requires_confirmation=True)
def restart_approval() -> str:
    """Runs once a person has approved it: its turn waits (no tool running) until then."""
    return "approved"


@dataclass(frozen=True)
class Size:
    restarts: int
    hold: str  # "approval" or "tool"
    nap_rounds: int


QUICK = Size(restarts=1, hold="approval", nap_rounds=4)
LONG_APPROVAL = Size(restarts=5, hold="approval", nap_rounds=12)
LONG_TOOL = Size(restarts=5, hold="tool", nap_rounds=12)


def build_plan(size: Size, gate: Path) -> str:
    """A `scripted:plan` prompt: rounds of one short call around the hold, then the answer.

    Held by an approval, two rounds come before it (done before Redis goes away) and the rest after; held
    by the gate tool, every round comes before it, so calls run while Redis restarts."""
    naps = [{"calls": [call("restart_nap", seconds=0.3, round_number=n)]} for n in range(size.nap_rounds)]
    if size.hold == "approval":
        return json.dumps({"plan": [*naps[:2], {"calls": [call("restart_approval")]}, *naps[2:]]})
    return json.dumps({"plan": [*naps, {"calls": [call("restart_gate", flag=str(gate))]}]})


def stored_turn(env: FaultEnv, conversation: str) -> str | None:
    """The turn the conversation's lock names, once it is stored."""
    turn_id = env.redis.get(keys.conversation_lock(conversation))
    return str(turn_id) if turn_id is not None else None


def release(env: FaultEnv, size: Size, gate: Path, turn_ids: list[str]) -> None:
    """End the hold: approve the waiting calls, or let the gate tool return."""
    gate.touch()
    if size.hold == "approval":
        for turn_id in turn_ids:
            for waiting in env.client.get(turn_id).pending_approvals:
                assert env.client.approve(turn_id, waiting.call_id, approved=True)


def wait_held(env: FaultEnv, size: Size, turn_ids: list[str]) -> None:
    """Held by approvals, every turn is waiting for one before Redis first goes away."""

    def waiting(turn_id: str) -> list[Any] | None:
        return env.client.get(turn_id).pending_approvals or None

    if size.hold == "approval":
        for turn_id in turn_ids:
            wait_for(partial(waiting, turn_id), f"{turn_id} waiting for its approval")


LIMITS = {"max_llm_calls": 40, "deadline_s": 240.0}


def restart(env: FaultEnv) -> None:
    """Redis down for `DOWN_S`, its data kept (AOF), back on the same port."""
    env.server.stop(keep_data=True)
    time.sleep(DOWN_S)
    env.server.start()


# --- the client kinds: each returns (the outcome it received, the event ids it yielded or None) -------------

Seen = tuple[TurnOutcome, list[str] | None]


def sync_wait(url: str, turn_id: str) -> Seen:
    with Client(url) as client:
        return client.wait(turn_id, CLIENT_TIMEOUT_S), None


def sync_events(url: str, turn_id: str) -> Seen:
    with Client(url) as client:
        ids = [event.id for event in client.events(turn_id)]
        outcome = client.outcome(turn_id)
    assert outcome is not None
    return outcome, ids


def async_wait(url: str, turn_id: str) -> Seen:
    async def run() -> Seen:
        async with AsyncClient(url) as client:
            return await client.wait(turn_id, CLIENT_TIMEOUT_S), None

    return asyncio.run(run())


def async_events(url: str, turn_id: str) -> Seen:
    async def run() -> Seen:
        async with AsyncClient(url) as client:
            ids = [event.id async for event in client.events(turn_id)]
            outcome = await client.outcome(turn_id)
        assert outcome is not None
        return outcome, ids

    return asyncio.run(run())


FOLLOWERS: dict[str, Callable[[str, str], Seen]] = {
    "Client.wait": sync_wait,
    "Client.events": sync_events,
    "AsyncClient.wait": async_wait,
    "AsyncClient.events": async_events,
}


def submit_wait_cli(url: str, prompt: str, conversation: str) -> subprocess.CompletedProcess[str]:
    """`toolloop submit --wait`, as a person runs it."""
    command = [str(TOOLLOOP_BIN), "submit", "--prompt", prompt, "--model", PLAN_MODEL]
    command += ["--tools", ",".join(TOOLS), "--max-llm-calls", "40", "--deadline-s", "240"]
    command += ["--conversation", conversation, "--wait", "--timeout", str(CLIENT_TIMEOUT_S)]
    env = {**os.environ, "TOOLLOOP_REDIS_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S + 30, check=False
    )


class Background(Generic[T]):
    """`run()` in a daemon thread: a client left waiting by a failed test never holds the test run."""

    def __init__(self, run: Callable[[], T]) -> None:
        self._run = run
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            self._value = self._run()
        except BaseException as exc:  # handed to whoever asks for the result
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def describe(self) -> str:
        return repr(self._error if self._error is not None else self._value)

    def result(self, timeout_s: float) -> T:
        self._thread.join(timeout_s)
        assert self.done(), f"still running after {timeout_s} s"
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


@pytest.fixture
def env() -> Iterator[FaultEnv]:
    with FaultEnv() as built:
        built.start_worker(concurrency=4, modules=(THIS_MODULE,))
        built.start_orchestrator()
        yield built


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(QUICK, id="quick", marks=pytest.mark.timeout(120)),
        pytest.param(LONG_APPROVAL, id="long-approval", marks=[pytest.mark.faults, pytest.mark.timeout(400)]),
        pytest.param(LONG_TOOL, id="long-tool", marks=[pytest.mark.faults, pytest.mark.timeout(400)]),
    ],
)
def test_every_client_kind_rides_out_redis_restarts(env: FaultEnv, size: Size, tmp_path: Path) -> None:
    gate = tmp_path / "restarts-over"
    prompt = build_plan(size, gate)
    turn_id = env.client.submit(prompt=prompt, tools=TOOLS, model=PLAN_MODEL, limits=LIMITS)
    conversation = f"cli-{uuid.uuid4().hex}"
    cli = Background(lambda: submit_wait_cli(env.url, prompt, conversation))
    followers = {kind: Background(partial(follow, env.url, turn_id)) for kind, follow in FOLLOWERS.items()}
    # The CLI's turn is stored (its conversation names it) before Redis goes away the first time.
    cli_turn = wait_for(partial(stored_turn, env, conversation), "the CLI's submit")
    wait_held(env, size, [turn_id, cli_turn])
    time.sleep(UP_S)
    for _ in range(size.restarts):
        restart(env)
        time.sleep(UP_S)
    # Every process rode the restarts out too (else a turn stalls, and that is not the clients' fault).
    dead = [f"worker {w.pid}" for w in env.workers if not is_running(w)]
    dead += [f"orchestrator {o.pid}" for o in env.orchestrators if not is_running(o)]
    assert not dead, f"exited during the restarts: {dead}"
    # Nothing may have ended yet: the turns are held running, so a client that returned has failed.
    running: dict[str, Background[Any]] = {**followers, "cli": cli}
    ended = {kind: job.describe() for kind, job in running.items() if job.done()}
    assert not ended, ended
    release(env, size, gate, [turn_id, cli_turn])
    seen = {kind: job.result(CLIENT_TIMEOUT_S) for kind, job in followers.items()}
    ran = cli.result(CLIENT_TIMEOUT_S + 30)

    stored_ids = event_ids(env.redis, turn_id)
    stored_outcome = env.client.outcome(turn_id)
    assert stored_outcome is not None and stored_outcome.status == "completed", stored_outcome
    check_turn(stored_outcome)
    for kind, (outcome, ids) in seen.items():
        assert outcome == stored_outcome, kind
        if ids is not None:
            assert ids == stored_ids, f"{kind}: events differ from the stream (a gap or a duplicate)"
    assert stored_ids and len(set(stored_ids)) == len(stored_ids)

    assert ran.returncode == 0, (ran.returncode, ran.stderr)
    assert "Traceback" not in ran.stderr
    printed = json.loads(ran.stdout)
    assert (printed["turn_id"], printed["status"]) == (cli_turn, "completed")
    assert printed == env.client.outcome(cli_turn).model_dump(mode="json")  # type: ignore[union-attr]
