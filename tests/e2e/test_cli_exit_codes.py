"""`toolloop submit --wait` as a person or a script runs it: its exit code says how the turn ended.

0 only for a completed turn; 1 for a stopped, failed or cancelled one (the outcome is printed all the same);
4 when `--timeout` passes first, saying where the turn stands ("still queued: is an orchestrator running?"
when nobody picked it up). On the whole system: Redis, a prefork worker serving the example tools too, and
`toolloop orchestrator` with no model credentials, serving the scripted models.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Mapping

import pytest
import redis

from orchestrator.client.redis_client import Client
from orchestrator.redis_server import RedisServer, find_free_port
from tests.support.e2e_model import RecordingModelServer
from tests.support.e2e_processes import E2E_TOOLS, OrchestratorHandle, start_orchestrator
from tests.support.plans import plan_prompt
from tests.support.processes import ROOT, TOOLLOOP_BIN, WorkerHandle, start_worker
from tests.support.store_db import store_db_url
from tests.support.waiting import wait_for
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

NOT_QUEUED_DB = 14  # of the session's Redis, where no orchestrator runs


@pytest.fixture(scope="module")
def e2e_worker(module_redis: RedisServer) -> Iterator[WorkerHandle]:
    """This module's worker also serves the example tools the docs use (add, multiply, …)."""
    handle = start_worker(module_redis.url, [E2E_TOOLS, "workers.examples"], concurrency=2)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def orchestrator_process(
    module_redis: RedisServer, model_server: RecordingModelServer, e2e_worker: WorkerHandle
) -> Iterator[OrchestratorHandle]:
    """An orchestrator with the default model and no key for OpenAI's or Anthropic's own API."""
    env = {
        "TOOLLOOP_METRICS_PORT": str(find_free_port()),
        "TOOLLOOP_MODEL": "scripted:demo",
        "OPENAI_API_KEY": "",
        "OPENAI_BASE_URL": "",
        "ANTHROPIC_API_KEY": "",
        "ANTHROPIC_BASE_URL": "",
    }
    handle = start_orchestrator(module_redis.url, model_base_url=model_server.base_url, env=env)
    yield handle
    handle.stop()


