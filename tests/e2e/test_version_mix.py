"""Two releases on one Redis: today's code beside the previous release's orchestrators, workers and clients.

A rolling deploy runs both for a while, in either order, and a rollback hands the turns today's code
started to the previous release. The previous release runs from its own tree (`git archive` of
`PREVIOUS_RELEASE` into a temporary folder, on PYTHONPATH) with this checkout's installed dependencies,
through its own command line entry (its layout differs: no `orchestrator.api` package, `ops/` beside it).

Each test proves that every turn finishes and that no process exits: today's code reads the previous
release's records (requests, outcome envelopes, task messages, states), and writes records the previous
release reads. The last test shows how today's code treats a record it cannot read at all (a state of a
newer version, a request that does not parse): it leaves the turn to another orchestrator, says so once,
goes on running the others, and ends one long past its deadline. What each direction guarantees:
docs/operations/deploying.md, "Upgrades and rollbacks".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from orchestrator.client.redis_client import Client
from orchestrator.model import TurnOutcome
from orchestrator.redis_server import RedisServer
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import E2E_TOOLS, OrchestratorHandle, start_orchestrator
from tests.support.plans import plan_prompt
from tests.support.processes import ROOT, WorkerHandle, start_worker
from tests.support.turns import assert_every_call_answered_once, wait_outcome
from tests.support.waiting import wait_until
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# The previous release: the last commit before the session that moved the layout (orchestrator/api/,
# orchestrator/client/, the Redis launcher inside orchestrator/). Today's records must stay readable by it,
# and its records by today's code (the compatibility window is one release back and one forward).
PREVIOUS_RELEASE = "a7a7286"
# Its own command line, as `toolloop` was then (its console script is not installed here).
PREVIOUS_CLI = "from orchestrator.cli import main; main()"
# Limits a client of either release may set: the turn request carries them to the other release.
LIMITS = {"max_llm_calls": 4, "max_tool_executions": 6, "deadline_s": 60.0}
# A rollback needs this release's states readable by the previous one: every setting a state carries at its
# default (the e2e helper shortens the lost-call wait, which would write it into each state).
ROLLBACK_SAFE = {"TOOLLOOP_LOST_CALL_WAIT_S": "60"}
ROUNDS: list[dict[str, Any]] = [
    {"calls": [{"name": "e2e_add", "arguments": {"a": 2, "b": 3}}]},
    {"calls": [{"name": "e2e_multiply", "arguments": {"a": 4, "b": 5}}, {"name": "e2e_echo_missing"}]},
    {"text": "all done"},
]


@pytest.fixture(scope="module")
def previous_release() -> Iterator[Path]:
    """The previous release's tree, extracted from this checkout's history (CI runs on a full clone)."""
    with tempfile.TemporaryDirectory(prefix="toolloop-previous-") as folder:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE], capture_output=True, check=False
        )
        assert archive.returncode == 0, (
            f"git archive {PREVIOUS_RELEASE} failed (a shallow clone lacks it: fetch the full history): "
            f"{archive.stderr.decode(errors='replace')}"
        )
        subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
        tree = Path(folder)
        # The previous release imports with today's dependencies, from its own tree, not this checkout.
        found = run_previous(
            tree, "import orchestrator.cli, workers.tasks, orchestrator; print(orchestrator.__file__)"
        )
        assert found.strip() == str(tree / "orchestrator" / "__init__.py")
        yield tree


def previous_env(tree: Path, redis_url: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(tree),
        "TOOLLOOP_REDIS_URL": redis_url,
        "TOOLLOOP_LEASE_TTL_S": "3",
        "TOOLLOOP_LOST_CALL_GRACE_S": "1",
        **(extra or {}),
    }


def run_previous(tree: Path, code: str, env: Mapping[str, str] | None = None, timeout_s: float = 90) -> str:
    """Run `code` with the previous release's modules; its stdout (failing on a non-zero exit)."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tree,
        env={**(env or os.environ), "PYTHONPATH": str(tree)},
        capture_output=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode()


def start_previous_orchestrator(
    tree: Path, redis_url: str, model: RecordingModelServer
) -> OrchestratorHandle:
    oid = f"previous-orch-{uuid.uuid4().hex[:8]}"
    env = previous_env(tree, redis_url, {"TOOLLOOP_SCRIPTED_BASE_URL": model.base_url})
    log = Path(tempfile.mkstemp(prefix="toolloop-previous-orchestrator-", suffix=".log")[1])
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", PREVIOUS_CLI, "orchestrator", "--id", oid],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tree,
            start_new_session=True,
        )
    handle = OrchestratorHandle(process, oid, log, {})
    handle.wait_registered(redis_url)
    return handle


