"""The canonical, provider-neutral conversation model and the shapes of a turn.

Messages are a pydantic union keyed on `role`. Provider continuation data (response ids, reasoning items,
thinking signatures) rides along in `provider_data`, opaque to everything but the provider module that wrote
it, and is re-sent only to that same provider.

Design notes: docs/design/providers.md, "The canonical model"; docs/design/turns.md, "The terminal outcome".
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from workers.contract import (
    DEFAULT_TENANT,
    TENANT_PATTERN,
    ApprovalTimeoutAction,
    FailureKind,
    check_context_size,
)
from workers.records import ForbidsUnknownFields, is_stored, read_known

ParsedT = TypeVar("ParsedT", bound=BaseModel)
FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "unknown"]


class ToolCall(BaseModel):
    """One tool call asked for by a model. `arguments` is always a dict."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    # The provider's own string, when it sent one; kept so a broken one can be shown back verbatim.
    raw_arguments: str | None = None
    # Set when `raw_arguments` was not a JSON object: the call is answered by a `validation` failure.
    arguments_error: str | None = None


class Usage(BaseModel):
    """Token counts of one LLM call, or summed over a turn."""

    model_config = ConfigDict(frozen=True)

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    reasoning_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    # What the call cost, from the price table (`orchestrator.pricing`); None when a model has no price —
    # never a guess. `+` sums what is known; a turn whose calls are not all priced says None itself.
    cost_usd: float | None = None

    def __add__(self, other: Usage) -> Usage:
        def add_optional(a: int | None, b: int | None) -> int | None:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
            reasoning_tokens=add_optional(self.reasoning_tokens, other.reasoning_tokens),
            cache_read_tokens=add_optional(self.cache_read_tokens, other.cache_read_tokens),
            cache_write_tokens=add_optional(self.cache_write_tokens, other.cache_write_tokens),
            cost_usd=_add_floats(self.cost_usd, other.cost_usd),
        )


def _add_floats(a: float | None, b: float | None) -> float | None:
    return None if a is None and b is None else (a or 0.0) + (b or 0.0)


class Turn(BaseModel):
    """One normalised LLM response. `type` is `tool_calls` exactly when a tool call is present."""

    model_config = ConfigDict(frozen=True)

    type: Literal["tool_calls", "final_answer"]
    text: str | None = None
    thinking: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    model: str | None = None
    finish_reason: FinishReason | None = None
    provider: str | None = None
    provider_data: dict[str, Any] = Field(default_factory=dict)


class SystemMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: Literal["system"] = "system"
    content: str


class UserMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: Literal["user"] = "user"
    content: str


class AssistantMessage(BaseModel):
    """An assistant reply: text, optional thinking, optional tool calls, and opaque continuation data."""

    model_config = ConfigDict(frozen=True)

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    thinking: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    provider: str | None = None
    model: str | None = None
    provider_data: dict[str, Any] = Field(default_factory=dict)


class ToolMessage(BaseModel):
    """The answer to one tool call: exactly one per call, in the order of the calls."""

    model_config = ConfigDict(frozen=True)

    role: Literal["tool"] = "tool"
    tool_call_id: str
    name: str
    content: str
    is_error: bool = False
    failure_kind: FailureKind | None = None
    synthetic: bool = False

    @field_validator("failure_kind", mode="before")
    @classmethod
    def _read_newer_failure_kind(cls, value: object, info: ValidationInfo) -> object:
        # A kind a newer release added, in a history it wrote: an error all the same.
        return read_known(value, set(FailureKind), FailureKind.EXECUTION_ERROR) if is_stored(info) else value


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage,
    Field(discriminator="role"),
]


def assistant_message_from_turn(turn: Turn) -> AssistantMessage:
    """The history entry for a model response."""
    return AssistantMessage(
        content=turn.text,
        thinking=turn.thinking,
        tool_calls=list(turn.tool_calls),
        provider=turn.provider,
        model=turn.model,
        provider_data=dict(turn.provider_data),
    )


