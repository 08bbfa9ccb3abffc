"""The outcome spool (issue 12, item 1): a finished result Redis refuses past the hard limit is kept and
written once Redis takes it — on a real redis-server out of memory (`maxmemory` with `noeviction`) and a real
prefork worker, which must survive the outage (kombu's ack is refused too).

- Redis out of memory as the tool ends, for longer than the call's hard limit: the outcome goes to the spool,
  nothing answers the call meanwhile, and once memory is freed the spooled outcome is the call's one outcome.
- A spooled outcome left by an earlier worker process is written by the next worker on the same folder.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from orchestrator.publishing.publisher import dispatch_call, get_producer_app
from orchestrator.redis_server import RedisServer
from orchestrator.settings import Settings
from orchestrator.store.catalogue import read_catalogue
from tests.support.processes import WorkerHandle, start_worker
from tests.support.waiting import wait_at_most, wait_until
from workers import keys, tool
from workers.call_store import OutcomeWrite
from workers.contract import ToolCallRequest, ToolOutcome, parse_tool_outcome
from workers.scripts import Fence
from workers.spool import SPOOL_DIR_VAR, Spool, build_spool_dir

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

THIS_MODULE = __name__


@tool(soft_time_limit=2, time_limit=3)
def spool_work(gate_file: str) -> str:
    """Starts, waits (a little) for `gate_file`, returns; touches no Redis."""
    wait_at_most(Path(gate_file).exists, 1.5, poll_s=0.02)
    return "finished while Redis was full"


@pytest.fixture(scope="module")
def spool_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spool")


@pytest.fixture(scope="module")
def worker(module_redis: RedisServer, spool_root: Path) -> Iterator[WorkerHandle]:
    handle = start_worker(
        module_redis.url, [THIS_MODULE], concurrency=1, env={SPOOL_DIR_VAR: str(spool_root)}
    )
    yield handle
    handle.stop()


def test_an_outcome_refused_past_the_hard_limit_is_spooled_and_written_later(
    module_redis: RedisServer, worker: WorkerHandle, spool_root: Path, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(module_redis.url)
    spool = Spool(build_spool_dir(module_redis.url, str(spool_root)))
    gate = tmp_path / "gate"
    request = ToolCallRequest(
        call_id=f"spool-{uuid.uuid4().hex}", tool="spool_work", arguments={"gate_file": str(gate)}
    )
    try:
        dispatch_call(
            get_producer_app(Settings(redis_url=module_redis.url)),
            read_catalogue(client)["spool_work"],
            request,
        )
        wait_until(lambda: client.exists(keys.running(request.call_id)) == 1, "the call to start")
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")  # every write refused from now on: OOM
        gate.touch()
        wait_until(lambda: spool.holds(request.call_id), "the outcome to be spooled")
        # Real time past the hard limit (3 s), a scenario: nothing may answer the call while its result waits.
        time.sleep(4)
        assert client.exists(keys.outcome(request.call_id)) == 0
        client.config_set("maxmemory", "0")
        wait_until(lambda: client.exists(keys.outcome(request.call_id)) == 1, "the spooled outcome")
        raw = client.get(keys.outcome(request.call_id))
        assert raw is not None
        outcome = parse_tool_outcome(raw)
        assert outcome.ok and outcome.content == "finished while Redis was full", outcome
        assert client.llen(keys.late_outcomes(request.call_id)) == 0
        assert client.exists(keys.running(request.call_id)) == 0, "the guard went with the spooled write"
        wait_until(lambda: not spool.holds(request.call_id), "the spool file to go")
        assert worker.process.poll() is None, f"the worker exited:\n{worker.log_text()[-3000:]}"
        assert "Unrecoverable error" not in worker.log_text()
        # The ack Redis refused lands once it takes writes again: the message leaves the unacked records and
        # its prefetch slot is free, so the worker goes on taking calls.
        wait_until(lambda: client.hlen("unacked") == 0, "the refused ack to land")
        gate.touch()
        after = ToolCallRequest(
            call_id=f"spool-{uuid.uuid4().hex}", tool="spool_work", arguments={"gate_file": str(gate)}
        )
        producer = get_producer_app(Settings(redis_url=module_redis.url))
        dispatch_call(producer, read_catalogue(client)["spool_work"], after)
        wait_until(lambda: client.exists(keys.outcome(after.call_id)) == 1, "the next call's outcome")
    finally:
        client.config_set("maxmemory", "0")
        client.close()


def test_a_spooled_outcome_left_by_an_earlier_worker_is_written(
    module_redis: RedisServer, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(module_redis.url)
    outcome = ToolOutcome(call_id=f"left-{uuid.uuid4().hex}", tool="spool_work", ok=True, content="left")
    spool = Spool(build_spool_dir(module_redis.url, str(tmp_path)))
    spool.put(OutcomeWrite.of(outcome, Fence(1, "1|gone@host:1:abcdef012345")))
    handle = start_worker(module_redis.url, [THIS_MODULE], concurrency=1, env={SPOOL_DIR_VAR: str(tmp_path)})
    try:
        wait_until(lambda: client.exists(keys.outcome(outcome.call_id)) == 1, "the left outcome")
        assert client.get(keys.outcome(outcome.call_id)) == outcome.model_dump_json().encode()
        wait_until(lambda: not spool.holds(outcome.call_id), "the spool file to go")
    finally:
        handle.stop()
        client.close()
