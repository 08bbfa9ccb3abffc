"""The persisted state of one turn: frozen, versioned, JSON-serialisable.

The state machine (`orchestrator.machine`) is the only writer: every step takes a `TurnState` and returns a
new one. Each model has a `TypedDict` of its fields, all optional (`TurnChanges`, `CallChanges`,
`RoundChanges`): the machine changes a state only through them (`Draft.update`, `CallState.replace`,
`RoundState.replace`), so that mypy checks the name and type of every field it sets, while the copy itself
stays an unvalidated `model_copy`. A unit test keeps each in step with its model.

The runtime persists `dump_state(state)` after every step, and any orchestrator can resume the turn from
`load_state(text, history)`. A state of a newer or older layout is refused (`StateVersionError`), not misread;
within a version, a field a newer release added is ignored (`workers.records`).

Design notes: docs/design/turns.md, "Persisted state and versions".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal, TypedDict, Unpack

from pydantic import ConfigDict, Field, TypeAdapter

from orchestrator.context.budget import ContextBudget
from orchestrator.errors import StateVersionError
from orchestrator.machine.layout import (
    HISTORY_KEY_FIELD,
    HISTORY_LEN_FIELD,
    LOG_KEY_FIELD,
    LOG_LEN_FIELD,
    LOGGED_FIELDS,
    STATIC_FIELDS,
    dump_log,
    read_log,
    read_message,
    upgrade_from_v1,
)
from orchestrator.model import (
    ApprovalDecision,
    AssistantMessage,
    ChildTurn,
    Limits,
    LLMCallRecord,
    Message,
    ModelSettings,
    ParentLink,
    ProviderError,
    StopReason,
    TurnOutcome,
    TurnPriority,
    TurnStatus,
    Usage,
)
from workers.contract import DEFAULT_TENANT, ApprovalTimeoutAction, ToolOutcome, ToolSpec
from workers.records import STORED, ForbidsUnknownFields

# How long a call whose worker went silent waits for it past hard limit + grace (TOOLLOOP_LOST_CALL_WAIT_S).
DEFAULT_LOST_CALL_WAIT_S = 60.0

# Version 2: `CallState.requested` holds the whole outcome asked for (version 1 kept only its kind), so that a
# new owner can ask for the very same outcome again (`machine.resume`). Version 1 states are upgraded on load.
# Version 3: the history is in an append-only Redis list (`workers.keys.history`; the JSON says which,
# `history_key`, and how many of its messages, `history_len`); the lists that only grow (`LOGGED_FIELDS`) are
# in the turn's log list (`log_key`, `log_len`): a step's state stays small however long the turn. Version 1
# and 2 states (all inline) load as they are; their next save writes their lists. Fields added since load
# with their defaults from a state written before them.
STATE_VERSION = 3
SUPPORTED_STATE_VERSIONS = frozenset({1, 2, STATE_VERSION})
_MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)

# Timer ids the machine arms; the runtime treats them as opaque strings.
DEADLINE_TIMER = "deadline"
MODEL_RETRY_TIMER_PREFIX = "model_retry:"
LOST_TIMER_PREFIX = "lost:"
WAIT_TIMER_PREFIX = "wait:"


def lost_timer_id(call_id: str, attempt: int) -> str:
    """The timer that fires when attempt `attempt` of a call has run past its hard limit plus grace."""
    return f"{LOST_TIMER_PREFIX}{call_id}:{attempt}"


def wait_timer_id(call_id: str) -> str:
    """The timer that ends a call's wait for a person (`CallWait.deadline_at`)."""
    return f"{WAIT_TIMER_PREFIX}{call_id}"


def parse_lost_timer_id(timer_id: str) -> tuple[str, int] | None:
    """(call id, attempt) of a lost-call timer id; None for other timers."""
    if not timer_id.startswith(LOST_TIMER_PREFIX):
        return None
    call_id, _, attempt = timer_id[len(LOST_TIMER_PREFIX) :].rpartition(":")
    return (call_id, int(attempt)) if attempt.isdigit() and call_id else None


