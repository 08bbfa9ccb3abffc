"""A whole toolloop system for one fault scenario: its own Redis (AOF), workers and orchestrators.

    with FaultEnv() as env:
        env.start_worker(); env.start_orchestrator()
        turn_id = env.submit([call("fault_work", tag="a")])
        check_turn(env.client.wait(turn_id, 30))

Every process started here carries a marker in its environment, so `close()` can prove that none is left
behind — pool children and re-parented orphans included — by scanning /proc.

The orchestrator is `ops.bench.instant`: the scripted `plan` brain in-process (no model server to start),
through the real Chat Completions adapter.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from ops.bench.instant import INSTANT_MODEL
from ops.bench.procs import Proc, start_orchestrator
from ops.redis_server import RedisServer
from orchestrator import Client
from orchestrator.model import AssistantMessage, ToolMessage, TurnOutcome
from tests.faults.fault_tools import DONE, DONE_BY, STARTS
from tests.support.processes import WorkerHandle, start_worker

TERMINAL = {"completed", "stopped", "failed", "cancelled"}
MARK_VAR = "TOOLLOOP_FAULT_MARK"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """One planned tool call of a `scripted:plan` turn."""
    return {"name": name, "arguments": arguments}


class FaultEnv:
    """Redis, workers and orchestrators of one scenario; a context manager that leaves nothing behind."""

    def __init__(
        self, *, lease_ttl_s: float = 3.0, lost_grace_s: float = 2.0, persistent: bool = True
    ) -> None:
        self.mark = uuid.uuid4().hex
        # persistent=False: a Redis without persistence, which a restart empties (test_redis_lost.py).
        self.server = RedisServer(appendonly=persistent).start()
        self.url = self.server.url
        self.env = {
            MARK_VAR: self.mark,
            "TOOLLOOP_LEASE_TTL_S": str(lease_ttl_s),
            "TOOLLOOP_LOST_CALL_GRACE_S": str(lost_grace_s),
        }
        self.workers: list[WorkerHandle] = []
        self.orchestrators: list[Proc] = []
        self.client = Client(self.url)
        self.redis = redis.Redis.from_url(self.url, decode_responses=True)

    # --- processes -----------------------------------------------------------------------------------

    def start_worker(
        self, concurrency: int = 2, modules: tuple[str, ...] = ("tests.faults.fault_tools",)
    ) -> WorkerHandle:
        """A `toolloop worker` serving `modules` (default: the fault tools)."""
        handle = start_worker(self.url, list(modules), concurrency=concurrency, env=self.env)
        self.workers.append(handle)
        return handle

    def start_orchestrator(self, command: list[str] | None = None, env: dict[str, str] | None = None) -> Proc:
        """An orchestrator process: the instant scripted model, or `command` (`toolloop orchestrator`)."""
        proc = start_orchestrator(self.url, {**self.env, **(env or {})}, command=command)
        self.orchestrators.append(proc)
        return proc

    def marked_pids(self) -> list[int]:
        """Every live process that carries this environment's marker."""
        needle = f"{MARK_VAR}={self.mark}".encode()
        found: list[int] = []
        for entry in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
        return found

    def close(self) -> None:
        """Stop everything; raise if any process of this environment survived."""
        for proc in self.orchestrators:
            proc.stop()
        for handle in self.workers:
            handle.stop()
        self.client.close()
        self.redis.close()
        self.server.stop()
        deadline = time.monotonic() + 5
        while (left := self.marked_pids()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not left, f"processes left behind: {left}"

    def __enter__(self) -> FaultEnv:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- turns ---------------------------------------------------------------------------------------

    def submit(
        self,
        calls: list[dict[str, Any]],
        *,
        deadline_s: float = 60.0,
        rounds: int = 1,
        tools: list[str] | None = None,
    ) -> str:
        """A turn whose model makes `rounds` rounds of `calls`, then answers; offers `tools` (default: the
        tools the calls name)."""
        tools = tools if tools is not None else sorted({c["name"] for c in calls})
        prompt = json.dumps({"plan": [{"calls": calls}] * rounds})
        return self.client.submit(
            prompt=prompt, tools=tools, model=INSTANT_MODEL, limits={"deadline_s": deadline_s}
        )

    def wait_all(self, turn_ids: list[str], timeout_s: float) -> list[TurnOutcome]:
        """Every turn's terminal outcome, checked: answered exactly once, never ending on a tool call."""
        deadline = time.monotonic() + timeout_s
        outcomes = []
        for turn_id in turn_ids:
            outcome = self.client.wait(turn_id, max(0.1, deadline - time.monotonic()))
            check_turn(outcome)
            outcomes.append(outcome)
        return outcomes

    def completed_by(self, tag: str) -> list[int]:
        """The pool processes that ran the fault tool under `tag` to completion, in order."""
        return [int(pid) for pid in self.redis.lrange(DONE_BY + tag, 0, -1)]

    def runs(self, tag: str) -> tuple[int, int]:
        """(starts, completions) of the fault tools under `tag`."""
        return int(self.redis.get(STARTS + tag) or 0), int(self.redis.get(DONE + tag) or 0)


def check_turn(outcome: TurnOutcome) -> None:
    """A terminal turn whose every tool call has exactly one answer and whose last message calls nothing."""
    assert outcome.status in TERMINAL, outcome.status
    calls = [c.id for m in outcome.messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    answers = Counter(m.tool_call_id for m in outcome.messages if isinstance(m, ToolMessage))
    assert len(calls) == len(set(calls)), f"repeated call ids: {calls}"
    assert set(answers) == set(calls), f"calls {sorted(calls)} vs answers {sorted(answers)}"
    assert all(n == 1 for n in answers.values()), f"answered more than once: {answers}"
    last = outcome.messages[-1]
    assert not (isinstance(last, AssistantMessage) and last.tool_calls), "history ends on unanswered calls"
