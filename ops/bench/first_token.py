"""The first token's overhead (issue 36 item 3): from the model server's first streamed byte to the first
`text_delta` a reader receives, through `Client.stream` and through the API's SSE (`GET /v1/turns/{id}/events`
of a `toolloop api` process), with the CPU each streamed delta costs.

The model server (`http_model`) answers each turn's one model call as a hosted model does: its first byte
after `FIRST_BYTE_DELAY_S`, then a piece of the answer every `PIECE_DELAY_S`, and logs the time of that first
byte under the marker in the turn's prompt (`first-token-<hex>`). A dozen readers (`TURNS_AT_ONCE` threads of
this process) start together: each submits its turn (through `Client.submit`, or `POST /v1/turns` for the
SSE path), opens its stream at once and notes when its first `text_delta` arrives. The overhead of a turn is
that moment less the model server's first byte (both Unix time on one machine): the orchestrator reading the
piece, its first write (which waits `FIRST_FLUSH_S` for more), Redis, and for SSE the API's fan-out and
its response.

The CPU per streamed delta is what streaming adds, divided by what it adds in deltas: the CPU of the
orchestrator, Redis and the API (and apart, of the readers) over a batch streamed, less over the same batch
with `stream: false` (the whole answer sent once it is written, at the same pace, so both take as long), per
turn, over the text deltas per turn streamed less the one of a plain turn. Noise can outweigh it on a busy
machine: then the row says `separated: false` and shows 0.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from ops.bench import cpu
from ops.bench.cpu import CpuWatch, Processes, Window
from ops.bench.http_model import HostedPace, ModelServer, read_first_bytes
from ops.bench.instant import INSTANT_MODEL
from ops.bench.procs import TOOLLOOP_BIN, Proc
from ops.bench.report import Metric, percentile, with_goal
from ops.bench.scenarios import Sizes
from ops.bench.streaming import build_answer
from orchestrator import Client
from orchestrator.errors import BenchError
from orchestrator.redis_server import find_free_port
from orchestrator.store.turn_stream import TextDeltaEvent, TurnFinishedEvent

TURNS_AT_ONCE = 12
# A hosted model's pace: its time to the first token, then a piece (a word or so) every 10 ms.
FIRST_BYTE_DELAY_S = 0.25
PIECE_DELAY_S = 0.01
# About a second of writing: five or so coalesced deltas a turn (TOOLLOOP_STREAM_FLUSH_S, 0.2 s).
ANSWER_CHARS = 600
# Issue 36's goals for the overhead, through either path.
P50_GOAL_MS = 10.0
P99_GOAL_MS = 50.0
CLIENT_PATH = "client"
SSE_PATH = "sse"
HOST = "127.0.0.1"
API_START_S = 60.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Stage:
    """What the scenario runs on: the HTTP variant's Redis, client, paced model server and processes;
    `keep` hands a process started here to the stack, which stops it."""

    url: str
    client: Client
    model: ModelServer
    processes: Processes
    keep: Callable[[Proc], None]


@dataclass(frozen=True)
class Reading:
    """One reader's turn: its marker, when its first text delta came (Unix time, s), how many deltas."""

    marker: str
    first_delta_at: float | None
    deltas: int


@dataclass(frozen=True)
class Batch:
    """A batch of turns at once: each reader's reading, and the CPU of every part over the batch."""

    readings: list[Reading]
    window: Window


def build_pace(first_byte_log: Path) -> HostedPace:
    """The model server's pace for marked turns, its first bytes logged in `first_byte_log`."""
    return HostedPace(first_byte_log, FIRST_BYTE_DELAY_S, PIECE_DELAY_S)


def build_prompt(marker: str, answer: str) -> str:
    """A `scripted:plan` prompt answering `answer`, with `marker` for the model server's log."""
    return f"{marker} " + json.dumps({"plan": [{"text": answer}]})


def build_overheads_ms(readings: Sequence[Reading], first_bytes: dict[str, float]) -> list[float]:
    """Per turn, ms from the model server's first byte to the reader's first text delta."""
    overheads: list[float] = []
    for reading in readings:
        first_byte_at = first_bytes.get(reading.marker)
        if first_byte_at is None or reading.first_delta_at is None:
            raise BenchError(f"turn {reading.marker}: no first byte logged, or no text delta read")
        overheads.append((reading.first_delta_at - first_byte_at) * 1000)
    return overheads


