"""What `toolloop demo` prints: the turn's events as they come (the answer as the model writes it), then its
transcript, the usage per model call, the outcome, and where to look next."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from orchestrator.model import AssistantMessage, Message, SystemMessage, ToolMessage, TurnOutcome, UserMessage

_EVENT_LINES: dict[str, Callable[[dict[str, Any]], str]] = {
    "turn_started": lambda e: f"turn started on {e.get('model')}",
    "model_called": lambda e: f"model call #{int(e.get('llm_call_index', 0)) + 1}",
    "model_responded": lambda e: f"model answered: {e.get('type')} in {e.get('duration_ms', 0):.0f} ms",
    "model_failed": lambda e: f"[red]model failed[/red]: {e.get('message')}",
    "model_stream_reset": lambda e: (
        f"[yellow]model call #{int(e.get('llm_call', 0)) + 1} starts again[/yellow]"
    ),
    "tool_dispatched": lambda e: f"→ {e.get('tool')}({_args(e.get('arguments'))}) sent to the workers",
    "tool_started": lambda e: f"  {e.get('tool')} started on {e.get('worker')}",
    "tool_progress": lambda e: f"  {e.get('tool')}: {e.get('message')}",
    "tool_finished": lambda e: (
        f"← {e.get('tool')} {'ok' if e.get('ok') else e.get('failure_kind')}"
        f" in {e.get('duration_ms', 0):.0f} ms"
    ),
    "turn_finished": lambda e: f"turn {e.get('status')}",
}


@dataclass
class EventPrinter:
    """Prints each event on its line, timed from the first; the text of `text_delta`s as it is written."""

    out: Console
    _t0: float | None = None
    _writing: bool = False

    def show(self, event: dict[str, Any]) -> None:
        """Print one event (`name`, `at` and its data, flat)."""
        if self._t0 is None:
            self._t0 = event["at"]
        if event["name"] == "text_delta":
            if not self._writing:
                self.out.print(f"[dim]{event['at'] - self._t0:6.2f} s[/dim]  [green]▌[/green]", end="")
                self._writing = True
            self.out.print(str(event.get("text", "")), end="", markup=False, highlight=False)
            return
        render = _EVENT_LINES.get(event["name"])
        if render is None:
            return
        if self._writing:
            self.out.print()
            self._writing = False
        self.out.print(f"[dim]{event['at'] - self._t0:6.2f} s[/dim]  {render(event)}")


def _args(arguments: object) -> str:
    if not isinstance(arguments, dict):
        return ""
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())


def print_transcript(out: Console, outcome: TurnOutcome, events: list[dict[str, Any]]) -> None:
    """Each message of the turn as a panel, tool results with their duration."""
    durations = {e.get("call_id"): e.get("duration_ms", 0.0) for e in events if e["name"] == "tool_finished"}
    out.print()
    for message in outcome.messages:
        out.print(_render_message(message, durations))


def _render_message(message: Message, durations: Mapping[object, float]) -> Panel:
    if isinstance(message, UserMessage | SystemMessage):
        return Panel(message.content, title=message.role, title_align="left", border_style="cyan")
    if isinstance(message, AssistantMessage):
        lines = [message.content] if message.content else []
        lines += [
            f"calls [bold]{c.name}[/bold]({_args(c.arguments)})  [dim]{c.id}[/dim]"
            for c in message.tool_calls
        ]
        return Panel(
            "\n".join(lines) or "(empty)", title="assistant", title_align="left", border_style="green"
        )
    assert isinstance(message, ToolMessage)
    style = "red" if message.is_error else "magenta"
    kind = f" · {message.failure_kind.value}" if message.failure_kind else ""
    took = durations.get(message.tool_call_id)
    timing = f" · {took:.1f} ms" if took is not None else ""
    title = f"tool {message.name}{kind}{timing}{' · synthetic' if message.synthetic else ''}"
    return Panel(message.content, title=title, title_align="left", border_style=style)


def print_summary(
    out: Console,
    outcome: TurnOutcome,
    turn_id: str,
    redis_url: str,
    *,
    keep_running: bool,
    flower_installed: bool,
) -> None:
    """The usage table, the outcome without its messages, and the commands to look further."""
    table = Table(title="usage per model call", title_justify="left")
    for column in ("#", "model", "input", "output", "total", "ms"):
        table.add_column(column)
    for index, record in enumerate(outcome.llm_call_records, start=1):
        u = record.usage
        table.add_row(
            str(index),
            str(record.model),
            str(u.input_tokens),
            str(u.output_tokens),
            str(u.total_tokens),
            f"{record.duration_ms:.0f}",
        )
    out.print(table)
    summary = outcome.model_dump(mode="json", exclude={"messages", "llm_call_records"})
    out.print(Panel(json.dumps(summary, indent=2, ensure_ascii=False), title="outcome", title_align="left"))
    out.print(
        build_next_steps(turn_id, redis_url, keep_running=keep_running, flower_installed=flower_installed)
    )


def build_next_steps(turn_id: str, redis_url: str, *, keep_running: bool, flower_installed: bool) -> str:
    """ "Where to look next": what to run, as it stands after this demo (still running or stopped, Flower
    installed or not)."""
    show = f"  • the whole turn as JSON:   TOOLLOOP_REDIS_URL={redis_url} toolloop show {turn_id}\n"
    if keep_running:
        lines = [show, "  • the turn page:            the page printed above, until Ctrl-C\n"]
    else:
        lines = [
            show,
            "    (the demo's embedded Redis stops with it: set TOOLLOOP_REDIS_URL to a Redis you keep)\n",
            "  • the turn page, live:      toolloop demo --keep-running, then open the page it prints\n",
        ]
    flower = f"  • tool tasks in Flower:     TOOLLOOP_REDIS_URL={redis_url} toolloop flower --port=5555\n"
    if not flower_installed:
        flower += "    (Flower comes with the ops extra: `toolloop flower` says what to install)\n"
    lines += [flower, "  • your own turn, streamed:  toolloop submit --prompt '…' --stream"]
    return "[bold]Where to look next[/bold]\n" + "".join(lines)
