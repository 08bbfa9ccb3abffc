"""Turns on a Redis Cluster: three masters, three replicas, the broker on a Redis of its own.

A `toolloop worker` and `toolloop orchestrator`s (their scripted model served over HTTP by a thread of the
test) and the test's `Client`, configured as a user configures them: `TOOLLOOP_REDIS_CLUSTER=true`,
`TOOLLOOP_REDIS_URL` naming one node, `TOOLLOOP_BROKER_URL` the broker. A burst of turns with parallel tool
calls completes with every call answered once; an orchestrator SIGKILLed mid-turn has its turns taken over;
the master of the turn queue's slot failed over to its replica mid-burst (CLUSTER FAILOVER, or a SIGKILL)
loses no turn; the API submits, streams (a reader per turn) and lists; a conversation is refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from redis.crc import key_slot

from ops.redis_cluster import RedisCluster
from orchestrator import HttpClient, new_turn_id
from orchestrator.model import TurnOutcome, TurnRequest
from orchestrator.redis_server import find_free_port
from orchestrator.store import operations
from orchestrator.store.recent import list_recent
from orchestrator.store.runner import SyncRunner
from tests.faults.env import PLAN_MODEL, is_running, wait_checked
from tests.support.cluster_system import ClusterSystem, cluster_system, work_call
from tests.support.plans import plan_prompt
from tests.support.processes import ROOT, TOOLLOOP_BIN
from tests.support.served import answers, start_toolloop
from tests.support.sse import SseStream, read_sse
from workers import keys

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster() as running:
        yield running


@pytest.fixture
def system(cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClusterSystem]:
    with cluster_system(cluster, monkeypatch) as running:
        yield running


def _completed(outcomes: list[TurnOutcome]) -> None:
    unfinished = [(o.turn_id, o.status, o.stop_reason) for o in outcomes if o.status != "completed"]
    assert unfinished == [], f"{len(unfinished)} of {len(outcomes)} turns not completed: {unfinished[:3]}"


def test_a_burst_of_parallel_calls_completes_each_call_answered_once(system: ClusterSystem) -> None:
    system.start_worker()
    system.start_orchestrator()
    system.start_orchestrator()
    ids = system.submit(turns=12, calls=3, rounds=2)
    outcomes = wait_checked(system.client, ids, 180)  # each call answered exactly once
    _completed(outcomes)
    # Every key of a turn is in one slot: the turn id is their hash tag.
    turn_keys = [keys.turn_state(ids[0]), keys.turn_events(ids[0]), keys.turn_outcome(ids[0])]
    assert len({key_slot(k.encode()) for k in turn_keys}) == 1
    # The queue's side is left clean, in every shard: nothing active, claiming or homed (a turn leaves its
    # shard just after its outcome is written).
    shards = keys.all_queue_shards()
    system.wait_for(
        "every shard left clean",
        lambda: (
            not any(
                system.redis.zcard(s.active) or system.redis.llen(s.claiming) or system.redis.hlen(s.homes)
                for s in shards
            )
        ),
    )


def test_a_bursts_commands_fall_evenly_across_the_masters(
    system: ClusterSystem, cluster: RedisCluster
) -> None:
    system.start_worker()
    system.start_orchestrator()
    system.start_orchestrator()
    cluster.reset_stats()
    # Enough turns that their own keys, spread by turn id, even out (one turn is 1/300 of a master.s share).
    ids = system.submit(turns=900, calls=1, rounds=1, seconds=0.01)
    _completed(wait_checked(system.client, ids, 240))
    counts = cluster.command_counts()
    mean = sum(counts.values()) / len(counts)
    spread = {port: round((n - mean) / mean, 3) for port, n in counts.items()}
    assert all(abs(off) <= 0.25 for off in spread.values()), (counts, spread)


def _conversation_turn(system: ClusterSystem, conversation: str, word: str, **kwargs: Any) -> str:
    prompt = f"{word}: " + plan_prompt([{"calls": [work_call(0.2)]}, {"text": word}])
    return system.client.submit(
        prompt=prompt, tools=["sentinel_work"], model=PLAN_MODEL, conversation_id=conversation, **kwargs
    )


def test_a_conversations_turns_run_in_order_each_with_the_history_before_it(system: ClusterSystem) -> None:
    system.start_worker()
    first = system.start_orchestrator()
    system.start_orchestrator()
    conversations = [f"chat-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    words = ["one", "two", "three"]
    # Submitted at once: each conversation's later turns wait for the one before.
    ids = {
        c: [_conversation_turn(system, c, w, tenant=None if i else "acme") for w in words]
        for i, c in enumerate(conversations)
    }
    system.wait_for("a tool run under way", lambda: system.starts() > 0)
    first.kill()  # its turns, running or waiting behind them, go on
    for conversation, turn_ids in ids.items():
        outcomes = [system.client.wait(t, timeout=120) for t in turn_ids]
        _completed(outcomes)
        # The last turn's history is the whole conversation's, each turn's prompt in its place.
        prompts = [str(m.content).split(":")[0] for m in outcomes[-1].messages if m.role == "user"]
        assert prompts == words, (conversation, prompts)
        assert keys.turn_slot(turn_ids[0]) == keys.conversation_slot(conversation)
    # Listed as on one Redis, newest submitted first, the turns that waited included.
    listed = [turn.turn_id for turn in SyncRunner(system.redis).run_flow(list_recent(limit=100))]
    for turn_ids in ids.values():
        assert [t for t in listed if t in turn_ids] == turn_ids[::-1]


def test_a_conversation_turns_own_id_must_share_its_slot(system: ClusterSystem) -> None:
    conversation = f"chat-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError, match=r"cannot join conversation .* on a Redis Cluster"):
        _conversation_turn(system, conversation, "hi", turn_id="turn_mine_1")
    own = new_turn_id(conversation)
    assert _conversation_turn(system, conversation, "hi", turn_id=own) == own
    assert _conversation_turn(system, conversation, "hi", turn_id=own) == own  # a retried submit
    system.start_worker()
    system.start_orchestrator()
    _completed([system.client.wait(own, timeout=60)])


def test_a_client_that_takes_a_clusters_node_for_one_redis_says_what_to_set(cluster: RedisCluster) -> None:
    # Without TOOLLOOP_REDIS_CLUSTER a command meets MOVED or CROSSSLOT: one line naming the setting, exit 2.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLOOP_")}
    env |= {"PYTHONPATH": str(ROOT), "TOOLLOOP_REDIS_URL": cluster.url}
    for command in (["show", "turn_not_here"], ["pending"], ["orchestrator"]):
        result = subprocess.run(
            [str(TOOLLOOP_BIN), *command], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        if result.returncode == 0:  # `pending` read a key of the node's own slots: nothing to say
            continue
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2, result.stderr[-3000:]
        assert len(lines) == 1 and "set TOOLLOOP_REDIS_CLUSTER=true" in lines[0], lines


def test_a_turn_stored_but_never_queued_expires_and_a_queued_one_is_kept(system: ClusterSystem) -> None:
    # A submit that died between storing the turn and queuing it: its keys expire with the turn retention.
    orphan = new_turn_id()
    request = TurnRequest(prompt="never queued", model=PLAN_MODEL)
    SyncRunner(system.redis).run(operations.submit(request, orphan, time.time()))
    for name in (keys.turn_request(orphan), keys.turn_status(orphan), keys.turn_events(orphan)):
        assert 0 < system.redis.ttl(name) <= keys.TURN_TTL_S
    # A turn claimed, and one waiting behind its conversation's: kept while they last.
    system.start_worker()
    system.start_orchestrator()
    conversation = f"chat-{uuid.uuid4().hex[:8]}"
    running = _conversation_turn(system, conversation, "one")
    waiting = _conversation_turn(system, conversation, "two")
    system.wait_for("the first turn running", lambda: system.client.get(running).status == "running")
    for turn_id in (running, waiting):
        for name in (keys.turn_request(turn_id), keys.turn_status(turn_id), keys.turn_events(turn_id)):
            assert system.redis.ttl(name) == -1, (turn_id, name)
    _completed([system.client.wait(t, timeout=60) for t in (running, waiting)])


def test_an_orchestrator_killed_mid_turn_is_taken_over(system: ClusterSystem) -> None:
    system.start_worker()
    first = system.start_orchestrator()
    ids = system.submit(turns=4, calls=2, rounds=3, seconds=0.5)
    before = system.starts()
    system.wait_for("tool runs under way", lambda: system.starts() > before + 2)
    first.kill()
    system.start_orchestrator()
    _completed(wait_checked(system.client, ids, 180))


def test_the_api_submits_streams_and_lists_turns_on_the_cluster(system: ClusterSystem) -> None:
    system.start_worker()
    system.start_orchestrator()
    port = find_free_port()
    api = start_toolloop(["api", "--host", "127.0.0.1", "--port", str(port)], env=system.env)
    system.services.append(api)
    base_url = f"http://127.0.0.1:{port}"
    api.wait_for(lambda: answers(f"{base_url}/healthz"), "the API to answer /healthz", timeout_s=60)
    plan = {"plan": [{"calls": [work_call(0.1), work_call(0.1)]}]}
    body = {"prompt": json.dumps(plan), "tools": ["sentinel_work"], "model": PLAN_MODEL}

    async def run() -> tuple[str, SseStream]:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
            reply = await http.post("/v1/turns", json=body)
            assert reply.status_code in (200, 201, 202), reply.text + api.log_text()[-3000:]
            turn_id = reply.json()["id"]
            # Opened right after the submit: the stream's reader follows the turn's own slot.
            return turn_id, await read_sse(http, f"/v1/turns/{turn_id}/events")

    turn_id, stream = asyncio.run(run())
    assert stream.status == 200, stream.body
    names = stream.names
    assert names.count("tool_finished") == 2 and names[-1] == "turn_finished", names
    listed = httpx.get(f"{base_url}/v1/turns", timeout=30).json()
    assert turn_id in [t["turn_id"] for t in listed["turns"]], listed
    # A conversation over HTTP: the client makes each turn's id, in the conversation's slot.
    conversation = f"chat-{uuid.uuid4().hex[:8]}"
    with HttpClient(base_url) as http_client:
        turns = [
            http_client.submit(
                prompt=plan_prompt([{"text": w}]), model=PLAN_MODEL, conversation_id=conversation
            )
            for w in ("one", "two")
        ]
        outcome = http_client.wait(turns[-1], timeout=60)
    assert outcome.status == "completed", outcome
    assert len([m for m in outcome.messages if m.role == "user"]) == 2


@pytest.mark.parametrize("how", ["failover", "kill"])
def test_a_master_failed_over_mid_burst_loses_no_turn(
    system: ClusterSystem, cluster: RedisCluster, how: str
) -> None:
    system.start_worker()
    system.start_orchestrator()
    system.start_orchestrator()
    ids = system.submit(turns=10, calls=2, rounds=3, seconds=0.3)
    before = system.starts()
    system.wait_for("tool runs under way", lambda: system.starts() > before + 4)
    # The master of the ready tokens' slot: every idle claimer blocks on it, every submit pushes there.
    master = cluster.master_of(keys.ready_tokens("normal"))
    if how == "failover":
        cluster.failover(master)
    else:
        cluster.kill_master(master)
    ids += system.submit(turns=4, calls=2, rounds=2, seconds=0.2)
    _completed(wait_checked(system.client, ids, 240))
    alive = [is_running(w) for w in system.workers] + [is_running(o) for o in system.orchestrators]
    assert all(alive), system.logs()