class _Frozen(ForbidsUnknownFields):
    # A field a newer release added without a new `version` is one this release may ignore (`load_state`
    # reads with the `STORED` context); one it must not ignore comes with a new version.
    model_config = ConfigDict(frozen=True, extra="forbid")


WaitingFor = Literal["approval", "client_result", "child_turn"]
"""What a call waits for outside the turn: a person's approval, the result of a client-side tool its caller
runs, or a sub-agent's child turn. Each takes the same path: the event `call_waiting`, parking; a person's
or a caller's wait also pauses the turn's clock, a child's does not (the child runs on the parent's time)."""


class CallWait(_Frozen):
    """What a call waits for, since when, and until when (epoch seconds): past `deadline_at` the wait's
    `on_timeout` answers it."""

    waiting_for: WaitingFor = "approval"
    since: float
    deadline_at: float
    on_timeout: ApprovalTimeoutAction = "deny"

    @property
    def timeout_s(self) -> float:
        """The wait's limit, in seconds."""
        return self.deadline_at - self.since


def build_child_turn_id(turn_id: str, call_id: str) -> str:
    """The id of the child turn a sub-agent call of `turn_id` starts: the same every time it is asked for."""
    return f"{turn_id}.{call_id}"


class AgentRun(_Frozen):
    """What a turn runs as one named agent (`workers.agents.AgentSpec`, resolved by the orchestrator): its
    instructions, models (the fallback order), settings and output schema, the tools it offers (catalogue
    tools, its sub-agents, and `transfer_to_<agent>` for its handoffs), which offered tools are sub-agents,
    and which hand off to which agent."""

    name: str
    instructions: str | None = None
    models: list[str] = Field(default_factory=list)
    model_settings: ModelSettings = Field(default_factory=ModelSettings)
    output_schema: dict[str, Any] | None = None
    offered: dict[str, ToolSpec] = Field(default_factory=dict)
    sub_agents: list[str] = Field(default_factory=list)
    handoffs: dict[str, str] = Field(default_factory=dict)


class CallState(_Frozen):
    """One tool call of the current round, from the model's request to its one outcome.

    `requested` is the outcome the orchestrator asked the runtime to write (validation, synthetic, denial):
    it is not final until it comes back as `ToolFinished`, because a real outcome may have won the
    first-writer-wins race. It is kept whole so that a new owner of the turn can ask for it again.
    """

    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    index: int
    attempt: int = 0  # 0 while never dispatched
    task_id: str | None = None
    dispatched_at: float | None = None
    started_at: float | None = None
    worker: str | None = None
    waiting_approval: bool = False
    # The wait of a call waiting for a person (with `waiting_approval`); None once answered, and in states
    # written before waits had limits.
    wait: CallWait | None = None
    # Sent while no live worker served its tool (a restart, a deploy): since when it waits in its queue for
    # one; None once a worker starts it (`ToolWaitingForWorker`, `ToolStarted`).
    waiting_for_worker_since: float | None = None
    requested: ToolOutcome | None = None
    outcome: ToolOutcome | None = None

    @property
    def finished(self) -> bool:
        """True once the call's one outcome is known."""
        return self.outcome is not None

    @property
    def waiting(self) -> bool:
        """True while the call waits for a person, no answer decided yet."""
        return self.waiting_approval and self.requested is None and self.outcome is None

    @property
    def in_flight(self) -> bool:
        """True while a dispatched task may still write a real outcome."""
        return self.attempt > 0 and self.outcome is None

    def replace(self, **changes: Unpack[CallChanges]) -> CallState:
        """A copy with `changes`, not validated (mypy checks them)."""
        return self.model_copy(update=changes)


class RoundState(_Frozen):
    """The assistant message of the current round and its calls.

    The assistant message enters the history only together with all its tool messages, so the stored
    history never holds an unanswered tool call, even between steps.
    """

    index: int
    assistant: AssistantMessage
    calls: list[CallState]

    @property
    def complete(self) -> bool:
        """True when every call of the round has its outcome."""
        return all(call.finished for call in self.calls)

    def replace(self, **changes: Unpack[RoundChanges]) -> RoundState:
        """A copy with `changes`, not validated (mypy checks them)."""
        return self.model_copy(update=changes)


