"""What goes into the state machine (events) and what comes out of it (commands).

The runtime performs each command and feeds back what happened as events; the machine never does I/O.
Both are frozen pydantic models keyed on `kind`, so they can be logged and stored as JSON.

Time enters only through events (`at`, epoch seconds). A synthetic outcome is written by the runtime through
the first-writer-wins store call (`WriteOutcomes`), and whichever outcome won is fed back as `ToolFinished`:
the machine treats its own outcomes as asked for, not final, until they come back.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.model import Message, ModelSettings, ProviderError, Turn, TurnOutcome, TurnPriority, Usage
from orchestrator.model_limits import LimitName
from workers.contract import DEFAULT_TENANT, ToolOutcome, ToolSpec


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- events ----------------------------------------------------------------------------------------------


Preview = tuple[tuple[str, dict[str, Any]], ...]
"""Streamed events a model call still owed its page when it ended (its answer's last deltas, a reset):
the runtime writes them first in the step that records the call's end (`runtime.streaming`). The machine
reads nothing of them."""


class ModelResponded(_Frozen):
    """The model answered the call `llm_call_index` (None: the call in flight, whichever it is)."""

    kind: Literal["model_responded"] = "model_responded"
    turn: Turn
    duration_ms: float = 0.0
    at: float
    llm_call_index: int | None = None
    preview: Preview = ()


class ModelFailed(_Frozen):
    """The model call `llm_call_index` failed with a provider or transport error."""

    kind: Literal["model_failed"] = "model_failed"
    error: ProviderError
    duration_ms: float = 0.0
    at: float
    llm_call_index: int | None = None
    preview: Preview = ()


class ModelThrottled(_Frozen):
    """The model call `llm_call_index` was not sent: `limit` holds it for `wait_s` seconds — its model's
    budget of requests or tokens (TOOLLOOP_MODEL_LIMITS), or a rest its provider asked of the fleet."""

    kind: Literal["model_throttled"] = "model_throttled"
    limit: LimitName
    wait_s: float
    at: float
    llm_call_index: int | None = None


class QuotaExceeded(_Frozen):
    """The model call `llm_call_index` was not sent: the turn's tenant has used `used` tokens of its quota of
    `limit` (`quota`, TOOLLOOP_TENANT_LIMITS) — the turn ends as `quota_exceeded`."""

    kind: Literal["quota_exceeded"] = "quota_exceeded"
    tenant: str
    quota: Literal["tokens_per_day"] = "tokens_per_day"
    limit: int
    used: int
    at: float
    llm_call_index: int | None = None


class ToolStarted(_Frozen):
    """A worker started attempt `attempt` of a call."""

    kind: Literal["tool_started"] = "tool_started"
    call_id: str
    attempt: int = 1
    worker: str | None = None
    at: float


class ToolWaitingForWorker(_Frozen):
    """Attempt `attempt` of a call was sent to its queue while no live worker serves its tool, though one did
    at `last_served_at` (epoch seconds), within TOOLLOOP_TOOL_GONE_AFTER_S: a restart or a deploy. It waits
    there for the next worker, whose start ends the wait (`ToolStarted`)."""

    kind: Literal["tool_waiting_for_worker"] = "tool_waiting_for_worker"
    call_id: str
    attempt: int = 1
    last_served_at: float | None = None
    at: float


class ToolFinished(_Frozen):
    """The outcome that won the first-writer-wins write for a call (real or synthetic)."""

    kind: Literal["tool_finished"] = "tool_finished"
    outcome: ToolOutcome
    at: float


class TimerFired(_Frozen):
    """A timer armed by `ArmTimer` is due."""

    kind: Literal["timer_fired"] = "timer_fired"
    timer_id: str
    at: float


class WorkerChecked(_Frozen):
    """What `CheckWorker` found: when the worker that started attempt `attempt` of a call last reported in
    (`seen_at`, epoch seconds of its clock; None: not within its heartbeat's TTL, or unreadable)."""

    kind: Literal["worker_checked"] = "worker_checked"
    call_id: str
    attempt: int
    worker: str
    seen_at: float | None = None
    at: float


class ApprovalGiven(_Frozen):
    """Someone approved or denied a call waiting for confirmation."""

    kind: Literal["approval_given"] = "approval_given"
    call_id: str
    approved: bool
    at: float
    # Denied: what the person said, which the model sees. Approved: arguments the person edited, to be run
    # instead of the model's (validated against the tool's schema first). Either: who answered, as the
    # answering client said (kept with the reason in the turn's `approvals`).
    reason: str | None = None
    arguments: dict[str, Any] | None = None
    decided_by: str | None = None


class ClientResultGiven(_Frozen):
    """The caller answered a call of a client-side tool: its `result` (any JSON, what the model reads as the
    tool's output), or an `error` message (what the model reads as the tool's failure)."""

    kind: Literal["client_result_given"] = "client_result_given"
    call_id: str
    at: float
    result: Any = None
    error: str | None = None


class ChildTurnFinished(_Frozen):
    """A sub-agent's child turn ended: its answer (`result`: its final text, or its typed output), or why it
    failed (`error`), how it ended (`status`), and what it used (added into the parent's usage)."""

    kind: Literal["child_turn_finished"] = "child_turn_finished"
    call_id: str
    at: float
    turn_id: str
    status: str
    result: Any = None
    error: str | None = None
    usage: Usage = Field(default_factory=Usage)


class CancelRequested(_Frozen):
    """Someone cancelled the turn."""

    kind: Literal["cancel_requested"] = "cancel_requested"
    at: float
    reason: str | None = None


Event = Annotated[
    ModelResponded
    | ModelFailed
    | ModelThrottled
    | QuotaExceeded
    | ToolStarted
    | ToolWaitingForWorker
    | ToolFinished
    | TimerFired
    | WorkerChecked
    | ApprovalGiven
    | ClientResultGiven
    | ChildTurnFinished
    | CancelRequested,
    Field(discriminator="kind"),
]


# --- commands --------------------------------------------------------------------------------------------


class CallModel(_Frozen):
    """Call `model` (`provider:model`) with the request-time view and the offered tools.

    Tool-call ids the provider omits are synthesised as `<id_prefix>_<n>`, unique across the turn. A new owner
    of the turn issues the same command again for the call in flight (`machine.resume`): the first response
    for `llm_call_index` is taken, whichever request it answers.
    """

    kind: Literal["call_model"] = "call_model"
    model: str
    messages: list[Message]
    tools: list[ToolSpec]
    tool_choice: str | None = None
    id_prefix: str
    llm_call_index: int
    # `stream`: ask the provider to stream (the turn's `stream`); `shown`: the call's text goes to the turn's
    # event stream as `text_delta`s (not a compaction call's summary).
    stream: bool = True
    shown: bool = True
    # The turn's model controls: its system prompt, how the model is asked, the JSON Schema of its
    # answer; each None or default when the turn sets none (and for a compaction call's summary).
    instructions: str | None = None
    settings: ModelSettings = Field(default_factory=ModelSettings)
    output_schema: dict[str, Any] | None = None
    # The request's estimated input tokens (the view's), which a tokens budget reserves; None: not estimated.
    estimated_tokens: int | None = None
    # The turn's tenant, whose limits the call draws from too (TOOLLOOP_TENANT_LIMITS).
    tenant: str = DEFAULT_TENANT


class Dispatch(_Frozen):
    """One Celery task for one call: the runtime builds the `ToolCallRequest` from this."""

    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    attempt: int = 1
    task_id: str
    deadline_at: float | None = None
    context: dict[str, Any] = Field(default_factory=dict)
    tenant: str = DEFAULT_TENANT
    # The turn's lane: the Celery message priority of the task (`publishing.publisher.build_send_options`).
    priority: TurnPriority = "normal"


class DispatchTools(_Frozen):
    """Send these calls to the workers, in parallel."""

    kind: Literal["dispatch_tools"] = "dispatch_tools"
    calls: list[Dispatch]


class WriteOutcomes(_Frozen):
    """Write these outcomes first-writer-wins, then feed back `ToolFinished` with each winner."""

    kind: Literal["write_outcomes"] = "write_outcomes"
    outcomes: list[ToolOutcome]


class ArmTimer(_Frozen):
    """Feed `TimerFired(timer_id)` at epoch `at`; arming an armed id again replaces it."""

    kind: Literal["arm_timer"] = "arm_timer"
    timer_id: str
    at: float


class CancelTimer(_Frozen):
    """Forget a timer armed earlier (a no-op when it already fired)."""

    kind: Literal["cancel_timer"] = "cancel_timer"
    timer_id: str


class CheckWorker(_Frozen):
    """Read when `worker` last reported in (its heartbeat), then feed back `WorkerChecked`."""

    kind: Literal["check_worker"] = "check_worker"
    call_id: str
    attempt: int
    worker: str


class Revoke(_Frozen):
    """Revoke (and terminate) these Celery tasks."""

    kind: Literal["revoke"] = "revoke"
    task_ids: list[str]


class AwaitApproval(_Frozen):
    """These calls wait for a person's approval; the turn's status is `waiting` meanwhile."""

    kind: Literal["await_approval"] = "await_approval"
    call_ids: list[str]


class WaitingCall(_Frozen):
    """A call that started waiting outside the turn, as whoever is asked to answer it is told."""

    call_id: str
    tool: str
    # Redacted (`workers.contract.redact`).
    arguments: dict[str, Any] = Field(default_factory=dict)
    waiting_for: str = "approval"
    # When the wait ends without an answer (epoch seconds), and what the call then gets.
    wait_deadline: float
    on_timeout: str = "deny"


class AskAttention(_Frozen):
    """These calls of the turn (of `tenant`) just started waiting for a person: tell someone, once
    (TOOLLOOP_ATTENTION_TASK). Issued when the wait starts, never again by `machine.resume`."""

    kind: Literal["ask_attention"] = "ask_attention"
    calls: list[WaitingCall]
    tenant: str = DEFAULT_TENANT


class StartChildTurn(_Frozen):
    """Start a sub-agent's child turn for a call (as `agent`, with the call's `arguments` as its input): turn
    `turn_id`, a child of this turn at `depth`, ending by `deadline_at` (epoch seconds, the parent's own) and
    within what the parent has left of its budgets (None: no budget). Submitting it again is a no-op, so a
    new owner of the parent may ask again without starting a second child."""

    kind: Literal["start_child_turn"] = "start_child_turn"
    call_id: str
    agent: str
    turn_id: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    depth: int
    deadline_at: float
    max_total_tokens: int | None = None
    max_cost_usd: float | None = None
    tenant: str = DEFAULT_TENANT
    priority: str = "normal"


class CancelChildTurns(_Frozen):
    """Cancel these child turns (their parent stopped, or gave up waiting for them)."""

    kind: Literal["cancel_child_turns"] = "cancel_child_turns"
    turn_ids: list[str]
    reason: str


class Emit(_Frozen):
    """Publish one turn event; `data` is JSON-ready and already redacted."""

    kind: Literal["emit"] = "emit"
    event_name: str
    data: dict[str, Any] = Field(default_factory=dict)


class Finish(_Frozen):
    """The turn is over: store its outcome, publish it, release the lease."""

    kind: Literal["finish"] = "finish"
    outcome: TurnOutcome


Command = Annotated[
    CallModel
    | DispatchTools
    | WriteOutcomes
    | ArmTimer
    | CancelTimer
    | CheckWorker
    | Revoke
    | AwaitApproval
    | AskAttention
    | StartChildTurn
    | CancelChildTurns
    | Emit
    | Finish,
    Field(discriminator="kind"),
]
