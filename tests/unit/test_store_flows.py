"""The store's flows driven by hand (sans-IO: made-up replies and clocks), the two runners on fake clients,
the direct-call flow, and the one-signature decorator of the clients."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

from orchestrator.client.direct import build_call_flow, build_direct_call, build_rejection_outcome
from orchestrator.client.redis_client import AsyncClient, Client, build_submission
from orchestrator.errors import ModelConfigError, UnknownToolError, UnknownTurnError
from orchestrator.model import TurnOutcome, TurnRequest, TurnStatus, UserMessage
from orchestrator.providers.base import check_model_name
from orchestrator.settings import Settings
from orchestrator.store import flows, operations
from orchestrator.store.catalogue import RecentCatalogue, ToolCatalogue
from orchestrator.store.codec import CLAIM_AGAIN, ClaimedTurn, TurnEvent
from orchestrator.store.effects import BlockingCall, Item, RedisCommand, ScriptCall, Transaction
from orchestrator.store.flows import READY_POLL_MS
from orchestrator.store.history import Head, Prior
from orchestrator.store.runner import AsyncRunner, SyncRunner
from orchestrator.store.scripts import ControlResult, FinishResult, SubmitResult, TakeOverResult, WriteResult
from orchestrator.submit_checks import check_submit
from tests.support.flows import drive, drive_with
from workers import keys, packing
from workers.contract import FailureKind, ToolOutcome, ToolSpec, parse_tool_outcome

pytestmark = pytest.mark.timeout(10)


def clock(*times: float) -> Callable[[], float]:
    ticks = iter(times)
    return lambda: next(ticks)


def event(entry_id: str, name: str = "tool_started") -> TurnEvent:
    return TurnEvent(id=entry_id, name=name, turn_id="t", at=1.0)


def words(steps: list[Any]) -> list[Any]:
    return [
        step.args[0]
        if isinstance(step, RedisCommand)
        else "+".join(str(c[0]) for c in step.commands)
        if isinstance(step, Transaction)
        else step.script.name
        for step in steps
    ]


DONE = TurnOutcome(turn_id="t", status="completed", text="4")


def ticking(*times: float) -> Callable[[], float]:
    """A clock that reads `times` in turn, then stays at the last."""
    ticks = list(times)
    return lambda: ticks.pop(0) if len(ticks) > 1 else ticks[0]


def test_claim_waits_for_a_ready_token_in_capped_steps_and_claims_again_when_told() -> None:
    flow = flows.claim("orch", timeout_s=5.0, ttl_ms=9000, cap_ms=2000, clock=ticking(0))
    claimed = ClaimedTurn("t2", TurnRequest(prompt="x"), False)
    steps, result = drive(flow, [None, True, CLAIM_AGAIN, claimed])
    assert words(steps) == ["claim", "BLPOP", "claim", "claim"]
    # A step blocks no longer than the poll that finds turns queued without a ready token.
    assert steps[1].args[-1] == f"{READY_POLL_MS / 1000:.3f}"
    assert steps[0].args[:2] == ("orch", "9000") and result is claimed
    assert words(
        drive(flows.claim("o", timeout_s=1.0, ttl_ms=1, cap_ms=10, clock=ticking(0, 1.0)), [None])[0]
    ) == ["claim"]


def test_claim_without_a_token_looks_again_only_once_the_poll_is_due() -> None:
    # Capped steps of 0.5 s: no token in the first three, the fourth reaches the poll; then it claims again.
    poll_s = READY_POLL_MS / 1000
    times = [0, 0, 0, 0.5, 1.0, poll_s - 0.5, poll_s, poll_s]
    flow = flows.claim("o", timeout_s=60.0, ttl_ms=1, cap_ms=500, clock=ticking(*times))
    claimed = ClaimedTurn("t", TurnRequest(prompt="x"), False)
    steps, result = drive(flow, [None, False, False, False, False, claimed])
    assert words(steps) == ["claim", "BLPOP", "BLPOP", "BLPOP", "BLPOP", "claim"] and result is claimed
    # A wait that reaches its timeout ends without another claim: the caller's next wait begins with one.
    ending = flows.claim("o", timeout_s=1.0, ttl_ms=1, cap_ms=5000, clock=ticking(0, 0, 0, 1.0))
    steps, result = drive(ending, [None, False])
    assert words(steps) == ["claim", "BLPOP"] and result is None
    assert steps[1].args[-1] == "1.000"


def test_wait_outcome_reads_the_outcome_only_when_there_is_one() -> None:
    flow = flows.wait_outcome("t", 2.0, cap_ms=1000, clock=clock(0, 0.5, 1.0, 1.5))
    finished = event("5-0", "turn_finished")
    replies = [("3-0", TurnStatus.RUNNING), [event("4-0")], [], TurnStatus.WAITING, [finished], DONE]
    steps, outcome = drive(flow, replies)
    # The newest id and the status in one round trip; the outcome (with the messages it references) only after
    # `turn_finished`; the status again after a quiet read.
    assert [type(s).__name__ for s in steps[:1]] == ["Batch"]
    assert words(steps[1:]) == ["XREAD", "XREAD", "GET", "XREAD", "read_history"]
    reads = [s.args for s in steps[1:] if s.args[0] == "XREAD"]
    assert reads[0][1:3] == ("BLOCK", 1000) and reads[0][-1] == "3-0"  # capped, from the newest id
    assert reads[1][1:3] == ("BLOCK", 1000) and reads[1][-1] == "4-0"
    assert reads[2][1:3] == ("BLOCK", 500) and reads[2][-1] == "4-0"  # what is left of the timeout
    assert outcome == DONE
    # A turn that has ended: its outcome at once.
    steps, outcome = drive(
        flows.wait_outcome("t", 2.0, cap_ms=1000, clock=clock(0)), [("9-0", TurnStatus.COMPLETED), DONE]
    )
    assert words(steps[1:]) == ["read_history"] and outcome == DONE
    # A quiet read finds it ended (its turn_finished trimmed away, say): the outcome is read then.
    replies = [("3-0", TurnStatus.RUNNING), [], TurnStatus.COMPLETED, DONE]
    steps, outcome = drive(flows.wait_outcome("t", 2.0, cap_ms=1000, clock=clock(0, 0.5)), replies)
    assert words(steps[1:]) == ["XREAD", "GET", "read_history"] and outcome == DONE


def test_wait_outcome_raises_for_an_unknown_turn_and_at_its_deadline() -> None:
    with pytest.raises(UnknownTurnError):
        drive(flows.wait_outcome("t", 2.0, cap_ms=1000, clock=clock(0)), [("0", None)])
    with pytest.raises(UnknownTurnError):  # expired while waited for
        drive(
            flows.wait_outcome("t", 2.0, cap_ms=1000, clock=clock(0, 0.5)),
            [("0", TurnStatus.RUNNING), [], None],
        )
    with pytest.raises(TimeoutError, match="turn t did not finish within 2 s"):
        drive(flows.wait_outcome("t", 2.0, cap_ms=1000, clock=clock(0, 2.0)), [("0", TurnStatus.QUEUED)])


def test_progress_is_the_newest_event_id_and_the_status_together() -> None:
    progress = flows.get_progress("t")
    assert [op.args[0] for op in progress.operations if isinstance(op, RedisCommand)] == ["XREVRANGE", "GET"]
    assert progress.parse([[], None]) == ("0", None)
    assert progress.parse([[(b"9-1", {})], b"running"]) == ("9-1", TurnStatus.RUNNING)


def test_follow_events_emits_until_turn_finished_and_reads_an_ended_turn_without_blocking() -> None:
    flow = flows.follow_events("t", "0", block_ms=None, cap_ms=1500)
    finished = event("6-0", "turn_finished")
    replies = [TurnStatus.RUNNING, TurnStatus.RUNNING, [event("5-0")], None]  # None: what an Item gets
    replies += [TurnStatus.COMPLETED, [finished], None]
    steps, _ = drive(flow, replies)
    assert [s.value for s in steps if isinstance(s, Item)] == [event("5-0"), finished]
    reads = [s.args for s in steps if isinstance(s, RedisCommand) and s.args[0] == "XREAD"]
    assert reads == [
        ("XREAD", "BLOCK", 1500, "STREAMS", keys.turn_events("t"), "0"),
        ("XREAD", "STREAMS", keys.turn_events("t"), "5-0"),
    ]
    with pytest.raises(UnknownTurnError):
        drive(flows.follow_events("t", "0", block_ms=10, cap_ms=5), [None])
    expired = flows.follow_events("t", "0", block_ms=10, cap_ms=5)
    assert drive(expired, [TurnStatus.FAILED, None, []])[1] is None


def test_control_write_outcome_and_save_outcome_flows() -> None:
    assert drive(flows.send_control("t", "cancel", None, None, 1.0), [ControlResult.RECORDED])[1]
    assert not drive(flows.send_control("t", "cancel", None, None, 1.0), [ControlResult.TERMINAL])[1]
    with pytest.raises(UnknownTurnError):
        drive(flows.send_control("t", "cancel", None, None, 1.0), [ControlResult.UNKNOWN])
    ours = ToolOutcome(call_id="c", tool="add", ok=True, result=1, content="1")
    theirs = ours.model_copy(update={"result": 2})
    assert drive(flows.write_outcome(ours), [(WriteResult.WON, None)])[1] is ours
    assert drive(flows.write_outcome(ours), [(WriteResult.LOST, None), theirs])[1] is theirs
    # On a Redis Cluster the script names the owner it could not tell: the flow tells it, as the script would.
    owned = ours.model_copy(update={"turn_id": "t"})
    steps, winner = drive(flows.write_outcome(owned), [(WriteResult.WON, "orch-1"), 1])
    assert winner is owned and steps[1].args[:3] == ("XADD", keys.inbox("orch-1"), "NOMKSTREAM")
    assert dict(zip(steps[1].args[-8::2], steps[1].args[-7::2], strict=True))["kind"] == "outcome"
    request = TurnRequest(prompt="x", conversation_id="conv")
    steps, result = drive(flows.save_outcome("t", DONE, flows.UNREAD, 1.0), [request, FinishResult.FINISHED])
    assert words(steps) == ["GET", "save_outcome"] and steps[1].keys[9] == keys.conversation_lock("conv")
    assert result is FinishResult.FINISHED
    assert words(drive(flows.save_outcome("t", DONE, None, 1.0), [0])[0]) == ["save_outcome"]


def test_a_cluster_outcome_is_compressed_once_for_its_record_and_its_notification(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    packs: list[str] = []
    real_pack = packing.pack

    def counting_pack(text: str) -> str | bytes:
        packs.append(text)
        return real_pack(text)

    monkeypatch.setattr(packing, "pack", counting_pack)
    large = ToolOutcome(call_id="c", turn_id="t", tool="t", ok=True, content="word " * 2000)
    steps, _ = drive(flows.write_outcome(large), [(WriteResult.WON, "orch-1"), 1])
    assert len(packs) == 1
    stored = real_pack(packs[0])
    assert isinstance(stored, bytes)  # compressed: 10 kB of one word
    assert stored in steps[0].args and steps[1].args[-1] == stored  # the script's and the notice's alike


CATALOGUE = {
    "add": ToolSpec(name="add"),
    "echo": ToolSpec(name="echo"),
    "drop_tables": ToolSpec(name="drop_tables", sensitive=True),
}


CATALOGUE_READ = "HGETALL+HGETALL"  # the live entries and the served-tools record, in one MULTI


def test_submit_refuses_tools_no_live_worker_serves_listing_public_ones_only() -> None:
    request = TurnRequest(prompt="x", tools=["add", "addd", "ecoh", "addd"])
    flow = flows.submit(request, "t", 1.0)
    assert words([next(flow)]) == [CATALOGUE_READ]
    with pytest.raises(UnknownToolError) as refused:
        flow.send(ToolCatalogue(CATALOGUE))  # refused before the submit script: nothing is stored
    assert (refused.value.unknown, refused.value.available) == (["addd", "ecoh"], ["add", "echo"])
    assert str(refused.value) == (
        "unknown tools 'addd' (did you mean 'add'?), 'ecoh' (did you mean 'echo'?) in 'tools'; "
        "available: add, echo"
    )
    assert isinstance(refused.value, ValueError)


@pytest.mark.parametrize(
    ("tools", "catalogue"),
    [
        (["add", "drop_tables"], CATALOGUE),  # a sensitive tool, named: offered
        (["addd"], {}),  # no worker has published yet: accepted unchecked
    ],
)
def test_submit_accepts_known_tools_and_any_while_no_catalogue_is_published(
    tools: list[str], catalogue: dict[str, ToolSpec]
) -> None:
    flow = flows.submit(TurnRequest(prompt="x", tools=tools), "t", 1.0)
    steps, turn_id = drive(flow, [ToolCatalogue(catalogue), SubmitResult.QUEUED])
    assert words(steps) == [CATALOGUE_READ, "submit"] and turn_id == "t"
    for nothing_to_check in (None, []):  # every public tool, or none: no catalogue read
        steps, _ = drive(flows.submit(TurnRequest(prompt="x", tools=nothing_to_check), "t", 1.0), [1])
        assert words(steps) == ["submit"]


def test_submits_within_a_second_reuse_the_catalogue_read_unless_it_lacks_a_tool() -> None:
    recent = RecentCatalogue()
    read = ToolCatalogue(CATALOGUE)

    def submit(tools: list[str], at: float, replies: list[object]) -> list[str]:
        flow = flows.submit(TurnRequest(prompt="x", tools=tools), "t", at, recent=recent)
        return words(drive(flow, replies)[0])

    assert submit(["add"], 100.0, [read, SubmitResult.QUEUED]) == [CATALOGUE_READ, "submit"]
    assert submit(["add", "echo"], 100.9, [SubmitResult.QUEUED]) == ["submit"]
    # A tool the last read did not have may have just come up: read again before refusing it.
    with_new = ToolCatalogue({**CATALOGUE, "new": ToolSpec(name="new")})
    assert submit(["new"], 100.9, [with_new, SubmitResult.QUEUED]) == [CATALOGUE_READ, "submit"]
    assert submit(["new"], 101.0, [SubmitResult.QUEUED]) == ["submit"]
    assert submit(["add"], 102.0, [read, SubmitResult.QUEUED]) == [CATALOGUE_READ, "submit"]  # a second on
    # An empty catalogue (no worker published yet) accepts anything, and never stands in for a read.
    recent.keep(ToolCatalogue(), 103.0)
    assert submit(["add"], 103.0, [read, SubmitResult.QUEUED]) == [CATALOGUE_READ, "submit"]
    with pytest.raises(UnknownToolError):
        submit(["gone"], 103.1, [read])


@pytest.mark.parametrize(
    ("served_at", "gone_after_s", "accepted"),
    [
        (95.0, 60.0, True),  # its only worker restarts: no live one, one 5 s ago
        (40.0, 60.0, True),  # exactly the window
        (39.0, 60.0, False),  # served longer ago than the window: gone
        (95.0, 3.0, False),  # a shorter window (TOOLLOOP_TOOL_GONE_AFTER_S)
        (101.0, 3.0, True),  # a worker's clock a little ahead
    ],
)
def test_submit_accepts_a_tool_served_within_the_gone_after_window(
    served_at: float, gone_after_s: float, accepted: bool
) -> None:
    # Another tool is live, so the catalogue is not empty (which would accept anything).
    read = ToolCatalogue({"echo": CATALOGUE["echo"]}, {"add": (served_at, CATALOGUE["add"])})
    request = TurnRequest(prompt="x", tools=["add"])
    flow = flows.submit(request, "t", 100.0, tool_gone_after_s=gone_after_s)
    if accepted:
        assert words(drive(flow, [read, SubmitResult.QUEUED])[0]) == [CATALOGUE_READ, "submit"]
    else:
        with pytest.raises(UnknownToolError, match="unknown tool 'add'"):
            drive(flow, [read])


@pytest.mark.parametrize("model", [None, "", "fast", "default", "smart", "scripted:demo", "openai:qwen3:8b"])
def test_submit_takes_a_model_name_or_a_tier(model: str | None) -> None:
    check_model_name(model)


@pytest.mark.parametrize(
    ("model", "message"),
    [("gpt-4", "neither `provider:model`"), ("nowhere:x", "unknown provider"), ("openai:", "provider:model")],
)
def test_submit_refuses_a_model_name_no_orchestrator_can_serve(model: str, message: str) -> None:
    with pytest.raises(ModelConfigError, match=message):
        drive(flows.submit(TurnRequest(prompt="x", model=model), "t", 1.0, check=check_submit), [])


def test_submit_history_and_reply_flows() -> None:
    steps, turn_id = drive(flows.submit(TurnRequest(prompt="x"), "turn_web", 1.0), [SubmitResult.EXISTS])
    assert turn_id == "turn_web" and steps[0].args[0] == "turn_web"
    with pytest.raises(ValueError, match="invalid turn id"):
        drive(flows.submit(TurnRequest(prompt="x"), "has space", 1.0), [])
    assert drive(flows.conversation_history("c"), [Head(None, None)])[1] == Prior([], [])
    legacy = [Head(None, "t"), DONE.model_copy(update={"messages": [UserMessage(content="hi")]})]
    assert drive(flows.conversation_history("c"), legacy)[1] == Prior([UserMessage(content="hi")], [])
    waited = flows.wait_reply("r", 1.0, cap_ms=500, clock=clock(0, 0, 0.5, 0.75, 1.0))
    steps, arrived = drive(waited, [False, False, False])
    assert not arrived and [s.args for s in steps] == [
        ("BLPOP", "r", 0.5),
        ("BLPOP", "r", 0.5),
        ("BLPOP", "r", 0.25),
    ]


# --- runners on fake clients -----------------------------------------------------------------------------


class FakeRedis:
    """A sync client that records what it is asked and answers from a table by command."""

    def __init__(self, replies: dict[str, Any]) -> None:
        self.replies = replies
        self.calls: list[tuple[Any, ...]] = []
        self.registered: list[str] = []

    def deliver(self, value: Any) -> Any:
        return value

    def answer(self, words: tuple[Any, ...]) -> Any:
        self.calls.append(words)
        return self.replies[words[0]]

    def execute_command(self, *words: Any) -> Any:
        return self.deliver(self.answer(words))

    def register_script(self, source: str) -> Callable[..., Any]:
        self.registered.append(source)
        return lambda keys, args: self.execute_command("EVALSHA", *keys, *args)

    def pipeline(self, transaction: bool) -> FakePipeline:
        assert transaction
        return FakePipeline(self)


class FakePipeline:
    """Queues commands (at once, on both kinds of client) and answers them all on `execute`."""

    def __init__(self, client: FakeRedis) -> None:
        self.client = client
        self.queued: list[tuple[Any, ...]] = []

    def execute_command(self, *words: Any) -> FakePipeline:
        self.queued.append(words)
        return self

    def execute(self) -> Any:
        return self.client.deliver([self.client.answer(words) for words in self.queued])


class FakeAsyncRedis(FakeRedis):
    """The same, with redis.asyncio's shape: replies come as coroutines."""

    def deliver(self, value: Any) -> Any:
        async def later() -> Any:
            return value

        return later()


