"""A restart of a tool's only worker under a stream of turns: every call gets its real result, none is told
the tool does not exist; only a tool no worker has served for TOOLLOOP_TOOL_GONE_AFTER_S is `not_found`.

Real processes (`FaultEnv`): a Redis, `toolloop worker` serving `workers.examples.arithmetic` (its only
worker of `add`), a second worker serving other tools (so the catalogue a submit checks is never empty),
`toolloop orchestrator`, `toolloop api`, and the scripted `plan` model over HTTP. The restart is the
operator's: SIGTERM (a warm shutdown), then a replacement started a few seconds later.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from orchestrator import Client
from orchestrator.model import ToolMessage, TurnOutcome
from orchestrator.settings import Settings
from tests.faults.env import PLAN_MODEL, FaultEnv, call
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ARITHMETIC = ("workers.examples.arithmetic",)
TURNS_PER_S = 5.0
STREAM_S = 15.0
STOP_AT_S = 4.0  # into the stream, the only `add` worker gets SIGTERM
GAP_S = 3.0  # from its exit to the replacement's start
GONE_AFTER_S = 3.0  # the second orchestrator's TOOLLOOP_TOOL_GONE_AFTER_S
DEADLINE_S = 90.0


class Restarts:
    """The environment, the `add` worker of the moment, and the HTTP API's address."""

    def __init__(self, env: FaultEnv) -> None:
        self.env = env
        self.adder = env.start_worker(modules=ARITHMETIC)
        env.start_worker(modules=("tests.faults.fault_tools",))
        env.start_orchestrator()
        _, self.api_url = env.start_api()

    def submit(self, a: int, b: int, client: Client | None = None) -> str:
        prompt = json.dumps({"plan": [{"calls": [call("add", a=a, b=b)]}, {"text": "Done."}]})
        return (client or self.env.client).submit(
            prompt=prompt, tools=["add"], model=PLAN_MODEL, limits={"deadline_s": DEADLINE_S}
        )

    def restart_adder(self, gap_s: float) -> tuple[float, float]:
        """SIGTERM the `add` worker, wait `gap_s` after it exits, start another; (exited, ready) times."""
        self.adder.stop(timeout_s=30)
        exited = time.time()
        time.sleep(gap_s)
        self.adder = self.env.start_worker(modules=ARITHMETIC)
        return exited, time.time()


@pytest.fixture(scope="module")
def restarts() -> Iterator[Restarts]:
    with FaultEnv() as env:
        yield Restarts(env)


def add_answer(outcome: TurnOutcome) -> ToolMessage:
    [answer] = [m for m in outcome.messages if isinstance(m, ToolMessage) and m.name == "add"]
    return answer


def test_a_restart_of_the_only_worker_gives_every_call_its_real_result(restarts: Restarts) -> None:
    env = restarts.env
    submitted: list[tuple[str, int, int]] = []
    waiting_seen: dict[str, Any] = {}
    times: dict[str, tuple[float, float]] = {}

    def restart() -> None:
        time.sleep(STOP_AT_S)
        times["restart"] = restarts.restart_adder(GAP_S)

    restarter = threading.Thread(target=restart)
    started = time.time()
    restarter.start()
    try:
        n = 0
        while (elapsed := time.time() - started) < STREAM_S or restarter.is_alive():
            if elapsed >= n / TURNS_PER_S and elapsed < STREAM_S:
                submitted.append((restarts.submit(n, 1000), n, 1000))
                n += 1
                continue
            # Between submits: look at the turns the gap may hold, through the HTTP API as a page does.
            if not waiting_seen and times.get("restart") is None and elapsed > STOP_AT_S:
                for turn_id, _, _ in submitted[-10:]:
                    view = httpx.get(f"{restarts.api_url}/v1/turns/{turn_id}", timeout=5).json()
                    if view.get("waiting_for_worker"):
                        waiting_seen.update(view)
                        break
            time.sleep(0.02)
    finally:
        restarter.join()
    exited, ready = times["restart"]
    outcomes = env.wait_all([turn_id for turn_id, _, _ in submitted], DEADLINE_S + 30)
    report = f"{len(submitted)} turns, the worker away {ready - exited:.1f} s"
    wrong = [
        (turn_id, outcome.status, add_answer(outcome).content)
        for (turn_id, a, b), outcome in zip(submitted, outcomes, strict=True)
        if outcome.status != "completed"
        or add_answer(outcome).is_error
        or float(add_answer(outcome).content) != a + b
    ]
    assert wrong == [], f"{report}: {len(wrong)} wrong, {wrong[:5]}"
    # Turns that ran while no worker served `add` showed it: the call waits in its queue for a worker.
    assert waiting_seen, f"{report}: no turn showed a call waiting for a worker"
    [waiting] = waiting_seen["waiting_for_worker"]
    assert waiting["tool"] == "add" and exited - 1 <= waiting["since"] <= ready + 1
    names = [e.name for e in env.client.events(waiting_seen["id"])]
    assert names.index("tool_waiting_for_worker") < names.index("tool_started") < names.index("tool_finished")
    print(report)  # the figure the issue is about, shown with -s


def test_a_tool_no_worker_served_for_longer_than_the_window_is_not_found(restarts: Restarts) -> None:
    env = restarts.env
    for orchestrator in env.orchestrators:
        orchestrator.stop()
    env.start_orchestrator(env={"TOOLLOOP_TOOL_GONE_AFTER_S": str(GONE_AFTER_S)})
    strict = Client(env.url, settings=Settings(redis_url=env.url, tool_gone_after_s=GONE_AFTER_S))
    try:
        assert add_answer(env.wait_all([restarts.submit(1, 2)], 60)[0]).content == "3.0"
        restarts.adder.stop(timeout_s=30)
        # Within the window: accepted, and answered once a worker is back.
        within = restarts.submit(2, 2, strict)
        wait_for(
            lambda: env.client.get(within).waiting_for_worker, "the call to wait for a worker", timeout_s=30
        )
        time.sleep(GONE_AFTER_S + 0.5)
        # Past the window: the orchestrator answers `not_found`; a client with the same window refuses it.
        gone = restarts.submit(3, 3)
        with pytest.raises(ValueError, match="unknown tool 'add'"):
            restarts.submit(3, 3, strict)
        [gone_outcome] = env.wait_all([gone], 60)
        answer = add_answer(gone_outcome)
        assert answer.is_error and answer.failure_kind == "not_found", answer.content
        assert "unknown tool 'add'" in answer.content
        restarts.adder = env.start_worker(modules=ARITHMETIC)
        [within_outcome] = env.wait_all([within], DEADLINE_S + 30)
        assert add_answer(within_outcome).content == "4.0"
    finally:
        strict.close()
