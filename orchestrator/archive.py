"""The archive hook: each finished turn's full record handed to a Celery task the team names.

Redis keeps a turn for its retention period; a team that keeps turns forever sets `TOOLLOOP_ARCHIVE_TASK`
(a Celery task name of its own, e.g. `myapp.archive_turn`) and runs a Celery worker of its own on
`TOOLLOOP_ARCHIVE_QUEUE` (default `toolloop.archive`) whose task writes the record where it wants
(`workers/examples/archive_sqlite.py` writes it into SQLite). The task is sent as
`send_task(name, kwargs={"record": <TurnRecord as JSON>}, queue=...)`.

    driver: Finish → ArchivingTurnStore.save_outcome (or .finish_step, with the turn's last step)
            ── stored ──► TurnArchiver.archive (a task of its own)
    TurnArchiver: read the request and the calls' outcome envelopes → build_turn_record → Publisher

Guarantees: a record is sent at most once per finished turn by the orchestrator that stored its outcome,
after the outcome is stored (a turn that never finished sends nothing). Sending never holds up nor fails
the turn: it is retried while Redis is away (until the process stops), and a record given up is logged and
counted (`toolloop_archive_failures_total`). An orchestrator that dies between storing the outcome and
sending loses that record (the turn is terminal: nobody adopts it again). Sensitive values are redacted as
in every view of the turn (`store.turn_view.build_shown_*`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, Field

from orchestrator import metrics
from orchestrator.model import (
    ApprovalDecision,
    AssistantMessage,
    Message,
    ToolMessage,
    TurnOutcome,
    TurnRequest,
    TurnStatus,
)
from orchestrator.outage import REDIS_ERRORS, RedisRetry, is_redis_failure
from orchestrator.runtime.inbox import build_wire_call_id
from orchestrator.store.flows import UNREAD, Unread
from orchestrator.store.history import Appended
from orchestrator.store.scripts import SaveResult
from orchestrator.store.turn_view import (
    build_initial_messages,
    build_shown_outcome,
    build_shown_request,
)
from orchestrator.store.turns import TurnStore
from workers.contract import FailureKind, ToolOutcome
from workers.redis_errors import maybe_ran

log = logging.getLogger("toolloop.orchestrator")

ARCHIVE_SCHEMA_VERSION = 1
"""The version of `TurnRecord`'s JSON; a consumer refuses (or upgrades) a version it does not know."""


class CallRecord(BaseModel):
    """One tool call of the turn, as its outcome envelope tells it (its result is in the messages).

    `attempts`, `duration_ms`, `worker` and `finished_at` are None when the envelope was no longer stored;
    the rest then comes from the call's tool message. `approval`: how a call that waited for a person was
    answered, by whom and why (None for a call that never waited).
    """

    call_id: str
    tool: str
    ok: bool
    failure_kind: FailureKind | None = None
    synthetic: bool = False
    attempts: int | None = None
    duration_ms: float | None = None
    worker: str | None = None
    finished_at: float | None = None
    approval: ApprovalDecision | None = None


class TurnRecord(BaseModel):
    """What the archive task receives (`record`, as JSON): a finished turn whole, redacted as it is shown.

    `outcome.messages` is the whole history the turn ended with, a conversation's earlier turns included;
    the turn's own messages (its input, then what it added) start at `first_message_index`. `calls` are
    the calls this turn made, in order; `finished_at` is when its outcome was stored (epoch seconds).
    """

    schema_version: int = ARCHIVE_SCHEMA_VERSION
    turn_id: str
    conversation_id: str | None = None
    request: TurnRequest
    outcome: TurnOutcome
    first_message_index: int = 0
    calls: list[CallRecord] = Field(default_factory=list)
    finished_at: float


def find_turn_input(messages: Sequence[Message], request: TurnRequest) -> tuple[int, int]:
    """Where the turn's input (its request's messages, then its prompt) starts and ends in its history.

    The history is the conversation's earlier turns, the input, then what the turn added; the machine adds
    no user message, so the input is its last occurrence. A history without it (no input at all) starts
    with the turn.
    """
    own = build_initial_messages(request)
    width = len(own)
    if width:
        for start in range(len(messages) - width, -1, -1):
            if list(messages[start : start + width]) == own:
                return start, start + width
    return 0, 0


def build_turn_calls(messages: Sequence[Message]) -> list[tuple[str, str]]:
    """(call id, tool) of every tool call the assistant messages of `messages` make, in order."""
    return [
        (call.id, call.name)
        for message in messages
        if isinstance(message, AssistantMessage)
        for call in message.tool_calls
    ]