def sample_flow(thread_ids: list[int]) -> Generator[Any, Any, Any]:
    status = yield operations.get_status("t")
    yield Item(status)
    result = yield operations.take_over("orch", "t", 10)
    yield Item(result)
    yield BlockingCall(lambda: thread_ids.append(threading.get_ident()))
    return (yield operations.unregister("orch"))


def test_the_sync_runner_performs_operations_flows_and_streams() -> None:
    fake = FakeRedis({"GET": "running", "EVALSHA": 1, "ZREM": 1, "DEL": 0})
    runner = SyncRunner(fake)  # type: ignore[arg-type]
    assert runner.run(operations.get_status("t")) is TurnStatus.RUNNING
    assert runner.run(operations.take_over("orch", "t", 10)) is TakeOverResult.TAKEN
    assert runner.run(operations.take_over("orch", "u", 10)) is TakeOverResult.TAKEN
    assert len(fake.registered) == 1  # registered once per runner and script
    threads: list[int] = []
    emitted: Iterator[Any] = runner.iter_flow(sample_flow(threads))  # type: ignore[arg-type]
    assert list(emitted) == [TurnStatus.RUNNING, TakeOverResult.TAKEN]
    assert threads == [threading.get_ident()]
    assert isinstance(operations.unregister("o"), Transaction)
    assert (
        runner.run_flow(flows.write_outcome(ToolOutcome(call_id="c", tool="t", ok=True, content=""))).call_id
        == "c"
    )