def read_client_stream(client: Client, answer: str, stream: bool, start: threading.Barrier) -> Reading:
    """Submit a turn through `Client.submit` and read it through `Client.stream` at once."""
    marker = f"first-token-{uuid.uuid4().hex}"
    start.wait()
    turn_id = client.submit(prompt=build_prompt(marker, answer), model=INSTANT_MODEL, stream=stream)
    first_at: float | None = None
    deltas = 0
    for event in client.stream(turn_id):
        if isinstance(event, TextDeltaEvent):
            first_at = first_at or time.time()
            deltas += 1
        elif isinstance(event, TurnFinishedEvent) and event.outcome.status != "completed":
            raise BenchError(f"turn {turn_id} ended {event.outcome.status}: {event.outcome.text}")
    if first_at is None and stream:
        raise BenchError(f"turn {turn_id} streamed no text_delta")
    return Reading(marker, first_at, deltas)


def read_sse_stream(base_url: str, answer: str, stream: bool, start: threading.Barrier) -> Reading:
    """Submit a turn with `POST /v1/turns` and read `GET /v1/turns/{id}/events` at once, as a web app does."""
    marker = f"first-token-{uuid.uuid4().hex}"
    body = {"prompt": build_prompt(marker, answer), "model": INSTANT_MODEL, "stream": stream}
    with httpx.Client(base_url=base_url, timeout=60.0) as http:
        start.wait()
        reply = http.post("/v1/turns", json=body)
        reply.raise_for_status()
        turn_id = reply.json()["id"]
        first_at: float | None = None
        deltas, name = 0, ""
        with http.stream("GET", f"/v1/turns/{turn_id}/events") as events:
            for line in events.iter_lines():
                if line.startswith("event:"):
                    name = line.partition(":")[2].strip()
                    if name == "text_delta":
                        first_at = first_at or time.time()
                        deltas += 1
                elif line.startswith("data:") and name == "turn_finished":
                    status = json.loads(line.partition(":")[2])["data"].get("status")
                    if status != "completed":
                        raise BenchError(f"turn {turn_id} ended {status}")
    if first_at is None and stream:
        raise BenchError(f"turn {turn_id} streamed no text_delta over SSE")
    return Reading(marker, first_at, deltas)


def start_api(url: str) -> tuple[Proc, str]:
    """`toolloop api` on a free port of this machine, on Redis `url`; returns once `/healthz` answers."""
    port = find_free_port(HOST)
    command = [str(TOOLLOOP_BIN), "api", "--host", HOST, "--port", str(port)]
    proc = Proc(command, {"TOOLLOOP_REDIS_URL": url, "TOOLLOOP_LOG_LEVEL": "WARNING"}, "api")
    base_url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + API_START_S
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"the API exited early:\n{proc.log_text()}")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1.0).status_code == 200:
                return proc, base_url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.stop()
    raise TimeoutError(f"the API did not answer in {API_START_S:g} s")


def run_batch(read: Callable[[threading.Barrier], Reading], watch: CpuWatch, turns: int) -> Batch:
    """`turns` readers started together; what each read, and every part's CPU over the batch."""
    start = threading.Barrier(turns)
    with ThreadPoolExecutor(max_workers=turns, thread_name_prefix="first-token") as pool:
        watch.start()
        futures = [pool.submit(read, start) for _ in range(turns)]
        readings = [future.result(timeout=120) for future in futures]
        window = watch.stop(turns, settle_s=0.3)
    return Batch(readings, window)


@dataclass(frozen=True)
class PathRun:
    """One path's batches: streamed (timed) and with `stream: false` (for the CPU per delta)."""

    path: str
    streamed: list[Batch]
    plain: list[Batch]


def measure_path(
    path: str, reader: Callable[[str, bool, threading.Barrier], Reading], watch: CpuWatch, batches: int
) -> PathRun:
    """A warm-up turn, then `batches` streamed batches, with a plain one after every other streamed one."""
    answer = build_answer(ANSWER_CHARS)
    run_batch(lambda start: reader(answer[:100], True, start), watch, 1)
    streamed: list[Batch] = []
    plain: list[Batch] = []
    for number in range(batches):
        streamed.append(run_batch(lambda start: reader(answer, True, start), watch, TURNS_AT_ONCE))
        if number % 2 == 0:
            plain.append(run_batch(lambda start: reader(answer, False, start), watch, TURNS_AT_ONCE))
    return PathRun(path, streamed, plain)