def build_record_wire_ids(turn_id: str, request: TurnRequest, outcome: TurnOutcome) -> list[str]:
    """The wire ids of the calls this turn made (not those of its input or of earlier turns)."""
    _, end = find_turn_input(outcome.messages, request)
    return [build_wire_call_id(turn_id, call_id) for call_id, _ in build_turn_calls(outcome.messages[end:])]


def build_call_record(
    call_id: str,
    tool: str,
    envelope: ToolOutcome | None,
    answer: ToolMessage | None,
    approval: ApprovalDecision | None = None,
) -> CallRecord:
    """A call's record from its outcome envelope, or, without one, from its tool message; with how it was
    approved or denied when it waited for a person."""
    return _build_call_record(call_id, tool, envelope, answer).model_copy(update={"approval": approval})


def _build_call_record(
    call_id: str, tool: str, envelope: ToolOutcome | None, answer: ToolMessage | None
) -> CallRecord:
    if envelope is not None:
        return CallRecord(
            call_id=call_id,
            tool=envelope.tool,
            ok=envelope.ok,
            failure_kind=envelope.failure_kind,
            synthetic=envelope.synthetic,
            attempts=envelope.attempts,
            duration_ms=envelope.duration_ms,
            worker=envelope.worker,
            finished_at=envelope.finished_at,
        )
    return CallRecord(
        call_id=call_id,
        tool=tool,
        ok=answer is not None and not answer.is_error,
        failure_kind=answer.failure_kind if answer is not None else None,
        synthetic=answer.synthetic if answer is not None else False,
    )


def build_turn_record(
    turn_id: str,
    request: TurnRequest,
    outcome: TurnOutcome,
    envelopes: Mapping[str, ToolOutcome],
    finished_at: float,
) -> TurnRecord:
    """The record of a finished turn (pure): `envelopes` are its calls' stored outcomes, by wire call id."""
    start, end = find_turn_input(outcome.messages, request)
    added = outcome.messages[end:]
    answers = {m.tool_call_id: m for m in added if isinstance(m, ToolMessage)}
    approvals = {decision.call_id: decision for decision in outcome.approvals}
    calls = [
        build_call_record(
            call_id,
            tool,
            envelopes.get(build_wire_call_id(turn_id, call_id)),
            answers.get(call_id),
            approvals.get(call_id),
        )
        for call_id, tool in build_turn_calls(added)
    ]
    return TurnRecord(
        turn_id=turn_id,
        conversation_id=request.conversation_id,
        request=build_shown_request(request),
        outcome=build_shown_outcome(outcome),
        first_message_index=start,
        calls=calls,
        finished_at=finished_at,
    )


def build_archive_send(record: TurnRecord, *, task: str, queue: str) -> dict[str, Any]:
    """Keyword arguments for `Celery.send_task` that hand `record` to the archive task (pure).

    The task id is the turn's, so a second send (if ever) is visibly the same record; Flower shows the
    turn id and status only, never the conversation.
    """
    summary = {"turn_id": record.turn_id, "status": record.outcome.status}
    return {
        "name": task,
        "kwargs": {"record": record.model_dump(mode="json")},
        "queue": queue,
        "task_id": f"toolloop.archive:{record.turn_id}",
        "argsrepr": "()",
        "kwargsrepr": json.dumps(summary),
        "headers": {"toolloop_turn_id": record.turn_id},
        "ignore_result": True,
        "serializer": "json",
    }


class ArchivePublisher(Protocol):
    """What sends an archive task (`runtime.publish.Publisher`)."""

    async def publish_archive(self, options: Mapping[str, Any]) -> Exception | None:
        """Send one task; the last error when given up, None once sent."""
        ...