async def test_the_async_runner_awaits_the_same_operations_and_runs_blocking_calls_in_a_thread() -> None:
    fake = FakeAsyncRedis({"GET": b"waiting", "EVALSHA": 1, "ZREM": 1, "DEL": 0})
    runner = AsyncRunner(fake)  # type: ignore[arg-type]
    assert await runner.run(operations.get_status("t")) is TurnStatus.WAITING
    threads: list[int] = []
    emitted = [value async for value in runner.iter_flow(sample_flow(threads))]  # type: ignore[arg-type]
    assert emitted == [TurnStatus.WAITING, TakeOverResult.TAKEN]
    assert threads and threads[0] != threading.get_ident()
    assert await runner.run_flow(flows.submit(TurnRequest(prompt="x"), "turn_a", 1.0)) == "turn_a"
    assert isinstance(fake.calls[-1][0], str) and len(fake.registered) == 2


# --- the direct-call flow --------------------------------------------------------------------------------

SETTINGS = Settings(redis_url="redis://127.0.0.1:1/0")
ECHO = ToolSpec(name="echo", parameters={"type": "object", "properties": {"text": {"type": "string"}}})


def answer_direct_call(step: Any, outcome: ToolOutcome | None, wins: bool) -> Any:
    """The parsed reply a direct call's flow gets for `step`: the catalogue holds `echo`, the reply list
    says whether `outcome` came, and the outcome key holds `outcome` (or the synthetic one, once written)."""
    match step:
        case BlockingCall():
            return "task-1"
        case Transaction():
            return ToolCatalogue({"echo": ECHO})
        case RedisCommand(args=("BLPOP", *_)):
            return outcome is not None
        case RedisCommand(args=("GET", *_)):
            return outcome
        case ScriptCall():
            return (WriteResult.WON if wins else WriteResult.LOST), None
        case _:
            return 1


