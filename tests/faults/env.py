"""A whole toolloop system for one fault scenario: its own Redis (AOF), model server, workers, orchestrators
and HTTP APIs.

    with FaultEnv() as env:
        env.start_worker(); env.start_orchestrator()
        turn_id = env.submit([call("fault_work", tag="a")])
        check_turn(env.client.wait(turn_id, 30))

The processes are the shipped commands — `toolloop worker`, `toolloop orchestrator`, `toolloop api` — set up
as a user sets them up. The model is toolloop's scripted `plan` brain, served over HTTP by a thread of the
test process (`RecordingModelServer`); the orchestrators reach it through the Chat Completions adapter at
`TOOLLOOP_SCRIPTED_BASE_URL`, as any deployment reaches its model server. Being neither Redis nor an
orchestrator, it outlives every Redis restart and orchestrator kill of the scenario.

Every process started here carries a marker in its environment, so `close()` can prove that none is left
behind — pool children and re-parented orphans included — by scanning /proc.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import uuid
from collections import Counter
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import redis

from orchestrator import Client
from orchestrator.model import AssistantMessage, ToolMessage, TurnOutcome
from orchestrator.redis_server import RedisServer, find_free_port
from orchestrator.store.catalogue import read_catalogue
from tests.faults.fault_tools import DONE, DONE_BY, STARTS
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import OrchestratorHandle, start_orchestrator
from tests.support.processes import WorkerHandle, start_worker
from tests.support.served import Served, answers, start_toolloop
from tests.support.waiting import wait_for, wait_until
from workers.app import ToolloopCelery, create_app
from workers.connect import connect_redis
from workers.settings import WorkerSettings

TERMINAL = {"completed", "stopped", "failed", "cancelled"}
MARK_VAR = "TOOLLOOP_FAULT_MARK"
# The scripted model that plays the rounds its prompt lists (docs/guides/models.md, "The scripted model").
PLAN_MODEL = "scripted:plan"


class HasProcess(Protocol):
    """A started process handle: a worker, an orchestrator, an API."""

    @property
    def process(self) -> subprocess.Popen[bytes]: ...


def find_marked_pids(mark: str) -> list[int]:
    """Every live process started with `MARK_VAR=mark` in its environment (children included)."""
    needle = f"{MARK_VAR}={mark}".encode()
    found: list[int] = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """One planned tool call of a `scripted:plan` turn."""
    return {"name": name, "arguments": arguments}


def is_running(handle: HasProcess) -> bool:
    """Whether the handle's main process has not exited."""
    return handle.process.poll() is None