class TurnArchiver:
    """Sends finished turns' records, each in a task of its own: a turn never waits on its archive."""

    def __init__(
        self,
        store: TurnStore,
        publisher: ArchivePublisher,
        retry: RedisRetry,
        *,
        task: str,
        queue: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._retry = retry
        self._task = task
        self._queue = queue
        self._clock = clock
        self._sending: set[asyncio.Task[None]] = set()

    def archive(self, turn_id: str, outcome: TurnOutcome) -> None:
        """Send the record of a turn whose outcome was just stored (from a task; returns at once)."""
        sending = asyncio.create_task(self._send(turn_id, outcome, self._clock()), name=f"archive {turn_id}")
        self._sending.add(sending)
        sending.add_done_callback(self._sending.discard)

    async def read_record(self, turn_id: str, outcome: TurnOutcome, finished_at: float) -> TurnRecord | None:
        """The turn's record: its request and its calls' envelopes read (two round trips); None without a
        request (expired or lost)."""
        request = await self._store.load_request(turn_id)
        if request is None:
            return None
        wire_ids = build_record_wire_ids(turn_id, request, outcome)
        envelopes = await self._store.read_outcomes(dict.fromkeys(wire_ids, turn_id))
        return build_turn_record(turn_id, request, outcome, envelopes, finished_at)

    async def _send(self, turn_id: str, outcome: TurnOutcome, finished_at: float) -> None:
        try:
            read = await self._retry.call("archive", lambda: self.read_record(turn_id, outcome, finished_at))
        except REDIS_ERRORS as exc:  # raised only once the process stops: retried until then
            self._fail(turn_id, "stopped", f"Redis failed while stopping ({exc})")
            return
        except Exception:  # a bug must cost one record, never the process
            log.exception("turn %s: building its archive record failed", turn_id)
            metrics.record_archive_failure("read")
            return
        if read is None:
            self._fail(turn_id, "read", "its request is gone")
            return
        error = await self._publisher.publish_archive(
            build_archive_send(read, task=self._task, queue=self._queue)
        )
        if error is not None:
            stopped = self._retry.stopping.is_set() and is_redis_failure(error)
            self._fail(turn_id, "stopped" if stopped else "publish", f"the broker refused it ({error})")

    def _fail(self, turn_id: str, stage: str, why: str) -> None:
        log.error("turn %s: archive record not sent to %s: %s", turn_id, self._task, why)
        metrics.record_archive_failure(stage)

    async def aclose(self, timeout_s: float) -> None:
        """Let the records being sent go out for up to `timeout_s`; those still pending then are given up
        (logged and counted as `stopped`)."""
        if not self._sending:
            return
        _, pending = await asyncio.wait(set(self._sending), timeout=max(timeout_s, 0.0))
        for sending in pending:
            sending.cancel()
            self._fail(sending.get_name().removeprefix("archive "), "stopped", "the orchestrator stopped")
        await asyncio.gather(*pending, return_exceptions=True)


class ArchivingTurnStore(TurnStore):
    """The turn driver's store when archiving is on: its terminal write hands the turn to the archiver.

    The driver retries `save_outcome` until it lands; a try whose reply was lost may have stored the
    outcome, and the next then finds the turn terminal (False): that turn was finished here all the same,
    and is archived once.
    """

    def __init__(self, store: TurnStore, archiver: TurnArchiver) -> None:
        # The same connection pool and configuration as the store it stands in for.
        super().__init__(store.redis, lease_ttl_s=store.lease_ttl_s, retention=store.retention)
        self.archiver = archiver
        self._unsure: set[str] = set()

    async def save_outcome(
        self,
        turn_id: str,
        outcome: TurnOutcome,
        *,
        conversation_id: str | Unread | None = UNREAD,
        orchestrator_id: str | None = None,
        tenant: str | None = None,
    ) -> bool:
        """`TurnStore.save_outcome`, then, once stored by this call (or a lost-reply try of it), archive."""
        try:
            finished = await super().save_outcome(
                turn_id,
                outcome,
                conversation_id=conversation_id,
                orchestrator_id=orchestrator_id,
                tenant=tenant,
            )
        except REDIS_ERRORS as exc:
            if maybe_ran(exc):
                self._unsure.add(turn_id)  # the write may have landed, its reply lost
            raise
        if finished or turn_id in self._unsure:
            self.archiver.archive(turn_id, outcome)
        self._unsure.discard(turn_id)
        return finished

    async def finish_step(
        self,
        turn_id: str,
        state_json: str,
        status: TurnStatus,
        events: Sequence[tuple[str, Mapping[str, Any]]],
        *,
        outcome: TurnOutcome,
        conversation_id: str | None,
        orchestrator_id: str,
        append: Appended | None = None,
        lists_kept: bool = False,
        tenant: str | None = None,
    ) -> SaveResult:
        """`TurnStore.finish_step`, then, once the outcome is stored by it, archive. A try whose reply was
        lost is followed by the step alone and `save_outcome`, which archives the turn then."""
        try:
            saved = await super().finish_step(
                turn_id,
                state_json,
                status,
                events,
                outcome=outcome,
                conversation_id=conversation_id,
                orchestrator_id=orchestrator_id,
                append=append,
                lists_kept=lists_kept,
                tenant=tenant,
            )
        except REDIS_ERRORS as exc:
            if maybe_ran(exc):
                self._unsure.add(turn_id)
            raise
        if saved is SaveResult.SAVED:
            self.archiver.archive(turn_id, outcome)
            self._unsure.discard(turn_id)
        return saved