def submit(
    redis_url: str, *args: str, env: Mapping[str, str] | None = None, timeout_s: float = 60
) -> subprocess.CompletedProcess[str]:
    """`toolloop submit ARGS` with the environment of a submitting process that is not the orchestrator."""
    full_env = {**os.environ, "TOOLLOOP_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [str(TOOLLOOP_BIN), "submit", *args],
        env=full_env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.usefixtures("orchestrator_process")
def test_the_readme_example_completes_with_the_right_answer_and_exits_0(module_redis: RedisServer) -> None:
    # The submitting process's own TOOLLOOP_MODEL is not the turn's: the orchestrator's default is.
    done = submit(
        module_redis.url,
        "--prompt",
        "What is 2+3, times 4?",
        "--wait",
        env={"TOOLLOOP_MODEL": "scripted:echo"},
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert (outcome["status"], outcome["model"]) == ("completed", "scripted:demo")
    assert outcome["text"].startswith("(2 + 3) × 4 = 20\n")
    calls = [c["name"] for m in outcome["messages"] if m["role"] == "assistant" for c in m["tool_calls"]]
    assert calls == ["add", "multiply"] and outcome["llm_calls"] == 3
    chosen = submit(module_redis.url, "--prompt", "hi there", "--model", "scripted:echo", "--wait")
    assert chosen.returncode == 0, chosen.stderr
    assert (json.loads(chosen.stdout)["model"], json.loads(chosen.stdout)["text"]) == (
        "scripted:echo",
        "hi there",
    )


FAILING = plan_prompt([{"error": {"status": 400, "message": "bad request"}}])
TWO_ROUNDS = plan_prompt([{"calls": [{"name": "e2e_add", "arguments": {"a": 1, "b": 2}}]}, {"text": "3"}])


@pytest.mark.usefixtures("orchestrator_process")
@pytest.mark.parametrize(
    ("arguments", "status", "stop_reason"),
    [
        (["--prompt", FAILING], "failed", "provider_error"),
        (["--prompt", TWO_ROUNDS, "--max-llm-calls", "1"], "stopped", "max_llm_calls"),
    ],
    ids=["failed", "stopped"],
)
def test_a_turn_that_did_not_complete_exits_1_and_still_prints_its_outcome(
    module_redis: RedisServer, arguments: list[str], status: str, stop_reason: str
) -> None:
    done = submit(module_redis.url, *arguments, "--model", "scripted:plan", "--wait")
    assert done.returncode == 1, (done.stdout, done.stderr)
    outcome = json.loads(done.stdout)
    assert (outcome["status"], outcome["stop_reason"]) == (status, stop_reason)
    assert done.stderr == f"error: turn {outcome['turn_id']} ended {status} ({stop_reason})\n"


@pytest.mark.usefixtures("orchestrator_process")
def test_a_cancelled_turn_exits_1(module_redis: RedisServer, client: Client) -> None:
    prompt = plan_prompt([{"calls": [{"name": "e2e_sleep", "arguments": {"seconds": 30}}]}])
    env = {**os.environ, "TOOLLOOP_REDIS_URL": module_redis.url, "PYTHONPATH": str(ROOT)}
    command = [str(TOOLLOOP_BIN), "submit", "--prompt", prompt, "--model", "scripted:plan", "--wait"]
    waiting = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        turn_id = find_running_turn(client, prompt)
        assert client.cancel(turn_id)
        stdout, stderr = waiting.communicate(timeout=30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 1, stderr
    assert json.loads(stdout)["status"] == "cancelled"
    assert stderr == f"error: turn {turn_id} ended cancelled (cancelled)\n"


def find_running_turn(client: Client, prompt: str) -> str:
    """The id of the turn submitted with `prompt` (by its marker), once an orchestrator runs it."""
    marker = prompt.partition(" ")[0]
    prefix, suffix = keys.turn_request("\0").split("\0")

    def running() -> str | None:
        for key in client.redis.scan_iter(keys.turn_request("*")):
            if marker in (client.redis.get(key) or ""):
                turn_id = str(key).removeprefix(prefix).removesuffix(suffix)
                if client.get(turn_id).status == "running":
                    return turn_id
        return None

    return wait_for(running, f"a running turn with the prompt {prompt[:60]}…")


@pytest.mark.usefixtures("orchestrator_process")
def test_a_wait_that_times_out_exits_4_and_says_the_turn_goes_on(
    module_redis: RedisServer, client: Client
) -> None:
    prompt = plan_prompt([{"calls": [{"name": "e2e_sleep", "arguments": {"seconds": 30}}]}])
    done = submit(
        module_redis.url, "--prompt", prompt, "--model", "scripted:plan", "--wait", "--timeout", "2"
    )
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert done.stdout == ""
    turn_id = done.stderr.split()[2]
    assert done.stderr == (
        f"error: turn {turn_id} did not end within 2 s (still running; toolloop show {turn_id})\n"
    )
    assert client.cancel(turn_id)  # frees the worker for the other tests


def test_a_wait_on_a_turn_nobody_picked_up_asks_whether_an_orchestrator_runs(redis_url: str) -> None:
    url = store_db_url(redis_url, NOT_QUEUED_DB)
    redis.Redis.from_url(url).flushdb()
    done = submit(url, "--prompt", "What is 2+3?", "--wait", "--timeout", "1")
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert (
        "is still queued after 1 s: is an orchestrator running? (start one: toolloop orchestrator)"
        in done.stderr
    )


@pytest.mark.usefixtures("orchestrator_process")
def test_a_model_whose_key_the_orchestrator_lacks_fails_at_its_first_call(module_redis: RedisServer) -> None:
    # The submitting process has a key; the orchestrator, which calls the model, has none.
    env = {"OPENAI_API_KEY": "sk-not-the-orchestrators"}
    done = submit(module_redis.url, "--prompt", "hi", "--model", "openai:gpt-4.1-mini", "--wait", env=env)
    assert done.returncode == 1, (done.stdout, done.stderr)
    outcome = json.loads(done.stdout)
    assert (outcome["status"], outcome["stop_reason"], outcome["llm_calls"]) == (
        "failed",
        "provider_error",
        1,
    )
    error = outcome["error"]
    assert (error["type"], error["retryable"]) == ("missing_api_key", False)
    assert "OPENAI_API_KEY" in error["message"] and "orchestrator" in error["message"]


@pytest.mark.parametrize(
    ("prices", "said"),
    [
        ('{"x": {"input": -1, "output": 1}}', "error: model price 'x': a price cannot be negative"),
        ("not json", 'error: error parsing value for field "model_prices"'),
        ('{"x": {"input": 1}}', "error: model price 'x': a new model needs both `input` and `output`"),
    ],
)
def test_an_orchestrator_with_a_bad_price_table_says_so_in_one_line_and_exits_2(
    prices: str, said: str
) -> None:
    env = {**os.environ, "TOOLLOOP_MODEL_PRICES": prices, "TOOLLOOP_REDIS_URL": "redis://127.0.0.1:1/0"}
    done = subprocess.run(
        [str(TOOLLOOP_BIN), "orchestrator"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 2 and done.stderr.startswith(said), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_submit_stream_ends_at_its_timeout_with_exit_4_as_wait_does() -> None:
    # No orchestrator runs on this Redis: the turn stays queued, and the stream has nothing to print.
    with RedisServer() as server:
        env = {**os.environ, "TOOLLOOP_REDIS_URL": server.url}
        command = [str(TOOLLOOP_BIN), "submit", "--prompt", "hi", "--stream", "--timeout", "1"]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 4, done.stderr
    turn_id, said = done.stderr.strip().splitlines()
    assert said == f"error: turn {turn_id} is still queued after 1 s: is an orchestrator running? " + (
        "(start one: toolloop orchestrator)"
    )
    assert done.stdout == ""
