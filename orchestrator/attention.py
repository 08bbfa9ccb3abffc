"""The attention hook: a Celery task the team names is told of every call that starts waiting for a person.

A call of a tool that requires confirmation waits until someone answers it; nobody answers a call they never
hear of. A team sets `TOOLLOOP_ATTENTION_TASK` (a Celery task name of its own, e.g. `myapp.ask_approval`) and
runs a Celery worker of its own on `TOOLLOOP_ATTENTION_QUEUE` (default `toolloop.attention`) whose task posts
to a chat, pages someone, or opens a ticket. The task is sent as
`send_task(name, kwargs={"waiting": <WaitingNotice as JSON>}, queue=...)`, once per waiting call.

    machine: a round's calls start waiting → AskAttention (once: `machine.resume` never issues it again)
    driver: AskAttention → AttentionSender.ask (a task of its own) → Publisher.publish_hook

Guarantees: sent once per waiting call, when the wait starts, after the state that records the wait is
saved; an orchestrator that takes the turn over never sends it again. An orchestrator that dies between that
save and the send loses the notice (the call is still listed by `toolloop pending`, the turn page, and
`GET /v1/turns/{id}`'s `pending_approvals`). Sending never holds up the turn: given up after the publisher's
retries, it is logged and counted (`toolloop_attention_failures_total`). Arguments are redacted as in every
view of the turn. The task id is `toolloop.attention:<turn id>:<call id>`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import BaseModel, Field

from orchestrator import metrics
from orchestrator.machine.events import AskAttention, WaitingCall

log = logging.getLogger("toolloop.orchestrator")

ATTENTION_SCHEMA_VERSION = 1
"""The version of `WaitingNotice`'s JSON; a consumer refuses (or upgrades) a version it does not know."""


class WaitingNotice(BaseModel):
    """What the attention task receives (`waiting`, as JSON): one call that waits for a person, and how to
    answer it."""

    schema_version: int = ATTENTION_SCHEMA_VERSION
    turn_id: str
    call_id: str
    tool: str
    # Redacted (`workers.contract.redact`), as every view of the turn shows them.
    arguments: dict[str, Any] = Field(default_factory=dict)
    waiting_for: str = "approval"
    # When the wait ends without an answer (epoch seconds), and what the call then gets ("deny", "approve").
    wait_deadline: float
    on_timeout: str = "deny"
    tenant: str
    # The command line that answers it (add `--deny` to deny; the HTTP route is
    # `POST /v1/turns/{turn_id}/approvals/{call_id}`).
    approve_command: str


def build_approve_command(turn_id: str, call_id: str) -> str:
    """The `toolloop` command that approves a waiting call (`--deny` denies it)."""
    return f"toolloop approve {turn_id} {call_id}"


def build_waiting_notice(turn_id: str, call: WaitingCall, tenant: str) -> WaitingNotice:
    """The notice of one waiting call (pure)."""
    return WaitingNotice(
        turn_id=turn_id,
        call_id=call.call_id,
        tool=call.tool,
        arguments=call.arguments,
        waiting_for=call.waiting_for,
        wait_deadline=call.wait_deadline,
        on_timeout=call.on_timeout,
        tenant=tenant,
        approve_command=build_approve_command(turn_id, call.call_id),
    )


def build_attention_send(notice: WaitingNotice, *, task: str, queue: str) -> dict[str, Any]:
    """Keyword arguments for `Celery.send_task` that hand `notice` to the attention task (pure). Flower shows
    the turn, the call and the tool, never the arguments."""
    summary = {"turn_id": notice.turn_id, "call_id": notice.call_id, "tool": notice.tool}
    return {
        "name": task,
        "kwargs": {"waiting": notice.model_dump(mode="json")},
        "queue": queue,
        "task_id": f"toolloop.attention:{notice.turn_id}:{notice.call_id}",
        "argsrepr": "()",
        "kwargsrepr": json.dumps(summary),
        "headers": {"toolloop_turn_id": notice.turn_id},
        "ignore_result": True,
        "serializer": "json",
    }


class HookPublisher(Protocol):
    """What sends a hook's task (`publishing.publisher.Publisher`)."""

    async def publish_hook(self, options: Mapping[str, Any], purpose: str) -> Exception | None:
        """Send one task; the last error when given up, None once sent."""
        ...


class AttentionSender:
    """Sends the notices of waiting calls, each in a task of its own: a turn never waits on them."""

    def __init__(self, publisher: HookPublisher, *, task: str, queue: str) -> None:
        self._publisher = publisher
        self._task = task
        self._queue = queue
        self._sending: set[asyncio.Task[None]] = set()

    def ask(self, turn_id: str, command: AskAttention) -> None:
        """Send one notice per call of `command` (returns at once)."""
        for call in command.calls:
            notice = build_waiting_notice(turn_id, call, command.tenant)
            sending = asyncio.create_task(self._send(notice), name=f"attention {turn_id} {call.call_id}")
            self._sending.add(sending)
            sending.add_done_callback(self._sending.discard)

    async def _send(self, notice: WaitingNotice) -> None:
        options = build_attention_send(notice, task=self._task, queue=self._queue)
        try:
            error = await self._publisher.publish_hook(options, "attention")
        except Exception as exc:  # a bug must cost one notice, never the turn
            error = exc
        if error is not None:
            log.error(
                "turn %s: call %s waits for a person, and %s was not told (%s)",
                notice.turn_id,
                notice.call_id,
                self._task,
                error,
            )
            metrics.record_attention_failure()

    async def aclose(self, timeout_s: float) -> None:
        """Let the notices being sent go out for up to `timeout_s`; those still pending then are given up."""
        if not self._sending:
            return
        _, pending = await asyncio.wait(set(self._sending), timeout=max(timeout_s, 0.0))
        for sending in pending:
            sending.cancel()
            metrics.record_attention_failure()
        await asyncio.gather(*pending, return_exceptions=True)