class ProviderError(BaseModel):
    """A provider's error response or a transport failure, as a value."""

    model_config = ConfigDict(frozen=True)

    provider: str
    status: int | None = None
    type: str | None = None
    code: str | None = None
    message: str
    request_id: str | None = None
    retryable: bool = False
    retry_after_s: float | None = None
    # Provider extras worth keeping for whoever debugs the failure, e.g. Groq's `failed_generation` (the
    # model output it could not parse as a tool call). None when the provider sent none.
    details: dict[str, Any] | None = None


class TurnStatus(StrEnum):
    """Persisted status of a turn."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    STOPPED = "stopped"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in {TurnStatus.COMPLETED, TurnStatus.STOPPED, TurnStatus.FAILED, TurnStatus.CANCELLED}


TurnPriority = Literal["interactive", "normal", "batch"]
"""A turn's lane (`TurnRequest.priority`), in the order they are claimed (`workers.keys.TURN_LANES`)."""
TURN_PRIORITIES: frozenset[str] = frozenset(("interactive", "normal", "batch"))


StopReason = Literal[
    "max_llm_calls",
    "max_tool_executions",
    "max_tool_rounds",
    "deadline",
    "tool_failure",
    "confirmation_denied",
    "policy_denied",
    "repeated_failure",
    "repeat_guard",
    "cancelled",
    "provider_error",
    "empty_answer",
    "invalid_output",
    "max_total_tokens",
    "max_cost",
    "quota_exceeded",
]

LIMIT_STOP_REASONS: frozenset[str] = frozenset(
    {
        "max_llm_calls",
        "max_tool_executions",
        "max_tool_rounds",
        "deadline",
        "max_total_tokens",
        "max_cost",
        "quota_exceeded",
    }
)


# How long a call waits for a person when neither its tool nor its turn says (24 hours).
DEFAULT_APPROVAL_TIMEOUT_S = 86_400.0


class Limits(ForbidsUnknownFields):
    """Per-turn limits and stop policies, each with its default. An unknown one is refused at submit, and
    ignored in a stored turn (one a newer release wrote: `workers.records`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_llm_calls: int = Field(default=10, ge=1)
    max_tool_executions: int = Field(default=50, ge=0)
    max_tool_rounds: int | None = Field(default=None, ge=1)
    deadline_s: float = Field(default=300.0, gt=0)
    stop_on_confirmation_denied: bool = True
    stop_on_policy_denied: bool = True
    stop_on_tool_failure: bool = False
    stop_on_repeated_failure: bool = True
    repeat_guard_rounds: int | None = Field(default=3, ge=2)
    max_empty_answer_retries: int = Field(default=2, ge=0)
    max_model_retries: int = Field(default=3, ge=0)
    # An answer that does not validate against the turn's `output_schema` is sent back this many times.
    max_output_retries: int = Field(default=2, ge=0)
    # Budgets, checked after every model answer and before every model call (stop reasons `max_total_tokens`,
    # `max_cost`); None: no budget.
    max_total_tokens: int | None = Field(default=None, ge=1)
    max_cost_usd: float | None = Field(default=None, gt=0)
    # How long a call may wait for a person (seconds), and what happens then: "deny" (the model reads that
    # no one approved it) or "approve" (it runs). None: the tool's own (`@tool(approval_timeout_s=...)`),
    # else DEFAULT_APPROVAL_TIMEOUT_S and "deny". The wait never counts against `deadline_s`.
    approval_timeout_s: float | None = Field(default=None, gt=0)
    on_approval_timeout: ApprovalTimeoutAction | None = None
    # How long a call of a client-side tool waits for its caller's result (seconds); past it the call's
    # outcome is `timeout`. None: DEFAULT_CLIENT_TOOL_TIMEOUT_S. Never counts against `deadline_s` either.
    client_tool_timeout_s: float | None = Field(default=None, gt=0)
    # How deep sub-agents may nest: a turn's child turns are depth 1, theirs 2, …; a call that would start one
    # deeper is answered with an error saying the depth limit was reached. None: TOOLLOOP_MAX_AGENT_DEPTH.
    max_agent_depth: int | None = Field(default=None, ge=0)


# How long a call of a client-side tool waits for its result when the turn does not say (24 hours).
DEFAULT_CLIENT_TOOL_TIMEOUT_S = DEFAULT_APPROVAL_TIMEOUT_S


class ClientTool(ForbidsUnknownFields):
    """A tool the turn's caller runs itself (a browser action, a local file): offered to the model beside
    the workers' tools, and answered with `submit_tool_result`. Its name must not be a catalogue tool's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    # The JSON Schema of its arguments, which the model sees and the machine validates calls against.
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


