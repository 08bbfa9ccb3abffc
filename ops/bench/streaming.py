"""What streaming an answer costs (issue 14): events and Redis bytes per streamed turn, against the same turn
with `stream: false`, measured in the same run.

The orchestrator is the shipped one (`toolloop orchestrator`) serving the scripted model itself over HTTP,
streaming its answer a few characters at a time with `STREAM_DELAY_S` between pieces — about the pace of a
fast hosted model — so that the coalescing (`runtime.streaming`, one event per TOOLLOOP_STREAM_FLUSH_S) meets
a model that writes for several seconds. Each turn is one model call answering `answer_chars` characters; the
turns of a batch run at once, a batch streamed, then one not.

- events: every event of a turn, and its `text_delta`s;
- written: `INFO stats` `total_net_input_bytes` over the batch, per turn (every client's commands);
- held: `MEMORY USAGE` of the turn's event stream once it ended (what a page replays).
"""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis

from ops.bench.procs import Proc, start_orchestrator
from ops.bench.report import Metric
from ops.bench.scenarios import read_events, wait_completed
from ops.bench.storage import input_bytes
from orchestrator import Client
from workers import keys

# Seconds between two pieces of the scripted model's stream (TOOLLOOP_SCRIPTED_STREAM_DELAY_S).
STREAM_DELAY_S = 0.01
TOOLLOOP = str(Path(sys.executable).parent / "toolloop")


@dataclass(frozen=True)
class Batch:
    """Per turn, averaged over a batch."""

    events: float
    text_deltas: float
    written_bytes: float
    held_bytes: float


def start_streaming_orchestrator(url: str) -> Proc:
    """`toolloop orchestrator` with its own scripted model streaming at `STREAM_DELAY_S` a piece."""
    env = {"TOOLLOOP_SCRIPTED_STREAM_DELAY_S": str(STREAM_DELAY_S), "TOOLLOOP_LOG_LEVEL": "WARNING"}
    return start_orchestrator(url, env, command=[TOOLLOOP, "orchestrator"])


def build_answer(chars: int) -> str:
    """About `chars` characters of prose, in words, as a model writes."""
    sentence = "The streamed answer goes on with words of a usual length, as models write them. "
    return (sentence * (chars // len(sentence) + 1))[:chars].rstrip()


def run_batch(client: Client, turns: int, answer: str, *, stream: bool) -> Batch:
    """`turns` one-call turns answering `answer`, all at once; their per-turn figures."""
    r = client.redis
    before = input_bytes(r)
    prompt = json.dumps({"plan": [{"text": answer}]})
    turn_ids = [
        client.submit(prompt=f"{uuid.uuid4().hex} {prompt}", model="scripted:plan", stream=stream)
        for _ in range(turns)
    ]
    for turn_id in turn_ids:
        wait_completed(client, turn_id)
    written = input_bytes(r) - before
    events = [read_events(client, turn_id) for turn_id in turn_ids]
    held = [_memory_usage(r, keys.turn_events(turn_id)) for turn_id in turn_ids]
    return Batch(
        events=sum(len(e) for e in events) / turns,
        text_deltas=sum(sum(ev.name == "text_delta" for ev in e) for e in events) / turns,
        written_bytes=written / turns,
        held_bytes=sum(held) / turns,
    )


def _memory_usage(r: redis.Redis, key: str) -> int:
    return int(r.memory_usage(key, samples=0) or 0)


def measure_streaming(client: Client, *, turns: int, answer_chars: int) -> list[Metric]:
    """The streamed batch against the plain one: the rows of the report."""
    answer = build_answer(answer_chars)
    run_batch(client, 1, answer[:200], stream=True)  # warm: the model's first connection, the scripts
    streamed = run_batch(client, turns, answer, stream=True)
    plain = run_batch(client, turns, answer, stream=False)
    extra = {"turns": turns, "answer_chars": len(answer), "stream_delay_s": STREAM_DELAY_S}
    return [
        Metric("streamed_turn_events", streamed.events, "events", baseline=plain.events, extra=extra),
        Metric("streamed_turn_text_deltas", streamed.text_deltas, "events", extra=extra),
        Metric(
            "streamed_turn_redis_written_kb",
            streamed.written_bytes / 1024,
            "kB",
            baseline=plain.written_bytes / 1024,
            ratio=streamed.written_bytes / plain.written_bytes if plain.written_bytes else None,
            extra=extra,
        ),
        Metric(
            "streamed_turn_events_held_kb",
            streamed.held_bytes / 1024,
            "kB",
            baseline=plain.held_bytes / 1024,
            ratio=streamed.held_bytes / plain.held_bytes if plain.held_bytes else None,
            extra=extra,
        ),
    ]
