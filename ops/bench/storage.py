"""What a turn costs as its conversation grows: Redis bytes written, Redis memory held, orchestrator CPU.

Every figure is measured from outside, so that it stays right whatever the persistence layout is:

- written: the `INFO stats` `total_net_input_bytes` delta over the turns — every client's commands
  (orchestrator, workers, Celery, this client) — less the background the same processes write when idle,
  measured just before;
- held: `MEMORY USAGE` (exact, `SAMPLES 0`) of every key, by a SCAN of the whole keyspace before and after
  the turns: the figure is the net growth of the keyspace, so no key is missed whatever it is named. Apart,
  for the breakdown: the keys the turns left under their own names (a turn id, a call id, a Celery task id
  or a conversation id of theirs), the keys of them still there in an hour (no TTL, or a longer one), and
  the growth of every other key. The `INFO memory` `used_memory` delta is the cross-check;
- CPU: utime + stime of the orchestrator process (`/proc/<pid>/stat`) over the turns, per tool call, and the
  share of it that was the in-process model's (`instant.ModelClock`).

Each size is a ratio to the turn's conversation: the JSON of its final `messages` (`outcome.messages`).
Turns run one at a time, each in a conversation of its own, so the conversation's keys count too.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import TypeAdapter

from ops.bench.instant import INSTANT_MODEL, read_model_cpu_s
from ops.bench.procs import read_cpu_s
from ops.bench.scenarios import read_events
from ops.bench.tools import BLOB_TOOL
from orchestrator import Client
from orchestrator.errors import BenchError
from orchestrator.model import Message

_MESSAGES = TypeAdapter(list[Message])
# Event fields that hold the id of something a turn may leave keys under.
_ID_FIELDS = ("call_id", "task_id")


@dataclass(frozen=True)
class FinishedTurn:
    """A completed turn: its ids (what its keys may be named after) and its conversation's JSON size."""

    turn_id: str
    conversation_id: str
    ids: frozenset[str]
    conversation_bytes: int


# A key whose TTL is longer than this (or who has none) counts as held for good: an outcome kept only until
# its turn has read it is not what a team running many turns a day pays for.
LONG_LIVED_S = 3600
# Ids in names of keys that are not the turns' own (Celery's and others'), folded for the breakdown.
_OTHER_ID = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}|[0-9a-f]{16,}")


@dataclass(frozen=True)
class KeySpace:
    """Every key of a Redis: its exact memory usage in bytes, and its TTL in seconds (-1: none)."""

    usage: dict[str, int]
    ttl_s: dict[str, float]


@dataclass(frozen=True)
class Growth:
    """What the turns added to the keyspace, in bytes: in all, under their names, for good, elsewhere."""

    total: int
    own: dict[str, int]
    long_lived: int
    other: int


@dataclass(frozen=True)
class Storage:
    """Per-turn means of a run of turns."""

    turns: int
    conversation_bytes: float
    written_bytes: float
    background_bytes: float
    held_bytes: float
    own_bytes: float
    own_keys: float
    long_lived_bytes: float
    other_growth_bytes: float
    used_memory_bytes: float
    held_by_kind: dict[str, float]


def build_blob_plan(rounds: int, result_kb: int, seed: int) -> str:
    """A `scripted:plan` prompt: `rounds` rounds of one `bench_blob` call each, then a short final answer.

    The final answer is fixed text, not the plan's default summary, which would repeat every result."""
    plan: list[dict[str, Any]] = [
        {"calls": [{"name": BLOB_TOOL, "arguments": {"kb": result_kb, "seq": seed * 1000 + i}}]}
        for i in range(rounds)
    ]
    plan.append({"text": "done"})
    return json.dumps({"plan": plan})


def run_blob_turn(client: Client, rounds: int, result_kb: int, *, timeout_s: float = 600.0) -> FinishedTurn:
    """One turn of `rounds` rounds with `result_kb` kB results, in a new conversation; waits for it."""
    conversation_id = f"bench-{uuid.uuid4().hex[:12]}"
    turn_id = client.submit(
        prompt=build_blob_plan(rounds, result_kb, seed=int(time.time() * 1000) % 1_000_000),
        tools=[BLOB_TOOL],
        model=INSTANT_MODEL,
        conversation_id=conversation_id,
        limits={
            "max_llm_calls": rounds + 1,
            "max_tool_executions": rounds,
            "deadline_s": timeout_s,
            "repeat_guard_rounds": None,
        },
    )
    outcome = client.wait(turn_id, timeout_s)
    if outcome.status != "completed" or outcome.tool_executions != rounds:
        raise BenchError(
            f"turn {turn_id} ended {outcome.status}/{outcome.stop_reason} after "
            f"{outcome.tool_executions} of {rounds} calls: {outcome.text}"
        )
    ids = {call.id for m in outcome.messages if m.role == "assistant" for call in m.tool_calls}
    return FinishedTurn(
        turn_id=turn_id,
        conversation_id=conversation_id,
        ids=frozenset(ids),
        conversation_bytes=len(_MESSAGES.dump_json(outcome.messages, exclude_none=True)),
    )


def with_event_ids(client: Client, turn: FinishedTurn) -> FinishedTurn:
    """The turn with the call and task ids its events name added (read after the figures are taken)."""
    ids = set(turn.ids)
    for event in read_events(client, turn.turn_id):
        ids.update(str(event.data[f]) for f in _ID_FIELDS if event.data.get(f))
    return FinishedTurn(turn.turn_id, turn.conversation_id, frozenset(ids), turn.conversation_bytes)