def _server_parts(path: str) -> tuple[str, ...]:
    return (cpu.ORCHESTRATOR, cpu.REDIS, cpu.API) if path == SSE_PATH else (cpu.ORCHESTRATOR, cpu.REDIS)


def build_path_metrics(run: PathRun, first_bytes: dict[str, float]) -> list[Metric]:
    """The path's rows: the overhead's p50 and p99 with their goals, and the CPU per streamed delta."""
    readings = [r for batch in run.streamed for r in batch.readings]
    overheads = build_overheads_ms(readings, first_bytes)
    extra: dict[str, object] = {
        "turns_at_once": TURNS_AT_ONCE,
        "samples": len(overheads),
        "first_byte_delay_s": FIRST_BYTE_DELAY_S,
        "piece_delay_s": PIECE_DELAY_S,
        "answer_chars": ANSWER_CHARS,
        "max_ms": round(max(overheads), 1),
    }
    name = f"first_token_overhead_{run.path}"
    rows = [
        with_goal(f"{name}_p50_ms", percentile(overheads, 50), "ms", limit=P50_GOAL_MS, extra=extra),
        with_goal(f"{name}_p99_ms", percentile(overheads, 99), "ms", limit=P99_GOAL_MS, extra=extra),
    ]
    rows.append(build_delta_cpu(run))
    return rows


def build_delta_cpu(run: PathRun) -> Metric:
    """CPU ms per streamed text delta of the orchestrator, Redis (and the API): streamed less plain, per turn,
    over the deltas streaming adds per turn; the readers' (this process) apart."""
    streamed = cpu.add_windows([b.window for b in run.streamed])
    plain = cpu.add_windows([b.window for b in run.plain])
    deltas = sum(r.deltas for b in run.streamed for r in b.readings) / streamed.units
    plain_deltas = sum(r.deltas for b in run.plain for r in b.readings) / plain.units
    added = max(deltas - plain_deltas, 1e-9)
    parts = _server_parts(run.path)
    by_part = {
        p: round((streamed.ms_per_unit(p) - plain.ms_per_unit(p)) / added, 3) for p in (*parts, cpu.CLIENT)
    }
    value = (streamed.ms_per_unit(*parts) - plain.ms_per_unit(*parts)) / added
    extra = {
        "parts": list(parts),
        "by_part_ms": by_part,
        "reader_ms": by_part[cpu.CLIENT],
        "text_deltas_per_turn": round(deltas, 2),
        "plain_text_deltas_per_turn": round(plain_deltas, 2),
        "streamed_turns": streamed.units,
        "plain_turns": plain.units,
        "separated": value > 0,
        "raw_ms": round(value, 3),
    }
    return Metric(f"streamed_delta_cpu_ms_{run.path}", max(value, 0.0), "ms CPU", extra=extra)


def run_first_token(stage: Stage, sizes: Sizes, progress: Progress) -> list[Metric]:
    """Both paths on the stage, with an API process of their own; every row."""
    progress("first token: starting the API")
    api, base_url = start_api(stage.url)
    stage.keep(api)
    processes = Processes(**{**stage.processes.__dict__, "api": api.pid})
    watch = CpuWatch(processes)
    batches = sizes.first_token_batches
    pace = stage.model.pace
    if pace is None:
        raise BenchError("the first-token scenario needs a model server with a pace")
    progress(f"first token: {batches} batch(es) of {TURNS_AT_ONCE} turns at once through Client.stream")
    client_run = measure_path(
        CLIENT_PATH,
        lambda answer, stream, start: read_client_stream(stage.client, answer, stream, start),
        watch,
        batches,
    )
    progress(f"first token: {batches} batch(es) of {TURNS_AT_ONCE} turns at once through the API's SSE")
    sse_run = measure_path(
        SSE_PATH,
        lambda answer, stream, start: read_sse_stream(base_url, answer, stream, start),
        watch,
        batches,
    )
    first_bytes = read_first_bytes(pace.first_byte_log)
    return [*build_path_metrics(client_run, first_bytes), *build_path_metrics(sse_run, first_bytes)]