class PendingStop(_Frozen):
    """A decided end of the turn, waiting for the outcomes of the round to come back before finishing."""

    status: Literal["stopped", "failed", "cancelled"]
    reason: StopReason
    message: str
    error: ProviderError | None = None


ViewDiagnosticKind = Literal[
    "flattened_tool_calls",
    "flattened_tool_result",
    "remapped_tool_call_id",
    "dropped_thinking",
    "dropped_provider_data",
    "elided_tool_result",
    "dropped_exchange",
    "compacted",
    "over_budget",
]


class ViewDiagnostic(_Frozen):
    """One thing the request-time view did to the history for a model call."""

    kind: ViewDiagnosticKind
    message_index: int
    detail: str


class ViewRecord(_Frozen):
    """The view diagnostics of one model call, stored with the turn's step."""

    llm_call_index: int
    target_provider: str
    diagnostics: list[ViewDiagnostic] = Field(default_factory=list)


class LateOutcome(_Frozen):
    """An outcome that arrived for a call already answered: kept for audit, never shown to a model."""

    outcome: ToolOutcome
    at: float


class TurnState(_Frozen):
    """Everything the machine needs to continue a turn on any orchestrator."""

    version: int = STATE_VERSION
    turn_id: str
    # The request's essentials. `model` is the one calls go to, `models[model_index]` of the fallback order
    # (empty in older states); the model controls go with every call, never into the history.
    model: str
    models: list[str] = Field(default_factory=list)
    model_index: int = 0
    instructions: str | None = None
    model_settings: ModelSettings = Field(default_factory=ModelSettings)
    output_schema: dict[str, Any] | None = None
    limits: Limits = Field(default_factory=Limits)
    context: dict[str, Any] = Field(default_factory=dict)
    # The request's tenant, sent with every tool call (`ToolContext.tenant`); "default" in older states.
    tenant: str = DEFAULT_TENANT
    # The request's lane: its tool calls' message priority (left out at "normal", as in older states).
    priority: TurnPriority = "normal"
    tools_allowed: list[str] | None = None
    tool_choice: str | None = None
    stream: bool = True
    # Tools offered to the model, snapshotted from the catalogue at start, and the names of every catalogued
    # tool (so an unknown tool and a tool not offered are told apart without storing all specs).
    offered: dict[str, ToolSpec] = Field(default_factory=dict)
    catalogue_names: list[str] = Field(default_factory=list)
    # The offered tools the turn's caller runs (`TurnRequest.client_tools`): a call of one waits for its
    # result (`CallWait` "client_result"). Empty, and left out, for an ordinary turn.
    client_tools: list[str] = Field(default_factory=list)
    # Agents (`AgentRun`): the one the turn runs as now (None: no agent), every agent a handoff may reach
    # (by name), the offered tools that are sub-agents (a call of one starts a child turn and waits for it),
    # the handoff tools (tool → agent), the turn's parent when it is a child, how deep sub-agents may nest,
    # and the child turns started. All empty, and left out, for an ordinary turn.
    agent: str | None = None
    agents: dict[str, AgentRun] = Field(default_factory=dict)
    sub_agents: list[str] = Field(default_factory=list)
    handoffs: dict[str, str] = Field(default_factory=dict)
    parent: ParentLink | None = None
    max_agent_depth: int = 3
    children: list[ChildTurn] = Field(default_factory=list)
    # Append-only conversation.
    history: list[Message] = Field(default_factory=list)
    status: TurnStatus = TurnStatus.RUNNING
    # Counters.
    llm_calls: int = 0
    responses: int = 0
    tool_executions: int = 0
    rounds: int = 0
    empty_answer_retries: int = 0
    model_retries: int = 0
    output_retries: int = 0
    # The llm call index of the model call in flight, if any.
    awaiting_model: int | None = None
    current: RoundState | None = None
    # Policy memory: "tool\0error" signatures of failures seen, and how many rounds in a row
    # each "tool\0canonical arguments" signature was asked for.
    failure_signatures: list[str] = Field(default_factory=list)
    repeat_streaks: dict[str, int] = Field(default_factory=dict)
    # Usage per model call and summed.
    llm_call_records: list[LLMCallRecord] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    # Time, as epoch seconds taken from events.
    started_at: float
    deadline_at: float
    lost_grace_s: float = 5.0
    # How much longer a lost-call timer waits for a worker not heard from since the call's hard limit
    # (TOOLLOOP_LOST_CALL_WAIT_S). Its default is the setting's, so that a state at the default leaves the
    # field out and the previous release, which refuses fields it does not know, still reads it (a rollback).
    lost_wait_s: float = DEFAULT_LOST_CALL_WAIT_S
    model_retry_base_s: float = 1.0
    model_retry_cap_s: float = 30.0
    timers: dict[str, float] = Field(default_factory=dict)
    # Since when the turn's running clock is paused: every call it has left waits for a person. The deadline
    # moves out by the pause when it ends (`machine.waits`); None while the turn runs.
    paused_at: float | None = None
    # The answers to calls that waited for a person, in order (the outcome's `approvals`).
    approvals: list[ApprovalDecision] = Field(default_factory=list)
    # Audit.
    view_diagnostics: list[ViewRecord] = Field(default_factory=list)
    late_outcomes: list[LateOutcome] = Field(default_factory=list)
    # The end.
    stop: PendingStop | None = None
    outcome: TurnOutcome | None = None
    # The context budget of the request-time views.
    context_budget: ContextBudget = Field(default_factory=ContextBudget)

    @property
    def terminal(self) -> bool:
        """True once the turn has its outcome; further events change nothing but the audit record."""
        return self.outcome is not None