ReasoningEffort = Literal["minimal", "low", "medium", "high"]


class ModelSettings(ForbidsUnknownFields):
    """How the model is asked: mapped per provider in its `to_wire`; a setting the target
    provider cannot honour is refused when the turn is submitted, never dropped silently."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    stop: list[str] | None = None
    seed: int | None = None
    reasoning_effort: ReasoningEffort | None = None
    parallel_tool_calls: bool | None = None
    # Provider-specific fields passed through into the request body as they are (e.g. vLLM's `top_k`).
    extra: dict[str, Any] = Field(default_factory=dict)


class ParentLink(ForbidsUnknownFields):
    """A child turn's parent: the turn and the call of it that started the child (a sub-agent's call), and
    how deep the child is (1: a child of a turn that has no parent)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    turn_id: str
    call_id: str
    depth: int = Field(default=1, ge=1)


class ChildTurn(ForbidsUnknownFields):
    """One child turn a turn started (a sub-agent's call), as the parent reports it: which call, which agent,
    its turn, how it ended (None while it runs) and what it used (added into the parent's usage too)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    call_id: str
    agent: str
    turn_id: str
    status: str | None = None
    usage: Usage = Field(default_factory=Usage)


class ChildReport(ForbidsUnknownFields):
    """What a child turn tells its parent when it ends (through the parent's control stream): its turn, how
    it ended, its answer (the final text, or its typed output) or why it failed, and what it used."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    turn_id: str
    status: str
    result: Any = None
    error: str | None = None
    usage: Usage = Field(default_factory=Usage)


class ForkedFrom(ForbidsUnknownFields):
    """Where a fork starts (`Client.fork`): the turn it was forked from, and the index in that turn's
    messages of the message the fork replaced (or re-ran from)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    turn_id: str
    at: int = Field(ge=0)


class TurnRequest(ForbidsUnknownFields):
    """What a web app submits. Durable in Redis before `submit` returns. An unknown field is refused at
    submit, and ignored when a stored request is read (`workers.records`)."""

    model_config = ConfigDict(extra="forbid")

    prompt: str | None = None
    messages: list[Message] = Field(default_factory=list)
    tools: list[str] | None = None
    # Tools the caller runs (`ClientTool`): a call of one waits, parked, for `submit_tool_result`.
    client_tools: list[ClientTool] = Field(default_factory=list)
    # A named agent (`workers.agents`) the turn runs as: its instructions, model, tools, settings and output
    # schema, for each of those the request does not set itself.
    agent: str | None = None
    # Set by the orchestrator on a sub-agent's child turn: the parent turn and call it answers.
    parent: ParentLink | None = None
    # A model (`provider:model` or a tier), or several: the first that answers, in order (fallback).
    model: str | list[str] | None = None
    limits: Limits = Field(default_factory=Limits)
    context: dict[str, Any] = Field(default_factory=dict)
    conversation_id: str | None = None
    tool_choice: str | None = None  # "auto" | "required" | "none" | a tool name
    # Model calls stream their answer as `text_delta` events when the provider can; False asks
    # for plain responses (a proxy that mangles streams, a provider that bills streaming differently).
    stream: bool = True
    # The system prompt of this turn, sent first and kept out of the stored conversation.
    instructions: str | None = None
    model_settings: ModelSettings = Field(default_factory=ModelSettings)
    # A JSON Schema the final answer must satisfy; its parsed JSON is the outcome's `output`.
    output_schema: dict[str, Any] | None = None
    # The submitter's trace (W3C `traceparent`, `tracestate`): the turn's spans continue it. Set by `submit`
    # from the caller's current span, by `POST /v1/turns` from its `traceparent` header; None: no trace.
    # Trace ids, not secrets: shown as they are, so that a person can find the turn's trace.
    trace_context: dict[str, str] | None = None
    # Set by `fork` on the turn it makes (`ForkedFrom`): the original turn and the message index it forked
    # at. `POST /v1/turns` does not take it from a body.
    forked_from: ForkedFrom | None = None
    # Whose turn it is: an HTTP API key sees only its tenant's turns, and tools get it as `ctx.tenant`. A
    # request stored before tenants existed reads as "default".
    tenant: str = Field(default=DEFAULT_TENANT, pattern=TENANT_PATTERN)
    # Which lane the turn waits in, and its tool calls' message priority: "interactive" turns are claimed
    # before "normal" ones, and those before "batch" ones (round robin across tenants within a lane).
    priority: TurnPriority = "normal"
    # The schedule that submitted this turn (`orchestrator.schedules`: one of its runs); None for a turn a
    # caller submitted itself.
    schedule: str | None = None

    @field_validator("client_tools")
    @classmethod
    def _distinct_client_tools(cls, value: list[ClientTool]) -> list[ClientTool]:
        names = [tool.name for tool in value]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"client tools named twice: {', '.join(repeated)}")
        return value

    @field_validator("context")
    @classmethod
    def _context_fits_a_task_message(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        # A stored request is read as it was stored (its calls answer for a context too large themselves).
        if not is_stored(info):
            check_context_size(value)
        return value

    @field_validator("priority", mode="before")
    @classmethod
    def _known_lane(cls, value: Any, info: ValidationInfo) -> Any:
        # A lane a newer release added reads as "normal" in a stored request; a person's is refused.
        if is_stored(info) and value not in TURN_PRIORITIES:
            return "normal"
        return value


class LLMCallRecord(BaseModel):
    """One model call of a turn: kept per call, summed into the turn's usage."""

    model_config = ConfigDict(frozen=True)

    model: str | None = None
    provider: str | None = None
    usage: Usage = Field(default_factory=Usage)
    duration_ms: float = 0.0
    finish_reason: FinishReason | None = None
    error: ProviderError | None = None


class ApprovalDecision(BaseModel):
    """How a call that waited for a person was answered, and by whom: kept in the turn's state, its outcome,
    its view and its archive record."""

    model_config = ConfigDict(frozen=True)

    call_id: str
    tool: str
    approved: bool
    # Who answered, as the answering client said (`approve(..., decided_by=...)`); None when it said
    # nothing, and when no one answered in time (`timed_out`: the wait's `on_approval_timeout` decided).
    decided_by: str | None = None
    reason: str | None = None
    edited: bool = False
    timed_out: bool = False
    at: float
    # How long the call waited for the answer (seconds).
    waited_s: float = 0.0


class TurnOutcome(BaseModel):
    """The terminal shape of a turn: always the same fields."""

    turn_id: str
    status: Literal["completed", "stopped", "failed", "cancelled"]
    stop_reason: StopReason | None = None
    limit_reached: bool = False
    text: str | None = None
    messages: list[Message] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    llm_calls: int = 0
    tool_executions: int = 0
    model: str | None = None
    error: ProviderError | None = None
    llm_call_records: list[LLMCallRecord] = Field(default_factory=list)
    # With an `output_schema`: the final answer's parsed JSON, validated; None otherwise.
    output: Any = None
    # The answers to calls that waited for a person, in the order they came (none: no call waited).
    approvals: list[ApprovalDecision] = Field(default_factory=list)
    # The child turns its sub-agent calls started, in the order they started; `usage` includes theirs.
    children: list[ChildTurn] = Field(default_factory=list)
    # The agent that gave the answer (the turn's own, or the last one it was handed off to); None: no agent.
    agent: str | None = None

    def parse(self, model: type[ParsedT]) -> ParsedT:
        """`output` as an instance of the pydantic `model` (`ValueError` when the turn has no output)."""
        if self.output is None:
            raise ValueError(f"turn {self.turn_id} has no output (status {self.status}, {self.stop_reason})")
        return model.model_validate(self.output)