def start_previous_worker(tree: Path, redis_url: str) -> WorkerHandle:
    name = f"previous-{uuid.uuid4().hex[:8]}@localhost"
    env = previous_env(tree, redis_url, {"TOOLLOOP_TOOL_MODULES": E2E_TOOLS})
    command = [sys.executable, "-c", PREVIOUS_CLI, "worker", "--concurrency=2", f"--hostname={name}"]
    log = Path(tempfile.mkstemp(prefix="toolloop-previous-worker-", suffix=".log")[1])
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tree, start_new_session=True
        )
    handle = WorkerHandle(process, name, redis_url, log)
    handle.wait_ready()
    return handle


def submit_previous(tree: Path, redis_url: str, prompts: Sequence[str]) -> list[str]:
    """Turn ids submitted by the previous release's `Client`, with limits and a model of their own."""
    code = (
        "import json, sys\n"
        "from orchestrator import Client\n"
        "client = Client(sys.argv[1])\n"
        "limits = json.loads(sys.argv[2])\n"
        "print(json.dumps([client.submit(prompt=p, model='scripted:plan', limits=limits)"
        " for p in json.loads(sys.argv[3])]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, redis_url, json.dumps(LIMITS), json.dumps(list(prompts))],
        cwd=tree,
        env=previous_env(tree, redis_url),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    ids: list[str] = json.loads(done.stdout)
    return ids


def wait_previous(tree: Path, redis_url: str, turn_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The outcomes as the previous release's `Client.wait` reads them (JSON)."""
    code = (
        "import json, sys\n"
        "from orchestrator import Client\n"
        "client = Client(sys.argv[1])\n"
        "print(json.dumps([client.wait(t, 60).model_dump(mode='json') for t in json.loads(sys.argv[2])]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, redis_url, json.dumps(list(turn_ids))],
        cwd=tree,
        env=previous_env(tree, redis_url),
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    outcomes: list[dict[str, Any]] = json.loads(done.stdout)
    return outcomes


def assert_played(outcome: TurnOutcome) -> None:
    """The turn played `ROUNDS` to its end: two rounds of calls (an unknown tool answered `not_found`)."""
    assert (outcome.status, outcome.stop_reason, outcome.text) == ("completed", None, "all done")
    answers = [(m.name, m.content[:40]) for m in outcome.messages if m.role == "tool"]
    assert answers[:2] == [("e2e_add", "5.0"), ("e2e_multiply", "20.0")]
    assert answers[2][0] == "e2e_echo_missing" and answers[2][1].startswith("Error: ")
    assert_every_call_answered_once(outcome.messages)


def assert_running(*handles: OrchestratorHandle | WorkerHandle) -> None:
    for handle in handles:
        assert handle.process.poll() is None, f"exited with {handle.process.returncode}:\n{handle.log_text()}"


def test_the_previous_orchestrator_runs_turns_of_todays_clients_and_workers(
    previous_release: Path, own_redis: RedisServer
) -> None:
    worker = start_worker(own_redis.url, [E2E_TOOLS], concurrency=2)
    client = Client(own_redis.url)
    with RecordingModelServer() as model:
        orchestrator = start_previous_orchestrator(previous_release, own_redis.url, model)
        try:
            turn_ids = [
                client.submit(prompt=plan_prompt(ROUNDS), model="scripted:plan", limits=LIMITS)
                for _ in range(4)
            ]
            for turn_id in turn_ids:
                assert_played(wait_outcome(client, turn_id, 60))
            assert_running(orchestrator, worker)
        finally:
            orchestrator.stop()
            worker.stop()
            client.redis.close()


def test_todays_orchestrator_runs_turns_of_the_previous_clients_and_workers(
    previous_release: Path, own_redis: RedisServer
) -> None:
    worker = start_previous_worker(previous_release, own_redis.url)
    client = Client(own_redis.url)
    with RecordingModelServer() as model:
        orchestrator = start_orchestrator(own_redis.url, model_base_url=model.base_url)
        try:
            turn_ids = submit_previous(
                previous_release, own_redis.url, [plan_prompt(ROUNDS) for _ in range(4)]
            )
            for turn_id in turn_ids:
                assert_played(wait_outcome(client, turn_id, 60))
            # The previous release's client reads what today's orchestrator wrote.
            seen = wait_previous(previous_release, own_redis.url, turn_ids)
            assert [(o["status"], o["text"]) for o in seen] == [("completed", "all done")] * len(turn_ids)
            assert_running(orchestrator, worker)
        finally:
            orchestrator.stop()
            worker.stop()
            client.redis.close()


def test_a_rollback_hands_todays_turns_to_the_previous_release(
    previous_release: Path, own_redis: RedisServer
) -> None:
    # Today's processes start the turns; each waits in a slow call when today's orchestrator dies.
    slow: list[dict[str, Any]] = [
        {"calls": [{"name": "e2e_sleep", "arguments": {"seconds": 2.0}}]},
        *ROUNDS,
    ]
    worker = start_worker(own_redis.url, [E2E_TOOLS], concurrency=2)
    client = Client(own_redis.url)
    previous: list[OrchestratorHandle | WorkerHandle] = []
    with RecordingModelServer() as model:
        # As the deploy page says: with the lost-call wait off, today's states hold no field the previous
        # release refuses (`lost_wait_s` is left out at its default).
        today = start_orchestrator(own_redis.url, model_base_url=model.base_url, env=ROLLBACK_SAFE)
        try:
            turn_ids = [
                client.submit(prompt=plan_prompt(slow), model="scripted:plan", limits=LIMITS)
                for _ in range(3)
            ]
            wait_until(
                lambda: all(client.redis.exists(keys.turn_state(t)) for t in turn_ids),
                "every turn to save its first step",
            )
            today.kill()
            worker.stop()
            previous.append(start_previous_worker(previous_release, own_redis.url))
            previous.append(start_previous_orchestrator(previous_release, own_redis.url, model))
            for turn_id in turn_ids:
                outcome = wait_outcome(client, turn_id, 60)
                assert outcome.messages[2].role == "tool" and outcome.messages[2].content == "slept 2.0 s"
                assert_played(outcome.model_copy(update={"messages": outcome.messages[3:]}))
            assert_running(*previous)
        finally:
            today.stop()
            worker.stop()
            for handle in previous:
                handle.stop()
            client.redis.close()


def test_a_turn_todays_code_cannot_run_is_left_to_another_told_once_and_ended_when_overdue(
    own_redis: RedisServer,
) -> None:
    client = Client(own_redis.url)
    redis = client.redis
    # Three running turns leased by nobody: two whose state a newer release wrote (a version this code does
    # not read), one of them long past its deadline; and one whose request does not parse (a value a newer
    # release added).
    newer, overdue, unreadable, corrupt = (
        f"turn_{what}_{uuid.uuid4().hex}" for what in ("newer", "overdue", "unreadable", "corrupt")
    )
    said = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    for turn_id, request, deadline_at in (
        (newer, {"prompt": "hi"}, time.time() + 600),
        (overdue, {"prompt": "hi"}, time.time() - 60),
        (unreadable, {"prompt": "hi", "model_settings": {"reasoning_effort": "extreme"}}, None),
    ):
        redis.set(keys.turn_request(turn_id), json.dumps(request))
        redis.set(keys.turn_status(turn_id), "running")
        if deadline_at is not None:
            history = keys.turn_history(turn_id)
            redis.rpush(history, *(json.dumps(m) for m in said))
            state = {"version": 99, "history_key": history, "history_len": 2, "deadline_at": deadline_at}
            redis.set(keys.turn_state(turn_id), json.dumps({**state, "turn_id": turn_id, "model": "x:y"}))
        redis.zadd(keys.TURNS_ACTIVE, {turn_id: time.time()})
    # And one whose state is garbage (no release reads it): its deadline is its submit time (its first
    # event's) plus its request's deadline_s, long past.
    redis.set(keys.turn_request(corrupt), json.dumps({"prompt": "hi", "limits": {"deadline_s": 5}}))
    redis.set(keys.turn_status(corrupt), "running")
    redis.set(keys.turn_state(corrupt), b"\xff\xfegarbage")
    queued_at = time.time() - 100
    redis.xadd(keys.turn_events(corrupt), {"name": "turn_queued", "at": str(queued_at), "data": "{}"})
    redis.zadd(keys.TURNS_ACTIVE, {corrupt: queued_at})
    worker = start_worker(own_redis.url, [E2E_TOOLS], concurrency=2)
    with RecordingModelServer() as model:
        orchestrator = start_orchestrator(own_redis.url, model_base_url=model.base_url)
        try:
            # Other turns run meanwhile, through several orphan scans (one a second with 3 s leases).
            turn_ids = [
                client.submit(prompt=plan_prompt(ROUNDS), model="scripted:plan", limits=LIMITS)
                for _ in range(2)
            ]
            for turn_id in turn_ids:
                assert_played(wait_outcome(client, turn_id, 60))
            ended = wait_outcome(client, overdue, 30)
            assert (ended.status, ended.stop_reason, ended.limit_reached) == ("stopped", "deadline", True)
            assert [m.model_dump(include={"role", "content"}) for m in ended.messages] == said
            assert ended.error is not None and "version 99" in ended.error.message
            broken = wait_outcome(client, corrupt, 30)
            assert (broken.status, broken.stop_reason, broken.messages) == ("stopped", "deadline", [])
            assert broken.error is not None and keys.turn_state(corrupt) in broken.error.message
            time.sleep(4.0)
            assert_running(orchestrator, worker)
            log = orchestrator.log_text()
            # Told once each, with what it could not read; never taken and released again meanwhile.
            for turn_id, why in ((newer, "version 99"), (unreadable, "extreme")):
                lines = [line for line in log.splitlines() if turn_id in line]
                assert len(lines) == 1, lines
                assert "cannot run it" in lines[0] and why in lines[0]
                assert redis.get(keys.turn_status(turn_id)) == "running"
                assert not redis.exists(keys.turn_lease(turn_id))
        finally:
            orchestrator.stop()
            worker.stop()
            client.redis.close()
