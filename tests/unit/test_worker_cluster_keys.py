"""The keys a worker gives its scripts for one call, in both layouts (`workers.keys`), recorded by a
stand-in client: on a Redis Cluster every script's keys hash to one slot (the turn's for a turn call, the
call's own for a direct one) and no '' stands in for a key, and the owner's notification is the worker's own
XADD; on one Redis the keys are named as every earlier release named them and the scripts notify as before.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from workers import keys, packing, scripts
from workers.call_store import CallStore, OutcomeWrite
from workers.concurrency import SlotStore, build_all_slot_keys, build_slot_claim
from workers.contract import ToolCallRequest, ToolOutcome, ToolSpec
from workers.progress import build_progress_call
from workers.settings import get_worker_settings

pytestmark = pytest.mark.timeout(30)

TURN = "turn_k1"
WIRE_CALL = f"{TURN}/call_1"
DIRECT_CALL = "direct_k1"
OWNER = "orch-1"
TOKEN = "1|w:1:a"
NAMES = {
    hashlib.sha1(script.source.encode("utf-8")).hexdigest(): script.name  # Redis's name of a script
    for script in (
        scripts.START,
        scripts.WRITE_OUTCOME,
        scripts.RELEASE,
        scripts.CLAIM_IDEMPOTENCY,
        scripts.PROGRESS,
        scripts.SLOTS,
        scripts.SLOT_WAITING,
    )
}


class Recorder:
    """A stand-in for redis-py's client (and its pipelines): records each script run with its KEYS and
    ARGV, and every other command; answers each script as it answers on a cluster (owner included)."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, list[str], list[str]]] = []
        self.commands: list[tuple[Any, ...]] = []

    def reply(self, name: str, args: list[str]) -> Any:
        owner = OWNER.encode()
        return {
            "start": [0, 1, owner] if keys.is_cluster_layout() else [0, 1],
            "write_outcome": [1, owner] if keys.is_cluster_layout() else 1,
            "claim_idempotency": [0, b""],
            "slots": [1, 0] if args[0] == "acquire" else 1,
        }.get(name, 1)

    def run(self, sha: str, script_keys: list[str], args: list[Any]) -> Any:
        name = NAMES[sha]
        self.runs.append((name, list(script_keys), [str(a) for a in args]))
        return self.reply(name, self.runs[-1][2])

    def register_script(self, source: str) -> Any:
        recorder, sha = self, hashlib.sha1(source.encode("utf-8")).hexdigest()

        class Script:
            def __init__(self) -> None:
                self.sha, self.script = sha, source

            def __call__(self, keys: list[str], args: list[Any]) -> Any:
                return recorder.run(sha, keys, args)

        return Script()

    def execute_command(self, *words: Any) -> Any:
        if words[0] == "EVALSHA":
            count = int(words[2])
            return self.run(words[1], list(words[3 : 3 + count]), list(words[3 + count :]))
        self.commands.append(words)
        return b"1-0"

    def get(self, key: str) -> Any:
        self.commands.append(("GET", key))
        return None

    def set(self, key: str, value: str, ex: int | None = None) -> Any:
        self.commands.append(("SET", key))
        return True

    def pipeline(self, transaction: bool = True) -> Pipeline:
        return Pipeline(self)


class Pipeline:
    """The recorder's pipeline: queues, then runs each command in order."""

    def __init__(self, client: Recorder) -> None:
        self.client = client
        self.queued: list[tuple[Any, ...]] = []

    def __len__(self) -> int:
        return len(self.queued)

    def execute_command(self, *words: Any) -> None:
        self.queued.append(words)

    def set(self, key: str, value: str, ex: int | None = None) -> None:
        self.queued.append(("SET", key))

    def get(self, key: str) -> None:
        self.queued.append(("GET", key))

    def evalsha(self, *_: Any) -> None:
        raise AssertionError("a cluster client's pipeline refuses evalsha: queue EVALSHA as a command")

    def execute(self) -> list[Any]:
        return [
            self.client.execute_command(*words) if words[0] == "EVALSHA" else self.client.get(words[1])
            for words in self.queued
        ]


@pytest.fixture
def cluster_layout() -> Iterator[None]:
    get_worker_settings()  # built (and cached) first: building settings sets the layout they name
    keys.use_cluster_layout(True)
    try:
        yield
    finally:
        keys.use_cluster_layout(False)


def _request(direct: bool, **fields: Any) -> ToolCallRequest:
    if direct:
        return ToolCallRequest(
            call_id=DIRECT_CALL, tool="scrape", reply_key=keys.reply(DIRECT_CALL, None), **fields
        )
    return ToolCallRequest(call_id=WIRE_CALL, tool="scrape", turn_id=TURN, **fields)