def scan_keyspace(r: redis.Redis) -> KeySpace:
    """Every key, its `MEMORY USAGE ... SAMPLES 0` and its TTL (a key gone between SCAN and the read is
    skipped)."""
    names = [k if isinstance(k, str) else k.decode() for k in r.scan_iter(count=1000)]
    usage: dict[str, int] = {}
    ttl_s: dict[str, float] = {}
    for start in range(0, len(names), 500):
        chunk = names[start : start + 500]
        pipe = r.pipeline(transaction=False)
        for name in chunk:
            pipe.memory_usage(name, samples=0)
            pipe.pttl(name)
        replies = pipe.execute()
        for name, size, ttl_ms in zip(chunk, replies[::2], replies[1::2], strict=True):
            if size is not None and ttl_ms != -2:
                usage[name] = int(size)
                ttl_s[name] = -1.0 if ttl_ms == -1 else ttl_ms / 1000
    return KeySpace(usage, ttl_s)


def input_bytes(r: redis.Redis) -> int:
    """Bytes Redis has received from every client since it started."""
    return int(r.info("stats")["total_net_input_bytes"])


def used_memory(r: redis.Redis) -> int:
    """The memory Redis's allocator holds for it, in bytes."""
    return int(r.info("memory")["used_memory"])


def measure_storage(
    client: Client, *, turns: int, rounds: int, result_kb: int, idle_s: float, settle_s: float = 1.0
) -> Storage:
    """Run `turns` turns one at a time and measure what they wrote and left in Redis, per turn."""
    r = client.redis
    before = scan_keyspace(r)
    memory_before = used_memory(r)
    idle_start, idle_t0 = input_bytes(r), time.monotonic()
    time.sleep(idle_s)
    start, t0 = input_bytes(r), time.monotonic()
    rate = (start - idle_start) / (t0 - idle_t0)
    finished = [run_blob_turn(client, rounds, result_kb) for _ in range(turns)]
    # The last events and expiries of the final step land after `wait` has returned.
    time.sleep(settle_s)
    end, t1 = input_bytes(r), time.monotonic()
    memory_after = used_memory(r)
    after = scan_keyspace(r)
    finished = [with_event_ids(client, turn) for turn in finished]
    background = rate * (t1 - t0)
    growth = measure_growth(before, after, finished)
    kinds: dict[str, float] = defaultdict(float)
    for name, size in growth.own.items():
        kinds[key_kind(name, finished)] += size / turns
    for name in after.usage.keys() - before.usage.keys() - growth.own.keys():
        kinds[_OTHER_ID.sub("{id}", name)] += after.usage[name] / turns
    return Storage(
        turns=turns,
        conversation_bytes=sum(t.conversation_bytes for t in finished) / turns,
        written_bytes=(end - start - background) / turns,
        background_bytes=background / turns,
        held_bytes=growth.total / turns,
        own_bytes=sum(growth.own.values()) / turns,
        own_keys=len(growth.own) / turns,
        long_lived_bytes=growth.long_lived / turns,
        other_growth_bytes=growth.other / turns,
        used_memory_bytes=(memory_after - memory_before) / turns,
        held_by_kind=dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
    )


def measure_growth(before: KeySpace, after: KeySpace, turns: Sequence[FinishedTurn]) -> Growth:
    """How the keyspace grew while `turns` ran, and how much of it is theirs by name, or for good."""
    pattern = _id_pattern(turns)
    own = {name: size for name, size in after.usage.items() if pattern.search(name)}
    new = after.usage.keys() - before.usage.keys()
    long_lived = sum(
        after.usage[name]
        for name in new | own.keys()
        if after.ttl_s[name] < 0 or after.ttl_s[name] > LONG_LIVED_S
    )
    total = sum(after.usage.values()) - sum(before.usage.values())
    return Growth(total=total, own=own, long_lived=long_lived, other=total - sum(own.values()))


def key_kind(name: str, turns: Iterable[FinishedTurn]) -> str:
    """A key's name with the ids in it written as `{turn}`, `{conversation}` and `{id}`."""
    for turn in turns:
        if turn.turn_id in name or turn.conversation_id in name or any(i in name for i in turn.ids):
            name = name.replace(turn.turn_id, "{turn}").replace(turn.conversation_id, "{conversation}")
            for call_id in sorted(turn.ids, key=len, reverse=True):
                name = name.replace(call_id, "{id}")
    return name


def _id_pattern(turns: Sequence[FinishedTurn]) -> re.Pattern[str]:
    ids = {i for t in turns for i in (t.turn_id, t.conversation_id, *t.ids)}
    if not ids:
        raise BenchError("no turn to attribute keys to")
    return re.compile("|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True)))


@dataclass(frozen=True)
class CpuPerCall:
    """Orchestrator CPU seconds per tool call over turns of one size, and the in-process model's share."""

    rounds: int
    turns: int
    calls: int
    cpu_s: float
    model_cpu_s: float
    conversation_bytes: float


def measure_cpu_per_call(
    client: Client, pid: int, model_cpu_file: str, *, rounds: int, result_kb: int, turns: int
) -> CpuPerCall:
    """Orchestrator CPU over `turns` turns of `rounds` calls, run one at a time, divided by the calls."""
    cpu0, model0 = read_cpu_s(pid), read_model_cpu_s(model_cpu_file)
    finished = [run_blob_turn(client, rounds, result_kb) for _ in range(turns)]
    # The terminal step's last writes run after the outcome is visible.
    time.sleep(0.5)
    cpu1, model1 = read_cpu_s(pid), read_model_cpu_s(model_cpu_file)
    calls = turns * rounds
    return CpuPerCall(
        rounds=rounds,
        turns=turns,
        calls=calls,
        cpu_s=(cpu1 - cpu0) / calls,
        model_cpu_s=(model1 - model0) / calls,
        conversation_bytes=sum(t.conversation_bytes for t in finished) / turns,
    )
