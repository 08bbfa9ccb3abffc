"""`toolloop submit --stream`'s printer: stdout holds the answers as written, stderr says what they were.

An answer that breaks the output schema has been printed already when the machine finds it out; the printer
says so on stderr, so a person reading the terminal knows the next answer replaces it.
"""

from __future__ import annotations

import io

from orchestrator.commands.stream_printer import StreamPrinter
from orchestrator.machine.tool_round import ERROR_LINE_MAX, build_error_line
from orchestrator.model import TurnOutcome
from orchestrator.store.turn_stream import (
    OtherEvent,
    StreamEvent,
    TextDeltaEvent,
    ToolFinishedEvent,
    TurnFinishedEvent,
)
from workers.contract import FailureKind, ToolOutcome


def text(llm_call: int, piece: str) -> TextDeltaEvent:
    return TextDeltaEvent(id="1-0", turn_id="t", at=1.0, llm_call=llm_call, text=piece)


def invalid(retrying: bool) -> OtherEvent:
    data = {"llm_call_index": 0, "errors": ["'summary' is a required property"], "retrying": retrying}
    return OtherEvent(id="2-0", turn_id="t", at=1.0, name="output_invalid", data=data)


def test_an_answer_breaking_the_schema_is_marked_on_stderr_before_the_next_one() -> None:
    out, err = io.StringIO(), io.StringIO()
    outcome = TurnOutcome(turn_id="t", status="completed", text='{"summary": "x"}')
    events: list[StreamEvent] = [
        text(0, '{"summmary": '),
        text(0, "1}"),
        invalid(retrying=True),
        text(1, '{"summary": "x"}'),
        TurnFinishedEvent(id="3-0", turn_id="t", at=2.0, outcome=outcome),
    ]
    assert StreamPrinter(out=out, err=err).follow(events) == outcome
    assert out.getvalue() == '{"summmary": 1}\n{"summary": "x"}\n'
    assert err.getvalue() == "(the answer above does not fit the output schema: the model is asked again)\n"


def test_the_last_answer_that_does_not_fit_says_no_retries_are_left() -> None:
    err = io.StringIO()
    StreamPrinter(out=io.StringIO(), err=err).follow([text(0, "prose"), invalid(retrying=False)])
    assert "no retries left" in err.getvalue()


def test_a_failed_call_is_shown_with_the_first_line_of_its_error() -> None:
    err = io.StringIO()
    finished = [
        ToolFinishedEvent(id="4-0", turn_id="t", at=1.0, call_id="c1", tool="add", ok=True),
        ToolFinishedEvent(
            id="5-0",
            turn_id="t",
            at=1.0,
            call_id="c2",
            tool="explode",
            ok=False,
            failure_kind="execution_error",
            error="RuntimeError: boom",
        ),
        # Written by a release whose events carried no error.
        ToolFinishedEvent(
            id="6-0", turn_id="t", at=1.0, call_id="c3", tool="old", ok=False, failure_kind="timeout"
        ),
    ]
    StreamPrinter(out=io.StringIO(), err=err).follow(finished)
    assert err.getvalue().splitlines() == [
        "✓ add",
        "✗ explode (execution_error): RuntimeError: boom",
        "✗ old (timeout)",
    ]


def test_the_error_line_is_the_first_line_cut_short() -> None:
    failed = ToolOutcome(
        call_id="c",
        tool="t",
        ok=False,
        content="Error: Traceback: x",
        error="Traceback: x\n  more",
        failure_kind=FailureKind.EXECUTION_ERROR,
    )
    assert build_error_line(failed) == "Traceback: x"
    long = failed.model_copy(update={"error": "y" * 500})
    assert len(line := build_error_line(long) or "") == ERROR_LINE_MAX and line.endswith("…")
    assert build_error_line(ToolOutcome(call_id="c", tool="t", ok=True, result=1, content="1")) is None