def _run_a_call(request: ToolCallRequest) -> Recorder:
    """Everything a worker sends for one call: its slots, its start, its idempotency claim, its progress
    and its waiting event (a turn call's), its outcome with every companion, its releases."""
    recorder = Recorder()
    store = CallStore(recorder)  # type: ignore[arg-type]
    slots = SlotStore(recorder)  # type: ignore[arg-type]
    for fleet, per_tenant in ((2, None), (None, 1), (2, 1)):
        spec = ToolSpec(name="scrape", max_concurrency=fleet, max_concurrency_per_tenant=per_tenant)
        claim = build_slot_claim(spec, request.tenant)
        assert claim is not None
        slots.acquire(claim, TOKEN, ttl_s=10)
        slots.release(claim.keys, TOKEN)
        slots.tell_waiting(request, claim, scripts.SlotResult.TOOL_FULL, 2)
    slots.release(build_all_slot_keys("scrape", request.tenant), "1|w:1:", prefix=True)
    store.start(request, token=TOKEN, running_ttl_s=10, worker="w")
    idem_key = keys.idempotency("scrape", "digest", "default")
    store.claim_idempotency(idem_key, holder=TOKEN, lock_ttl_s=5)
    if request.turn_id is not None:
        script_keys, args = build_progress_call(request.turn_id, request.call_id, TOKEN, _fields())
        recorder.run(hashlib.sha1(scripts.PROGRESS.source.encode()).hexdigest(), script_keys, args)
    outcome = ToolOutcome(
        call_id=request.call_id, tool="scrape", turn_id=request.turn_id, ok=True, content="x"
    )
    write = OutcomeWrite.of(
        outcome,
        scripts.Fence(1, TOKEN),
        reply_key=request.reply_key,
        holder=TOKEN,
        idempotency_lock=keys.idempotency_lock(idem_key),
        idempotency_key=idem_key,
        idempotency_record="{}",
        full_result_key=keys.full_result(request.call_id, request.turn_id),
        full_result_json="{}",
    )
    assert store.finish(write) is scripts.WriteResult.WON
    store.release(request.call_id, request.turn_id, TOKEN)
    store.release_idempotency_lock(idem_key, TOKEN, prefix=True)
    return recorder


def _fields() -> dict[str, str]:
    return {"name": "tool_progress", "at": "1.0", "data": "{}"}


@pytest.mark.usefixtures("cluster_layout")
@pytest.mark.parametrize("direct", [False, True], ids=["turn call", "direct call"])
def test_on_a_cluster_every_script_of_a_call_touches_one_slot(direct: bool) -> None:
    request = _request(direct)
    recorder = _run_a_call(request)
    ran = {name for name, _, _ in recorder.runs}
    expected = {"slots", "start", "claim_idempotency", "write_outcome", "release"}
    assert ran == (expected if direct else expected | {"progress", "slot_waiting"})
    for name, script_keys, _ in recorder.runs:
        assert "" not in script_keys, f"{name} was given '' (slot 0) for a key: {script_keys}"
        assert len({key_slot(key.encode()) for key in script_keys}) == 1, f"{name}: {script_keys}"
    # A call's own keys are in its turn's slot, a direct call's in its own.
    home = key_slot(keys.turn_lease(TURN).encode() if not direct else f"{{{DIRECT_CALL}}}".encode())
    for name, script_keys, _ in recorder.runs:
        if name in ("start", "write_outcome", "progress", "slot_waiting"):
            assert key_slot(script_keys[0].encode()) == home, name


@pytest.mark.usefixtures("cluster_layout")
def test_on_a_cluster_the_worker_adds_the_notifications_the_scripts_would() -> None:
    recorder = _run_a_call(_request(direct=False))
    start_args = next(args for name, _, args in recorder.runs if name == "start")
    write_args = next(args for name, _, args in recorder.runs if name == "write_outcome")
    assert start_args[3] == write_args[2] == "", "the scripts were given an empty inbox prefix"
    xadds = [words for words in recorder.commands if words[0] == "XADD"]
    head = ("XADD", keys.inbox(OWNER), "NOMKSTREAM", "MAXLEN", "~", keys.INBOX_MAXLEN, "*")
    assert xadds == [
        (
            *head,
            "kind",
            "started",
            "turn",
            TURN,
            "call",
            WIRE_CALL,
            "attempt",
            "1",
            "worker",
            "w",
            "at",
            start_args[7],
        ),
        (*head, "kind", "outcome", "turn", TURN, "call", WIRE_CALL, "outcome", write_args[0]),
    ]


@pytest.mark.usefixtures("cluster_layout")
def test_on_a_cluster_a_direct_call_notifies_no_inbox() -> None:
    recorder = _run_a_call(_request(direct=True))
    assert [words for words in recorder.commands if words[0] == "XADD"] == []