# The change sets: one key per field of the model, with the field's type (tests/unit/machine/test_draft.py).


class CallChanges(TypedDict, total=False):
    """Fields of a `CallState` to change (`CallState.replace`)."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    index: int
    attempt: int
    task_id: str | None
    dispatched_at: float | None
    started_at: float | None
    worker: str | None
    waiting_approval: bool
    wait: CallWait | None
    waiting_for_worker_since: float | None
    requested: ToolOutcome | None
    outcome: ToolOutcome | None


class RoundChanges(TypedDict, total=False):
    """Fields of a `RoundState` to change (`RoundState.replace`)."""

    index: int
    assistant: AssistantMessage
    calls: list[CallState]


class TurnChanges(TypedDict, total=False):
    """Fields of a `TurnState` to change (`machine.draft.Draft.update`)."""

    version: int
    turn_id: str
    model: str
    models: list[str]
    model_index: int
    instructions: str | None
    model_settings: ModelSettings
    output_schema: dict[str, Any] | None
    agent: str | None
    agents: dict[str, AgentRun]
    sub_agents: list[str]
    handoffs: dict[str, str]
    children: list[ChildTurn]
    parent: ParentLink | None
    max_agent_depth: int
    limits: Limits
    context: dict[str, Any]
    tenant: str
    priority: TurnPriority
    tools_allowed: list[str] | None
    tool_choice: str | None
    stream: bool
    offered: dict[str, ToolSpec]
    catalogue_names: list[str]
    client_tools: list[str]
    history: list[Message]
    status: TurnStatus
    llm_calls: int
    responses: int
    tool_executions: int
    rounds: int
    empty_answer_retries: int
    model_retries: int
    output_retries: int
    awaiting_model: int | None
    current: RoundState | None
    failure_signatures: list[str]
    repeat_streaks: dict[str, int]
    llm_call_records: list[LLMCallRecord]
    usage: Usage
    started_at: float
    deadline_at: float
    lost_grace_s: float
    lost_wait_s: float
    model_retry_base_s: float
    model_retry_cap_s: float
    timers: dict[str, float]
    paused_at: float | None
    approvals: list[ApprovalDecision]
    view_diagnostics: list[ViewRecord]
    late_outcomes: list[LateOutcome]
    stop: PendingStop | None
    outcome: TurnOutcome | None
    context_budget: ContextBudget


def find_call(state: TurnState, call_id: str) -> CallState | None:
    """The call of the current round with this id, if any."""
    if state.current is None:
        return None
    for call in state.current.calls:
        if call.call_id == call_id:
            return call
    return None


def dump_state(
    state: TurnState,
    *,
    history_key: str | None = None,
    log_key: str | None = None,
    log_len: int | None = None,
) -> str:
    """The state as JSON, for Redis: everything but its history and what its log holds (`LOGGED_FIELDS`,
    `STATIC_FIELDS`), which are stored once, in lists (`dump_entries`, `layout.dump_log`).

    The JSON tells how many entries of each list are the state's (`history_len`; `log_len`, by default as
    many as `dump_log` gives for the whole state) and, given their keys, which lists they are, so that a
    reader (`orchestrator.store`) fetches all in one round trip. Built as text: a long turn's step serialises
    its small state only, never what only grows nor what never changes.
    """
    # A terminal state's outcome holds the history and the model calls' records too: left out as well, and
    # restored from the state's own on load.
    excluded: dict[str, Any] = {"history": True, "outcome": {"messages", "llm_call_records"}}
    excluded.update(dict.fromkeys((*LOGGED_FIELDS, *STATIC_FIELDS), True))
    # Fields at their defaults (nulls, zeros, empty lists) are left out as well: a step writes a third less,
    # and loading fills them in again. The version is always written.
    body = state.model_dump_json(exclude=excluded | {"version": True}, exclude_defaults=True)
    head: dict[str, str | int] = {"version": state.version, HISTORY_LEN_FIELD: len(state.history)}
    if history_key is not None:
        head[HISTORY_KEY_FIELD] = history_key
    head[LOG_LEN_FIELD] = len(dump_log(state)) if log_len is None else log_len
    if log_key is not None:
        head[LOG_KEY_FIELD] = log_key
    prefix = json.dumps(head, ensure_ascii=False, separators=(",", ":"))
    return prefix[:-1] + "," + body[1:]


def dump_entries(messages: Sequence[Message]) -> list[str]:
    """Messages as the entries of a history list: one JSON each."""
    return [_MESSAGE.dump_json(message).decode() for message in messages]


def load_state(
    text: str | bytes,
    history: Sequence[str | bytes | Message] | None = None,
    log: Sequence[str | bytes] | None = None,
) -> TurnState:
    """A state from `dump_state`'s JSON, its history and its log; a version this code does not read raises
    `StateVersionError`.

    `history` is the state's messages (as stored in its list: JSON texts, or parsed), `log` its log entries:
    required by a version 3 state, whose JSON holds neither, and ignored by versions 1 and 2, which hold all
    inline. A version 1 or 2 state is upgraded to the current layout (and saved as such by the next step).
    """
    data = json.loads(text)
    version = data.get("version") if isinstance(data, dict) else None
    if version not in SUPPORTED_STATE_VERSIONS:
        raise StateVersionError(version, SUPPORTED_STATE_VERSIONS)
    assert isinstance(data, dict)
    for field in (HISTORY_KEY_FIELD, HISTORY_LEN_FIELD, LOG_KEY_FIELD, LOG_LEN_FIELD):
        data.pop(field, None)
    if version == 1:
        data = upgrade_from_v1(data)
    if version in (1, 2):
        data = {**data, "version": STATE_VERSION}
    else:
        data["history"] = [read_message(m) for m in history or ()]
        data.update(read_log(log or ()))
        if isinstance(data.get("outcome"), dict):
            restored = {"messages": data["history"], "llm_call_records": data["llm_call_records"]}
            data["outcome"] = {**data["outcome"], **restored}
    return TurnState.model_validate(data, context=STORED)
