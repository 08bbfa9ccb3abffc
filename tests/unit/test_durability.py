"""The pure parts of the durability watch (issue 12, item 7): what a lost turn's record says, how a loss is
told, and `toolloop redis`'s command line."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.model import AssistantMessage, ToolMessage, TurnOutcome, UserMessage
from orchestrator.redis_server import RedisServer, describe_persistence
from orchestrator.runtime.durability import (
    build_id_list,
    build_lost_record,
    build_lost_request,
    build_watch_interval,
)
from orchestrator.runtime.inbox import build_wire_call_id
from orchestrator.store import losses
from orchestrator.store.losses import RedisLoss
from tests.unit.machine.harness import Driver, calls, ok
from workers.contract import FailureKind

LOSS = RedisLoss(
    detected_at=1_750_000_000.0,
    old_run_id="a" * 40,
    new_run_id="b" * 40,
    kind="empty",
    detected_by="orch-1",
)


def _mid_round() -> Driver:
    driver = Driver(
        tools=["add", "fetch"], prior_history=[UserMessage(content="earlier"), AssistantMessage(content="hi")]
    )
    driver.respond(calls(("add", {"a": 1, "b": 2}), ("fetch", {})))
    driver.finish(ok("call_0", "add", "3"))  # the machine sees local call ids
    return driver


def test_a_lost_turn_mid_round_closes_its_round_and_answers_the_rest_as_lost() -> None:
    state = _mid_round().state
    assert state.current is not None and state.current.calls[0].outcome is not None
    record = build_lost_record(state, "conv-1", "turn lost: Redis came back empty", at=2000.0)

    outcome = record.outcome
    assert outcome.status == "failed" and losses.is_lost_outcome(outcome)
    assert outcome.error is not None and outcome.error.message == "turn lost: Redis came back empty"
    assistant = outcome.messages[-3]
    assert isinstance(assistant, AssistantMessage) and [c.id for c in assistant.tool_calls] == [
        "call_0",
        "call_1",
    ]
    answered, lost = outcome.messages[-2:]
    assert isinstance(answered, ToolMessage) and answered.content == "3" and not answered.is_error
    assert isinstance(lost, ToolMessage) and lost.is_error and lost.synthetic
    assert "not answered" in lost.content and lost.failure_kind is FailureKind.CANCELLED
    # Every call of the transcript is answered exactly once.
    asked = [c.id for m in outcome.messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    answers = Counter(m.tool_call_id for m in outcome.messages if isinstance(m, ToolMessage))
    assert sorted(answers) == sorted(asked) and set(answers.values()) == {1}
    # The unanswered call's outcome is written under its wire id, so a worker holding its message skips it.
    (written,) = record.call_outcomes
    assert written.call_id == build_wire_call_id("turn1", "call_1") and written.turn_id == "turn1"
    assert written.synthetic and not written.ok and written.tool == "fetch"


def test_a_lost_turn_between_rounds_keeps_its_history_and_writes_no_call_outcome() -> None:
    driver = Driver()
    record = build_lost_record(driver.state, None, "lost", at=2000.0)
    assert record.outcome.messages == list(driver.state.history)
    assert record.call_outcomes == []
    assert record.request.conversation_id is None


def test_the_request_of_a_lost_turn_is_rebuilt_up_to_its_last_user_message() -> None:
    driver = _mid_round()
    request = build_lost_request(driver.state, "conv-1")
    assert [type(m).__name__ for m in request.messages] == ["UserMessage", "AssistantMessage", "UserMessage"]
    last = request.messages[-1]
    assert isinstance(last, UserMessage) and last.content == "do it"
    assert request.tools == ["add", "fetch"] and request.model == "openai:m"
    assert request.conversation_id == "conv-1"


def test_the_watch_reads_the_run_id_several_times_per_lease_period() -> None:
    assert build_watch_interval(15.0) == 1.0
    assert build_watch_interval(3.0) == 0.5


def test_the_loss_line_names_every_id_up_to_a_limit() -> None:
    assert build_id_list(["a", "b"]) == "a, b"
    assert build_id_list(["a", "b", "c"], limit=2) == "a, b and 1 more"


def test_show_of_an_unknown_turn_names_the_losses_redis_had() -> None:
    assert (
        losses.build_unknown_turn_message("unknown turn 'x'", [])
        == "unknown turn 'x' (never submitted, or expired)"
    )
    message = losses.build_unknown_turn_message("unknown turn 'x'", [LOSS])
    assert "lost with Redis's data" in message and "without its data" in message
    assert "2025-06-15 15:06:40 UTC" in message and "aaaaaaaaaaaa -> bbbbbbbbbbbb" in message


def test_loss_notes_parse_from_either_client_and_skip_what_they_cannot_read() -> None:
    later = LOSS.model_copy(update={"detected_at": LOSS.detected_at + 60, "new_run_id": "c" * 40})
    raw = {b"c": later.model_dump_json().encode(), b"b": LOSS.model_dump_json().encode(), b"x": b"{not json"}
    parsed = losses.read_losses().parse(raw)
    assert parsed == [LOSS, later]


def test_only_the_record_of_a_lost_turn_reads_as_lost() -> None:
    assert not losses.is_lost_outcome(None)
    assert not losses.is_lost_outcome(TurnOutcome(turn_id="t", status="failed"))


def test_embedded_redis_appends_with_fsync_every_second_and_never_evicts(tmp_path: Path) -> None:
    persistent = RedisServer(port=1, appendonly=True, data_dir=tmp_path, executable="redis-server")
    command = persistent.build_command()
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert str(tmp_path) in describe_persistence(persistent)
    volatile = RedisServer(port=1, data_dir=tmp_path, executable="redis-server")
    assert "--appendfsync" not in volatile.build_command()
    assert "no persistence" in describe_persistence(volatile)


def test_toolloop_redis_refuses_an_unknown_fsync_policy() -> None:
    result = CliRunner().invoke(app, ["redis", "--appendfsync", "sometimes"])
    assert result.exit_code == 2
    assert "--appendfsync must be everysec, always or no" in result.output
