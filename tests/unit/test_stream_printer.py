"""`toolloop submit --stream`'s printer: stdout holds the answers as written, stderr says what they were.

An answer that breaks the output schema has been printed already when the machine finds it out; the printer
says so on stderr, so a person reading the terminal knows the next answer replaces it.
"""

from __future__ import annotations

import io

from orchestrator.commands.stream_printer import StreamPrinter
from orchestrator.model import TurnOutcome
from orchestrator.store.turn_stream import OtherEvent, StreamEvent, TextDeltaEvent, TurnFinishedEvent


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
