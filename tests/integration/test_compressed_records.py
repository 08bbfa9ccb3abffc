"""A large tool result on a real turn: compressed in the worker's outcome and the history, whole for readers.

A real turn (the scripted `plan` model over HTTP, an in-process `Runtime`, a prefork worker, a redis-server of
the module's own, so that what it receives is the turn's alone) calls `echo` for a 60 kB result. Redis must
receive less than the result once (both the worker's outcome and the history's entry are compressed:
`workers.packing`), hold it compressed in the conversation's list, and every reader — the outcome, the
conversation's next turn — must get it whole. With `TOOLLOOP_COMPRESSION=off` the same entry is plain JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis

from orchestrator.model import TurnRequest
from orchestrator.providers.scripted.server import ScriptedServer
from orchestrator.redis_server import RedisServer
from orchestrator.settings import Settings
from orchestrator.store.turns import TurnStore
from tests.support.in_process import serving
from tests.support.processes import start_worker
from workers import keys, packing

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TEXT, TIMES = "a row of a report; ", 3200  # 60.8 kB


@pytest.fixture(scope="module")
def served_url(module_redis: RedisServer) -> Iterator[str]:
    handle = start_worker(module_redis.url, ["tests.support.tools"], concurrency=1)
    yield module_redis.url
    handle.stop()


def echo_plan() -> str:
    # Two turns' worth: the plan is the conversation's first message, its round the assistant messages since.
    # A short final answer each: the plan's default one repeats every result.
    call = {"name": "echo", "arguments": {"text": TEXT, "times": TIMES}}
    return json.dumps({"plan": [{"calls": [call]}, {"text": "done"}] * 2})


def input_bytes(redis_url: str) -> int:
    return int(redis.Redis.from_url(redis_url).info("stats")["total_net_input_bytes"])


async def run_turns(
    redis_url: str, conversation_id: str, turns: int, **settings: str
) -> list[tuple[str, int]]:
    """`turns` turns of `echo_plan` in one conversation, one after the other: each one's id, and the bytes
    Redis received while it ran."""
    compressing = packing.is_compressing()  # building the settings sets the process's switch
    async with ScriptedServer() as base_url:
        config = Settings(redis_url=redis_url, scripted_base_url=base_url, model="scripted:plan", **settings)
        store = TurnStore.from_url(redis_url)
        ran: list[tuple[str, int]] = []
        try:
            async with serving(store, config):
                for _ in range(turns):
                    before = input_bytes(redis_url)
                    turn_id = await store.submit(
                        TurnRequest(prompt=echo_plan(), tools=["echo"], conversation_id=conversation_id)
                    )
                    outcome = await store.wait_outcome(turn_id, timeout_s=30)
                    assert outcome.status == "completed", outcome
                    ran.append((turn_id, input_bytes(redis_url) - before))
        finally:
            await store.aclose()
            packing.use_compression(compressing)
    return ran


def tool_entries(raw: redis.Redis, conversation_id: str) -> list[bytes]:
    entries: list[bytes] = raw.lrange(keys.conversation_history(conversation_id), 0, -1)
    return [e for e in entries if b'"role":"tool"' in packing.unpack(e).encode()]


async def test_a_large_result_is_written_compressed_and_read_whole(served_url: str) -> None:
    [(first, _), (second, written)] = await run_turns(served_url, "packed-talk", 2)
    # Plain, the result alone is sent twice (the worker's outcome, the history's entry): 120 kB. (The first
    # turn also loads the scripts.)
    assert written < len(TEXT) * TIMES / 2, f"Redis received {written} B for a {len(TEXT) * TIMES} B result"
    entries = tool_entries(redis.Redis.from_url(served_url), "packed-talk")
    assert len(entries) == 2
    assert all(e.startswith(packing.MARKER) and len(e) < len(TEXT) * TIMES / 20 for e in entries)

    store = TurnStore.from_url(served_url)
    try:
        outcome = await store.get_outcome(first)
        assert outcome is not None
        assert [m.content for m in outcome.messages if m.role == "tool"] == [TEXT * TIMES]
        # The conversation's next turn started from the compressed history, whole.
        later = await store.get_outcome(second)
        assert later is not None
        assert [m.content for m in later.messages if m.role == "tool"] == [TEXT * TIMES] * 2
        prior = await store.conversation_history("packed-talk")
        assert [m.content for m in prior.messages if m.role == "tool"] == [TEXT * TIMES] * 2
    finally:
        await store.aclose()


async def test_with_compression_off_the_history_holds_plain_json(served_url: str) -> None:
    await run_turns(served_url, "plain-talk", 1, compression="off")
    [entry] = tool_entries(redis.Redis.from_url(served_url), "plain-talk")
    assert json.loads(entry)["content"] == TEXT * TIMES