def run_direct_call(
    call: Any, clock_times: tuple[float, ...], outcome: ToolOutcome | None, wins: bool
) -> Any:
    flow = build_call_flow(call, SETTINGS, cap_ms=1000, now=lambda: 100.0, clock=clock(*clock_times))
    found = [outcome]

    def answer(step: Any) -> Any:
        if isinstance(step, ScriptCall):  # what the next read finds: the synthetic one, or the late real one
            synthetic = parse_tool_outcome(step.args[0])
            found[0] = synthetic if wins else synthetic.model_copy(update={"ok": True, "synthetic": False})
        return answer_direct_call(step, found[0], wins)

    return drive_with(flow, answer)


def kinds(steps: list[Any]) -> list[str]:
    return [s.args[0] if isinstance(s, RedisCommand) else type(s).__name__ for s in steps]


def test_a_direct_call_to_an_unknown_tool_ends_before_dispatch() -> None:
    steps, outcome = run_direct_call(build_direct_call("nope", {}), (), None, wins=True)
    assert kinds(steps) == ["Transaction"] and not outcome.ok and outcome.attempts == 0


def test_a_direct_call_of_a_tool_that_requires_confirmation_needs_the_callers_approval() -> None:
    catalogue = {"transfer": ToolSpec(name="transfer", requires_confirmation=True)}
    refused, spec = build_rejection_outcome("transfer", {}, catalogue)
    assert refused is not None and spec is None and refused.attempts == 0
    assert refused.failure_kind is FailureKind.CONFIRMATION_DENIED
    assert "approve=True" in refused.content and "--approve" in refused.content
    assert build_rejection_outcome("transfer", {}, catalogue, approved=True) == (None, catalogue["transfer"])