def test_on_one_redis_the_keys_are_named_as_before() -> None:
    assert not keys.is_cluster_layout()
    assert [
        keys.outcome(WIRE_CALL, TURN),
        keys.late_outcomes(WIRE_CALL, TURN),
        keys.full_result(WIRE_CALL, TURN),
        keys.attempts(WIRE_CALL, TURN),
        keys.running(WIRE_CALL, TURN),
        keys.fence(WIRE_CALL, TURN),
        keys.reply(DIRECT_CALL, None),
        keys.slot_waiting_told(WIRE_CALL, TURN),
        keys.tool_slots("scrape"),
        keys.tenant_slots("scrape", "acme"),
        keys.idempotency("scrape", "digest", "default"),
    ] == [
        "toolloop:outcome:turn_k1/call_1",
        "toolloop:outcome:turn_k1/call_1:late",
        "toolloop:result:turn_k1/call_1",
        "toolloop:attempts:turn_k1/call_1",
        "toolloop:running:turn_k1/call_1",
        "toolloop:fence:turn_k1/call_1",
        "toolloop:reply:direct_k1",
        "toolloop:slot_waiting:turn_k1/call_1",
        "toolloop:slots:scrape",
        "toolloop:slots:scrape:tenant:acme",
        "toolloop:idem:scrape:digest",
    ]


def test_on_one_redis_the_scripts_get_what_they_got_and_notify_themselves() -> None:
    recorder = _run_a_call(_request(direct=True))
    runs = {name: (script_keys, args) for name, script_keys, args in recorder.runs}
    start_keys, start_args = runs["start"]
    assert start_keys == [
        "toolloop:outcome:direct_k1",
        "toolloop:running:direct_k1",
        "toolloop:attempts:direct_k1",
        "",
        "toolloop:fence:direct_k1",
        "",
    ]
    assert start_args[3] == "toolloop:inbox:"
    write_keys, write_args = runs["write_outcome"]
    assert write_keys == [
        "toolloop:outcome:direct_k1",
        "toolloop:outcome:direct_k1:late",
        "",
        "toolloop:reply:direct_k1",
        "toolloop:fence:direct_k1",
        "toolloop:running:direct_k1",  # the guard the write drops
    ]
    assert write_args[2] == "toolloop:inbox:"
    assert [words for words in recorder.commands if words[0] == "XADD"] == []
    turn = _run_a_call(_request(direct=False))
    slot_keys = [script_keys for name, script_keys, _ in turn.runs if name == "slots"]
    assert slot_keys[:2] == [["toolloop:slots:scrape", ""], ["toolloop:slots:scrape", ""]]
    assert slot_keys[2] == ["", "toolloop:slots:scrape:tenant:default"]


def test_a_large_outcome_is_not_carried_in_its_notification() -> None:
    # The limit is on the bytes stored (the writer's `packing.pack`): plain, ...
    small, large = "x" * keys.INBOX_OUTCOME_MAX_BYTES, "é" * (keys.INBOX_OUTCOME_MAX_BYTES // 2 + 1)
    packing.use_compression(False)
    try:
        assert scripts.build_outcome_notification("t", "t/c", packing.pack(small))["outcome"] == small
        assert scripts.build_outcome_notification("t", "t/c", packing.pack(large)) == {
            "kind": "outcome",
            "turn": "t",
            "call": "t/c",
            "outcome": "",
        }
    finally:
        packing.use_compression(True)
    # ... or compressed: what shrinks under the limit is carried (compressed), what does not is not.
    carried = scripts.build_outcome_notification("t", "t/c", packing.pack(large))["outcome"]
    assert isinstance(carried, bytes) and packing.unpack(carried) == large
    noise = random.Random(0).randbytes(keys.INBOX_OUTCOME_MAX_BYTES).hex()
    assert scripts.build_outcome_notification("t", "t/c", packing.pack(noise))["outcome"] == ""


def test_both_reply_shapes_of_the_scripts_parse() -> None:
    assert scripts.parse_write_reply(1) == (scripts.WriteResult.WON, None)
    assert scripts.parse_write_reply([1, b"orch-1"]) == (scripts.WriteResult.WON, "orch-1")
    assert scripts.parse_write_reply([0, None]) == (scripts.WriteResult.LOST, None)
    assert scripts.parse_write_result([2, None]) is scripts.WriteResult.FENCED
    assert scripts.parse_start_reply([0, 3, b"orch-1"]) == (3, 0)
    assert scripts.parse_start_owner([0, 3, b"orch-1"]) == "orch-1"
    assert scripts.parse_start_owner([0, 3, None]) is None
    assert scripts.parse_start_owner([0, 3]) is None
