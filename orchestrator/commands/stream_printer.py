"""`toolloop submit --stream`: the answer printed as the model writes it, what the tools do on stderr.

stdout holds only the answer's text (so `toolloop submit --stream … > answer.txt` keeps just that): each model
call's `text_delta`s as they come, a line break between two calls that both wrote. stderr tells the rest in
short lines: the turn id first, tool calls as the model starts them, their progress and outcomes, a call that
waits for a person (with the command that answers it), a model call started again (a terminal cannot take
back what it printed; the line says what to disregard), an answer that does not fit the output schema (the
next answer follows it), and how the turn ended.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TextIO

from orchestrator.model import TurnOutcome
from orchestrator.store.turn_stream import (
    CallWaitingEvent,
    ModelStreamResetEvent,
    OtherEvent,
    StreamEvent,
    TextDeltaEvent,
    ToolCallStartedEvent,
    ToolFinishedEvent,
    ToolProgressEvent,
    TurnFinishedEvent,
)


@dataclass
class StreamPrinter:
    """Prints one turn's typed events; `outcome` once its `TurnFinishedEvent` came."""

    out: TextIO = sys.stdout
    err: TextIO = sys.stderr
    outcome: TurnOutcome | None = None
    _writing: int | None = None  # the model call whose text the current line of `out` holds
    _wrote: bool = False

    def follow(self, events: Iterable[StreamEvent]) -> TurnOutcome | None:
        """Print every event; the outcome (None when the stream ended without one: the turn expired)."""
        for event in events:
            self.show(event)
        self.end_line()
        return self.outcome

    def show(self, event: StreamEvent) -> None:
        """Print one event where it belongs."""
        match event:
            case TextDeltaEvent(llm_call=llm_call, text=text):
                if self._writing != llm_call and self._wrote:
                    self.out.write("\n")
                self._writing, self._wrote = llm_call, True
                self.out.write(text)
                self.out.flush()
            case ToolCallStartedEvent(tool=tool):
                self._note(f"→ {tool}")
            case ToolProgressEvent(tool=tool, message=message, fraction=fraction):
                share = f" {fraction:.0%}" if fraction is not None else ""
                self._note(f"  {tool}{share} {message}")
            case CallWaitingEvent(
                turn_id=turn_id,
                call_id=call_id,
                tool=tool,
                wait_deadline=deadline,
                waiting_for="client_result",
            ):
                left = max(deadline - event.at, 0.0)
                self._note(
                    f"⏸ {tool} waits for your result ({build_duration(left)} left): "
                    + build_answer_command(turn_id, call_id, "client_result")
                )
            case CallWaitingEvent(turn_id=turn_id, call_id=call_id, tool=tool, wait_deadline=deadline):
                left = max(deadline - event.at, 0.0)
                self._note(
                    f"⏸ {tool} waits for a person's approval ({build_duration(left)} left): "
                    + build_answer_command(turn_id, call_id, "approval")
                )
            case ToolFinishedEvent(tool=tool, ok=ok, failure_kind=kind, error=error):
                self._note(f"✓ {tool}" if ok else f"✗ {tool} ({kind}){f': {error}' if error else ''}")
            case ModelStreamResetEvent(llm_call=llm_call):
                if self._writing == llm_call:
                    self.end_line()
                    self._writing = None
                    self._note(f"(model call {llm_call + 1} starts again: disregard its text above)")
            case OtherEvent(name="output_invalid", data=data):
                # The answer above broke the output schema: say so, and whether the model tries again.
                again = "the model is asked again" if data.get("retrying") else "no retries left"
                self._note(f"(the answer above does not fit the output schema: {again})")
            case TurnFinishedEvent(outcome=outcome):
                self.outcome = outcome
            case _:
                pass

    def _note(self, line: str) -> None:
        self.end_line()
        self.err.write(line + "\n")
        self.err.flush()

    def end_line(self) -> None:
        """End the answer's line on stdout, if one is open (also when the stream stops before its end)."""
        if self._writing is not None and self._wrote:
            self.out.write("\n")
            self.out.flush()
        self._writing, self._wrote = None, False


def build_answer_command(turn_id: str, call_id: str, waiting_for: str) -> str:
    """The command that answers a waiting call: `toolloop result` for a client-side tool's, else `approve`."""
    if waiting_for == "client_result":
        return f"toolloop result {turn_id} {call_id} (--result JSON | --error MSG)"
    return f"toolloop approve {turn_id} {call_id} [--deny]"


def build_duration(seconds: float) -> str:
    """A span of time (a wait, what is left of one) in the unit a person reads at a glance."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"