def test_a_direct_call_publishes_waits_and_reads_the_outcome() -> None:
    call = build_direct_call("echo", {"text": "hi"}, timeout_s=5.0)
    done = ToolOutcome(call_id="direct-x", tool="echo", ok=True, result="hi", content="hi")
    steps, outcome = run_direct_call(call, (0, 0), done, wins=False)
    assert kinds(steps) == ["Transaction", "BlockingCall", "BLPOP", "GET", "DEL"] and outcome is done
    dispatch = steps[1].call
    assert dispatch.func.__name__ == "dispatch_call"
    request = dispatch.args[2]
    assert request.deadline_at == 105.0 and request.reply_key == keys.reply(request.call_id)
    assert steps[2].args == ("BLPOP", request.reply_key, 1.0)  # one capped step of the wait
    assert steps[3].args == ("GET", keys.outcome(request.call_id)) and steps[4].args == (
        "DEL",
        request.reply_key,
    )


def test_a_direct_call_that_times_out_writes_the_synthetic_outcome_and_revokes() -> None:
    call = build_direct_call("echo", {"text": "hi"}, timeout_s=1.0)
    steps, outcome = run_direct_call(call, (0, 0, 2.0), None, wins=True)
    assert kinds(steps) == [
        "Transaction",
        "BlockingCall",
        "BLPOP",
        "GET",
        "ScriptCall",
        "BlockingCall",
        "GET",
        "DEL",
    ]
    revoke = steps[5].call
    assert (
        revoke.func.__name__ == "revoke_call"
        and revoke.args[1] == "task-1"
        and revoke.keywords == {"terminate": True}
    )
    assert outcome.failure_kind is FailureKind.TIMEOUT and outcome.synthetic