class FaultEnv:
    """Redis, model server, workers, orchestrators and APIs of one scenario; a context manager that leaves
    nothing behind."""

    def __init__(
        self,
        *,
        lease_ttl_s: float = 3.0,
        lost_grace_s: float = 2.0,
        lost_wait_s: float = 2.0,
        persistent: bool = True,
    ) -> None:
        self.mark = uuid.uuid4().hex
        self.model = RecordingModelServer().__enter__()
        try:
            # persistent=False: a Redis without persistence, which a restart empties (test_redis_lost.py).
            self.server = RedisServer(appendonly=persistent).start()
        except BaseException:
            self.model.__exit__(None, None, None)
            raise
        self.url = self.server.url
        self.env = {
            MARK_VAR: self.mark,
            "TOOLLOOP_LEASE_TTL_S": str(lease_ttl_s),
            "TOOLLOOP_LOST_CALL_GRACE_S": str(lost_grace_s),
            # A worker killed whole is not waited for long: the scenarios' workers never lose Redis.
            "TOOLLOOP_LOST_CALL_WAIT_S": str(lost_wait_s),
        }
        self.workers: list[WorkerHandle] = []
        self.orchestrators: list[OrchestratorHandle] = []
        self.apis: list[Served] = []
        self.client = Client(self.url)
        # Decoded as every toolloop process decodes (`build_redis_options`): large records are compressed.
        self.redis: redis.Redis = connect_redis(self.url)
        self._celery: ToolloopCelery | None = None

    # --- processes -----------------------------------------------------------------------------------

    def start_worker(
        self, concurrency: int = 2, modules: tuple[str, ...] = ("tests.faults.fault_tools",)
    ) -> WorkerHandle:
        """A `toolloop worker` serving `modules` (default: the fault tools)."""
        handle = start_worker(self.url, list(modules), concurrency=concurrency, env=self.env)
        self.workers.append(handle)
        return handle

    def start_orchestrator(self, env: dict[str, str] | None = None) -> OrchestratorHandle:
        """A `toolloop orchestrator` whose scripted models are this scenario's model server (`env` adds to
        or overrides its environment); registered in Redis on return."""
        handle = start_orchestrator(
            self.url, model_base_url=self.model.base_url, env={**self.env, **(env or {})}
        )
        self.orchestrators.append(handle)
        return handle

    def start_api(self, env: dict[str, str] | None = None) -> tuple[Served, str]:
        """A `toolloop api` on a free loopback port; (its process, its base URL) once `/healthz` says 200."""
        port = find_free_port()
        served = start_toolloop(
            ["api", "--host", "127.0.0.1", "--port", str(port)],
            env={"TOOLLOOP_REDIS_URL": self.url, **self.env, **(env or {})},
        )
        self.apis.append(served)
        base_url = f"http://127.0.0.1:{port}"
        served.wait_for(lambda: answers(f"{base_url}/healthz"), "the API to answer /healthz", timeout_s=60)
        return served, base_url

    @property
    def celery(self) -> ToolloopCelery:
        """A Celery app on this Redis, to inspect the workers."""
        if self._celery is None:
            self._celery = create_app(WorkerSettings(redis_url=self.url), main="toolloop-fault-test")
        return self._celery

    def idle(self) -> bool:
        """True when no tool task is anywhere: none queued, and no worker holds one (active, reserved or
        scheduled for a retry)."""
        queues = {spec.queue for spec in read_catalogue(self.redis).values()}
        if any(self.redis.llen(queue) for queue in queues):
            return False
        hosts = {w.hostname for w in self.workers if is_running(w)}
        # A connection of its own each time: a pooled one would be stale after a Redis restart.
        with self.celery.connection() as connection:
            inspect = self.celery.control.inspect(
                destination=sorted(hosts), timeout=2.0, connection=connection
            )
            for replies in (inspect.active(), inspect.reserved(), inspect.scheduled()):
                if replies is None or set(replies) != hosts or any(replies.values()):
                    return False
        return not any(self.redis.llen(queue) for queue in queues)

    def wait_idle(self) -> None:
        """Until every execution the workers took has ended (its outcome, late or not, written)."""
        wait_until(self.idle, "every worker to finish what it took")

    def marked_pids(self) -> list[int]:
        """Every live process that carries this environment's marker."""
        return find_marked_pids(self.mark)

    def close(self) -> None:
        """Stop everything; raise if any process of this environment survived."""
        for proc in self.orchestrators:
            proc.stop()
        for served in self.apis:
            served.kill()
        for handle in self.workers:
            handle.stop()
        if self._celery is not None:
            self._celery.close()
        self.client.close()
        self.redis.close()
        self.server.stop()
        self.model.__exit__(None, None, None)
        try:
            wait_until(lambda: not self.marked_pids(), "every process of the scenario to end")
        except AssertionError:
            left = self.marked_pids()
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"processes left behind: {left}") from None

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
        """A turn whose model makes `rounds` rounds of `calls`, then answers in a word; offers `tools`
        (default: the tools the calls name)."""
        tools = tools if tools is not None else sorted({c["name"] for c in calls})
        # A final answer of its own: the plan's default one quotes every tool result, and a 200 kB result
        # streamed back a dozen characters a chunk costs the orchestrator more than any fault here does.
        prompt = json.dumps({"plan": [*[{"calls": calls}] * rounds, {"text": "Done."}]})
        return self.client.submit(
            prompt=prompt, tools=tools, model=PLAN_MODEL, limits={"deadline_s": deadline_s}
        )

    def wait_all(self, turn_ids: list[str], timeout_s: float) -> list[TurnOutcome]:
        """Every turn's terminal outcome, checked: answered exactly once, never ending on a tool call."""
        return wait_checked(self.client, turn_ids, timeout_s)

    def completed_by(self, tag: str) -> list[int]:
        """The pool processes that ran the fault tool under `tag` to completion, in order."""
        return [int(pid) for pid in self.redis.lrange(DONE_BY + tag, 0, -1)]

    def runs(self, tag: str) -> tuple[int, int]:
        """(starts, completions) of the fault tools under `tag`."""
        return int(self.redis.get(STARTS + tag) or 0), int(self.redis.get(DONE + tag) or 0)

    def total_starts(self, tags: list[str]) -> int:
        """How many runs of the fault tools under `tags` have started so far."""
        if not tags:
            return 0
        return sum(int(n or 0) for n in self.redis.mget([STARTS + tag for tag in tags]))

    def wait_new_start(self, tags: list[str], since: int) -> int:
        """Until more than `since` runs under `tags` have started (work is under way); their count."""
        return wait_for(
            lambda: started if (started := self.total_starts(tags)) > since else None,
            "a fault tool run to start",
        )


def wait_checked(client: Client, turn_ids: list[str], timeout_s: float) -> list[TurnOutcome]:
    """Every turn's terminal outcome, each checked by `check_turn` as it comes."""
    outcomes = []
    for turn_id in turn_ids:
        outcome = client.wait(turn_id, timeout_s)
        check_turn(outcome)
        outcomes.append(outcome)
    return outcomes


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
