"""The table of store operations (pure): the words, KEYS and ARGV each builds, and the typed replies.

Also the rule that a script spells no constant: caps, limits and statuses come in as ARGV from Python.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from orchestrator.errors import UnknownTurnError
from orchestrator.model import TurnOutcome, TurnRequest, TurnStatus, UserMessage
from orchestrator.store import codec, operations
from orchestrator.store.codec import CLAIM_AGAIN, ClaimedTurn
from orchestrator.store.effects import RedisCommand, ScriptCall, Transaction
from orchestrator.store.scripts import (
    CLAIM,
    CONTROL,
    SAVE_STEP,
    SUBMIT,
    ControlResult,
    FinishResult,
    SaveResult,
    SubmitResult,
    TakeOverResult,
)
from orchestrator.tenant_limits import RunningCaps
from workers import keys, scripts
from workers.contract import ToolOutcome

pytestmark = pytest.mark.timeout(10)

TERMINAL = "completed stopped failed cancelled"


def lua_files() -> list[tuple[str, str]]:
    found = []
    for package in ("orchestrator.store", "workers"):
        for entry in resources.files(package).joinpath("lua").iterdir():
            if entry.name.endswith(".lua"):
                found.append((f"{package}:{entry.name}", entry.read_text(encoding="utf-8")))
    return sorted(found)


def test_every_script_is_a_lua_file_loaded_once() -> None:
    names = [name for name, _ in lua_files()]
    assert len(names) == 31, names
    assert SUBMIT.source == resources.files("orchestrator.store").joinpath("lua/submit.lua").read_text()


@pytest.mark.parametrize(("name", "source"), lua_files())
def test_no_script_spells_a_constant_python_owns(name: str, source: str) -> None:
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("--"))
    spelled = [str(keys.INBOX_MAXLEN), str(keys.EVENTS_MAXLEN), str(keys.INBOX_OUTCOME_MAX_BYTES)]
    spelled += [f"'{status.value}'" for status in TurnStatus] + ["'turn_queued'", "'turn_finished'"]
    assert [word for word in spelled if word in code] == [], name


def test_submit_queues_with_the_status_event_and_cap_from_python() -> None:
    request = TurnRequest(prompt="hi", conversation_id="conv")
    op = operations.submit(request, "turn_1", 12.5)
    assert isinstance(op, ScriptCall) and op.script is SUBMIT
    queue_keys = (keys.TURN_QUEUE, keys.conversation_lock("conv"), keys.conversation_waiting("conv"))
    assert op.keys[4:7] == queue_keys
    assert op.keys[7] == keys.TURNS_RECENT and op.args[7] == str(keys.RECENT_TURNS_MAX)
    assert op.keys[8:] == (keys.lane_tenants("normal"), keys.TURNS_READY)
    assert op.args[8:] == ("default", str(keys.READY_TOKENS_MAX))
    assert op.args[0] == "turn_1" and op.args[2] == "12.5"
    assert json.loads(op.args[3]) == {"turn_id": "turn_1", "conversation_id": "conv", "model": None}
    assert op.args[4:7] == (str(keys.EVENTS_MAXLEN), "queued", "turn_queued")
    assert [op.parse(n) for n in (0, 1, b"2")] == list(SubmitResult)
    without = operations.submit(TurnRequest(prompt="hi"), "turn_2", 1.0)
    assert without.keys[5:7] == ("", "")


def test_claim_and_take_over_get_the_statuses_as_arguments() -> None:
    caps = RunningCaps({"acme": 2, "default": 0}, 3)
    claim = operations.claim("orch", 1500, caps)
    assert claim.script is CLAIM
    lanes = tuple(keys.lane_tenants(lane) for lane in ("interactive", "normal", "batch"))
    assert claim.keys == (keys.TURN_QUEUE, keys.TURNS_PARKED, *lanes, keys.TURNS_READY)
    assert claim.args[:5] == ("orch", "1500", "queued", "running", TERMINAL)
    assert claim.args[13:] == (
        "interactive normal batch",
        "toolloop:turns:queue:",
        "toolloop:tenant:",
        ":running",
        "acme 2 default 0",
        "3",
        str(operations.CLAIM_SKIP_BUDGET),
    )
    assert claim.parse(0) is None and claim.parse(2) is CLAIM_AGAIN
    request = TurnRequest(prompt="p").model_dump_json().encode()
    claimed = claim.parse([1, b"turn_1", request, 1])
    assert isinstance(claimed, ClaimedTurn) and claimed.turn_id == "turn_1" and claimed.has_state
    assert claimed.request == TurnRequest(prompt="p")
    assert claim.parse([1, "turn_1", False, 0]) == ClaimedTurn("turn_1", None, False)
    take = operations.take_over("orch", "turn_1", 9000)
    assert take.args == ("turn_1", "orch", "9000", "queued", "running", TERMINAL, "")
    assert take.parse(b"1") is TakeOverResult.TAKEN


def test_a_claimer_waits_on_the_ready_tokens_for_fractional_seconds() -> None:
    op = operations.wait_ready(0.25)
    assert op.args == ("BLPOP", keys.TURNS_READY, "0.250")
    assert op.parse(None) is False and op.parse([b"k", b"1"]) is True


def test_renew_leases_reads_back_the_ids_it_lost() -> None:
    op = operations.renew_leases("orch", ["a", "b", "c"], 30_000)
    assert op.keys == tuple(keys.turn_lease(t) for t in "abc") and op.args == ("orch", "30000")
    assert op.parse([1, 3]) == {"a", "c"} and op.parse([]) == set()


def test_release_uses_the_workers_script_and_refuses_an_empty_holder() -> None:
    op = operations.release("orch", "turn_1")
    assert op.script is scripts.RELEASE and op.keys == (keys.turn_lease("turn_1"),)
    assert op.parse(1) is scripts.ReleaseResult.RELEASED
    with pytest.raises(ValueError, match="orchestrator_id"):
        operations.release("", "turn_1")


def test_find_orphans_builds_key_names_from_the_key_module() -> None:
    op = operations.find_orphans(5)
    status_prefix, status_suffix = keys.turn_status("X").split("X")
    assert op.args == ("5", status_prefix, status_suffix, *keys.turn_lease("X").split("X"), "running waiting")
    assert op.parse([b"t1", "t2"]) == ["t1", "t2"]


def test_save_step_carries_the_events_but_never_turn_finished() -> None:
    events = [("round_completed", {"api_key": "k"}), ("turn_finished", {}), ("model_called", {"n": 1})]
    op = operations.save_step("t", "{}", TurnStatus.WAITING, events, orchestrator_id=None, now=3.0)
    assert op.script is SAVE_STEP and op.keys[3] == keys.turn_events("t")
    assert op.args[:5] == ("{}", "waiting", "", str(keys.EVENTS_MAXLEN), TERMINAL)
    # Nothing appended: no list, the audit TTL, expected lengths and counts of 0, lists that may carry a TTL
    # (not said to be kept), then the events: how many, and the fields of the one entry that holds them.
    assert op.keys[4:] == ("", "") and op.args[5:11] == (str(keys.AUDIT_TTL_S), "0", "0", "0", "0", "1")
    assert (
        op.args[11] == "2"
        and op.args[12:16:2] == ("name", "at")
        and op.args[13:17:2] == ("round_completed", "3.0")
    )
    assert json.loads(op.args[17]) == {"api_key": "***"}
    assert op.args[18] == "more" and json.loads(op.args[19]) == [["model_called", {"n": 1}]]
    assert [op.parse(n) for n in (-2, -1, 0, 1)] == list(SaveResult)


def test_save_outcome_passes_ttl_caps_statuses_and_the_event_name() -> None:
    outcome = TurnOutcome(turn_id="t", status="completed", text="ok")
    op = operations.save_outcome("t", outcome, None, 7.0)
    assert op.keys[8:] == ("", "", "", keys.turn_history("t"), keys.turn_log("t"), "", keys.TURNS_READY)
    assert op.args[3] == str(keys.TURN_TTL_S)
    assert op.args[11] == ""  # no owner's lease to release
    owned = operations.save_outcome("t", outcome, None, 7.0, orchestrator_id="orch-a")
    assert (owned.keys[13], owned.args[11]) == (keys.turn_lease("t"), "orch-a")
    assert op.args[12:] == (
        "toolloop:tenant:",
        ":running",
        "toolloop:turns:queue:",
        "toolloop:turns:lane:",
        str(keys.READY_TOKENS_MAX),
        "toolloop:turn:",
        ":request",
        "",  # the tenant, read from the request by the script when the caller does not know it
    )
    assert operations.save_outcome("t", outcome, None, 7.0, tenant="acme").args[19] == "acme"
    assert op.args[5:9] == (str(keys.EVENTS_MAXLEN), "7.0", TERMINAL, "turn_finished")
    assert op.args[9] == str(keys.CONVERSATION_TTL_S)
    assert json.loads(op.args[4])["status"] == "completed"
    assert op.parse(0) is FinishResult.ALREADY_TERMINAL
    in_conversation = operations.save_outcome("t", outcome, "c", 7.0).keys
    assert (in_conversation[8], in_conversation[11]) == (
        keys.conversation_head("c"),
        keys.conversation_history("c"),
    )


def test_control_needs_a_call_id_for_an_approval_and_caps_the_inbox() -> None:
    op = operations.control("t", "approval", "call_1", False, 2.0)
    assert op.script is CONTROL
    assert op.args == (
        keys.INBOX_PREFIX,
        "t",
        "approval",
        "call_1",
        "0",
        "2.0",
        str(keys.INBOX_MAXLEN),
        TERMINAL,
        "",
        "",
        "",
        "",
        str(keys.READY_TOKENS_MAX),
    )
    # A parked turn is woken, with a ready token.
    assert op.keys[3:] == (keys.TURNS_PARKED, keys.TURN_QUEUE, keys.TURNS_READY)
    assert [op.parse(n) for n in (-1, 0, 1, 2)] == list(ControlResult)
    assert operations.control("t", "cancel", None, None, 2.0).args[3:5] == ("", "")
    edited = operations.control(
        "t", "approval", "c", True, 2.0, arguments={"to": "bob"}, reason="why", decided_by="ana"
    )
    assert edited.args[8:12] == ('{"to":"bob"}', "why", "ana", "")
    answered = operations.control("t", "client_result", "c", None, 2.0, reason="failed", result=None)
    assert (answered.args[2], answered.args[9], answered.args[11]) == ("client_result", "failed", "")
    assert operations.control("t", "client_result", "c", None, 2.0, result="[1]").args[11] == "[1]"
    with pytest.raises(ValueError, match="arguments"):
        operations.control("t", "approval", "c", True, 2.0, arguments={"x": float("nan")})
    with pytest.raises(ValueError, match="call_id"):
        operations.control("t", "approval", "", True, 2.0)


def test_write_outcome_is_the_workers_script_with_both_limits_as_arguments() -> None:
    outcome = ToolOutcome(call_id="c", tool="add", turn_id="t", ok=True, result=1, content="1")
    op = operations.write_outcome(outcome)
    assert op.script is scripts.WRITE_OUTCOME
    assert op.keys == (keys.outcome("c"), keys.late_outcomes("c"), keys.turn_lease("t"), "")
    assert op.args[5:7] == (str(keys.INBOX_MAXLEN), str(keys.INBOX_OUTCOME_MAX_BYTES))
    # No fence (attempt 0, any holder); a late outcome is kept for the audit TTL, the outcome for its own.
    assert (op.args[1], op.args[7:]) == (str(keys.OUTCOME_TTL_S), ("0", "", str(keys.AUDIT_TTL_S)))
    assert operations.write_outcome(outcome, keys.Retention(outcome_ttl_s=5, audit_ttl_s=9)).args[1::8] == (
        "5",
        "9",
    )
    assert op.parse(1) == (scripts.WriteResult.WON, None) and op.parse(0) == (scripts.WriteResult.LOST, None)


def test_reads_parse_both_reply_shapes_and_both_encodings() -> None:
    blocking = operations.read_events("t", "5-0", 100, 10)
    assert blocking.args == ("XREAD", "COUNT", 10, "BLOCK", 100, "STREAMS", keys.turn_events("t"), "5-0")
    assert operations.read_events("t", "0").args == ("XREAD", "STREAMS", keys.turn_events("t"), "0")
    entry = (b"6-0", {b"name": b"x", b"at": b"1.5", b"data": b"{}"})
    resp2 = [[keys.turn_events("t"), [entry]]]
    resp3 = {keys.turn_events("t"): [[entry]]}
    for reply in (resp2, resp3):
        [event] = blocking.parse(reply)
        assert (event.id, event.name, event.at, event.turn_id) == ("6-0", "x", 1.5, "t")
    assert blocking.parse(None) == []


def test_views_and_outcomes() -> None:
    request = TurnRequest(prompt="p").model_dump_json()
    view = operations.get_view("t")
    assert view.script.name == "read_history" and view.args == ("4", "3")
    assert view.parse([request, "queued", None, None, [], []]).status == "queued"
    assert view.parse([None, None, None, None, [], []]) is None
    with pytest.raises(UnknownTurnError):
        operations.require_view("t").parse([None, None, None, None, [], []])
    outcome = ToolOutcome(call_id="c", tool="add", ok=True, result=1, content="1")
    read = operations.read_outcomes(dict.fromkeys(["c", "d"]))
    assert isinstance(read, RedisCommand)  # one MGET on one Redis
    assert read.args == ("MGET", keys.outcome("c"), keys.outcome("d"))
    assert read.parse([outcome.model_dump_json(), None]) == {"c": outcome}


def test_registry_and_inbox_commands() -> None:
    assert operations.heartbeat("o", 4.5).args == ("ZADD", keys.ORCHESTRATORS, 4.5, "o")
    unregister = operations.unregister("o")
    assert isinstance(unregister, Transaction)
    assert unregister.commands == (("ZREM", keys.ORCHESTRATORS, "o"), ("DEL", keys.inbox("o")))
    assert operations.ack_inbox("o", "7-3").args == ("XTRIM", keys.inbox("o"), "MINID", "~", "7-4")
    inbox = operations.read_inbox("o", "$", 50, 1000)
    assert inbox.parse([["s", [("1-0", {b"kind": b"outcome"})]]]) == [("1-0", {"kind": "outcome"})]
    assert isinstance(operations.ping(), RedisCommand) and operations.ping().parse(True) is True


def test_worker_script_replies_are_typed() -> None:
    assert scripts.parse_start_reply([0, 3]) == (3, 0)
    assert scripts.parse_start_reply([-1, 0]) == (scripts.StartResult.FINISHED, 0)
    assert scripts.parse_start_reply([-2, 1200]) == (scripts.StartResult.HELD, 1200)
    assert scripts.parse_idempotency_claim([1, b'{"r": 1}']) == (scripts.IdempotencyClaim.STORED, '{"r": 1}')
    assert scripts.parse_idempotency_claim([2, b"300"]) == (scripts.IdempotencyClaim.BUSY, None)
    assert scripts.parse_idempotency_claim([0, b""]) == (scripts.IdempotencyClaim.CLAIMED, None)


def test_a_stored_request_leaves_out_its_defaults_and_reads_back_the_same() -> None:
    request = TurnRequest(prompt="hi", messages=[UserMessage(content="before")], model="scripted:demo")
    stored = json.loads(codec.dump_request(request))
    # What an orchestrator of the previous release reads: no field it does not know (stream, instructions…).
    assert stored == {
        "prompt": "hi",
        "messages": [{"role": "user", "content": "before"}],
        "model": "scripted:demo",
    }
    assert codec.parse_request(codec.dump_request(request)) == request
    assert codec.parse_request(codec.dump_request(TurnRequest(prompt="x", stream=False))) == TurnRequest(
        prompt="x", stream=False
    )