def test_a_late_real_outcome_beats_the_synthetic_one_and_nothing_is_revoked() -> None:
    call = build_direct_call("echo", {"text": "hi"}, timeout_s=1.0)
    steps, outcome = run_direct_call(call, (0, 0, 2.0), None, wins=False)
    assert kinds(steps) == ["Transaction", "BlockingCall", "BLPOP", "GET", "ScriptCall", "GET", "DEL"]
    assert outcome.ok and not outcome.synthetic


# --- one signature for both clients ----------------------------------------------------------------------


def test_both_clients_take_the_builders_signature() -> None:
    built = list(inspect.signature(build_submission).parameters)
    for method in (Client.submit, AsyncClient.submit):
        assert list(inspect.signature(method).parameters) == ["self", *built]
        assert method.__name__ == "submit" and method.__doc__
    assert inspect.iscoroutinefunction(AsyncClient.submit) and not inspect.iscoroutinefunction(Client.submit)
    call_parameters = ["self", "name", "arguments", "timeout_s", "context", "approve", "tenant"]
    assert list(inspect.signature(Client.call_tool).parameters) == call_parameters
    assert inspect.signature(AsyncClient.call_tool).return_annotation == "ToolOutcome"


class Probe:
    """Just enough of a client for the decorated `submit` methods: it records what they hand on."""

    def __init__(self) -> None:
        self.seen: list[tuple[str | None, str | None]] = []

    def submit_request(self, request: TurnRequest, *, turn_id: str | None) -> str:
        self.seen.append((request.prompt, turn_id))
        return "turn_1"


def test_submit_takes_positional_arguments_and_checks_them_when_called_or_awaited() -> None:
    submission = build_submission("hi", None, ["add"], "scripted:demo", {"max_llm_calls": 2}, turn_id="t")
    assert submission.turn_id == "t" and submission.request.tools == ["add"]
    assert submission.request.limits.max_llm_calls == 2
    probe = Probe()
    assert Client.submit(probe, "hello", turn_id="t1") == "turn_1"  # type: ignore[arg-type]
    assert probe.seen == [("hello", "t1")]
    with pytest.raises(ValueError, match="list of tool names"):
        Client.submit(probe, "hi", tools="add")  # type: ignore[arg-type]
    pending = AsyncClient.submit(probe, prompt="")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prompt"):  # raised where it is awaited, as by any coroutine
        asyncio.run(pending)
