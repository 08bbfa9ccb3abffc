"""The multi-step flows of the stores, written once as generators (sans-IO) for the sync and async runners.

A flow yields operations (`orchestrator.store.operations`) and gets each one's parsed reply back; it never
touches Redis or sleeps, and takes the clock it measures deadlines with as an argument, so a test drives it
by hand with made-up replies and times. Blocking reads are cut into steps of at most `cap_ms` (the client's
`block_cap_ms`), so a wait longer than the socket timeout loops until its own deadline instead of failing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.errors import CallNotWaitingError, UnknownAgentError, UnknownToolError, UnknownTurnError
from orchestrator.machine.validation import build_schema_messages
from orchestrator.model import ChildReport, ParentLink, ToolMessage, TurnOutcome, TurnRequest, TurnStatus
from orchestrator.store import cluster, codec, history, operations
from orchestrator.store.agents import get_agents
from orchestrator.store.catalogue import RecentCatalogue, ToolCatalogue, get_catalogue, get_tool_catalogue
from orchestrator.store.codec import TurnEvent
from orchestrator.store.connection import build_block_ms, build_step_ms
from orchestrator.store.effects import Batch, Flow, Item, RedisCommand, Stream
from orchestrator.store.history import Head, Prior
from orchestrator.store.scripts import ControlResult, FinishResult, WriteResult
from orchestrator.store.turn_view import PendingApproval, TurnView
from orchestrator.tenant_limits import NO_CAPS, RunningCaps
from workers import keys
from workers.agents import AgentSpec
from workers.contract import ToolOutcome, ToolSpec, build_listing
from workers.keys import DEFAULT_RETENTION, Retention

Clock = Callable[[], float]

# The longest a claimer with nothing to claim blocks before it looks again without a ready token. Every
# script that queues a turn pushes one (a submit, a woken parked turn, a turn's end that frees a tenant's
# place): the poll is only for a token lost (trimmed, or dropped with Redis's data) and a previous release's
# wake-up, which pushed none. Each look is a claim script of some twenty commands: at 0.5 s an idle
# orchestrator cost Redis ~40 commands a second.
READY_POLL_MS = 2000


class Unread:
    """The type of `UNREAD`."""


# A value not read yet (as opposed to None, a value known to be absent).
UNREAD = Unread()


def check_tool_names(requested: Sequence[str] | None, catalogue: Mapping[str, ToolSpec]) -> None:
    """Every tool a turn names must be known: `UnknownToolError` lists the others.

    `catalogue` is the tools a call may be sent to (`ToolCatalogue.known`): those live workers serve, and
    those a worker served within TOOLLOOP_TOOL_GONE_AFTER_S — a turn submitted while a tool's only worker
    restarts, or a deploy replaces them all, is accepted, and its calls wait in their queue for the next one.
    The rule when no worker has published a catalogue yet (`catalogue` empty: none started, or all gone for
    longer than that): the turn is accepted unchecked, as a Celery task is queued before any worker runs, so
    a web app may submit while its workers start. Its tools are then matched against the catalogue when an
    orchestrator starts the turn. The error lists public tools only.
    """
    if not requested or not catalogue:
        return
    unknown = list(dict.fromkeys(name for name in requested if name not in catalogue))
    if unknown:
        raise UnknownToolError(unknown, (spec.name for spec in build_listing(catalogue.values())))


def check_client_tools(request: TurnRequest, catalogue: Mapping[str, ToolSpec]) -> None:
    """A client-side tool may not take a catalogue tool's name (`ValueError` naming them): a call's name
    says who runs it."""
    clash = sorted(tool.name for tool in request.client_tools if tool.name in catalogue)
    if clash:
        raise ValueError(f"client tools named as catalogue tools: {', '.join(clash)}; rename them")


SubmitCheck = Callable[[TurnRequest], None]
"""What a caller checks of a request before the store takes it (raising `ValueError` to refuse it)."""


def submit(
    request: TurnRequest,
    turn_id: str | None,
    now: float,
    *,
    check: SubmitCheck | None = None,
    recent: RecentCatalogue | None = None,
    tool_gone_after_s: float = keys.TOOL_GONE_AFTER_S,
) -> Flow[str]:
    """Check the request, store and queue it; returns the turn id (a new one unless `turn_id` is given).

    Checked before anything is stored: the request's own rules, what the caller's `check` says of its models
    (`orchestrator.submit_checks.check_submit`: their names, output schema and settings against each
    model's provider, with the submitting process's tiers; the store itself knows no provider), and its
    tools against the catalogue (`check_tool_names`: served now or within `tool_gone_after_s`,
    TOOLLOOP_TOOL_GONE_AFTER_S; read only when the turn names tools, and not when `recent`, the caller's last
    read, has them all), and its client-side tools' names (`check_client_tools`)."""
    codec.check_turn_request(request)
    if check is not None:
        check(request)
    tid = codec.validate_turn_id(turn_id) if turn_id else codec.new_turn_id(request.conversation_id)
    if keys.is_cluster_layout():
        cluster.check_conversation_slot(request, tid)
    agents: Mapping[str, AgentSpec] = {}
    if request.agent is not None and request.parent is None:
        # A child turn's agent was checked when its parent's named it: a parent is never refused its child.
        agents = yield get_agents()
        if request.agent not in agents:
            raise UnknownAgentError(request.agent, agents)
    if request.tools or request.client_tools:
        requested = [name for name in request.tools or [] if name not in agents]
        catalogue = recent.serving(requested, now, tool_gone_after_s) if recent is not None else None
        if catalogue is None:
            tools: ToolCatalogue = yield get_tool_catalogue(now)
            if recent is not None:
                recent.keep(tools, now)
            catalogue = tools.known(now, tool_gone_after_s)
        check_tool_names(requested, catalogue)
        check_client_tools(request, catalogue)
    if keys.is_cluster_layout():
        yield from cluster.submit(request, tid, now)
    else:
        yield operations.submit(request, tid, now)  # EXISTS too is success: a retried submit is a no-op
    return tid


def claim(
    orchestrator_id: str,
    *,
    timeout_s: float,
    ttl_ms: int,
    cap_ms: int,
    clock: Clock,
    caps: RunningCaps = NO_CAPS,
) -> Flow[codec.ClaimedTurn | None]:
    """The next queued turn, leased to `orchestrator_id`, with what adopting it reads first; None when none
    came within `timeout_s`.

    One script picks and leases it (`operations.claim`: lanes in order, tenants in turn, a tenant at its cap
    passed over); with nothing to claim, the flow blocks on the ready tokens a submit, a woken turn or a
    turn's end pushes, and tries again when one comes, or unprompted every `READY_POLL_MS` (a token lost, a
    turn a previous release woke). A wait that reaches `timeout_s` ends without trying again: a caller in a
    loop tries first thing."""
    deadline = clock() + timeout_s
    if keys.is_cluster_layout():
        step_cap_ms = min(cap_ms, READY_POLL_MS)
        return (
            yield from _claim_on_cluster(
                orchestrator_id, deadline, clock, ttl_ms=ttl_ms, step_cap_ms=step_cap_ms, caps=caps
            )
        )
    while True:
        claimed = yield operations.claim(orchestrator_id, ttl_ms, caps)
        if isinstance(claimed, codec.ClaimedTurn):
            return claimed
        if isinstance(claimed, codec.ClaimAgain):
            continue
        poll_at = clock() + READY_POLL_MS / 1000
        while True:
            step_ms = build_step_ms(min(deadline, poll_at), clock(), cap_ms)
            if step_ms is None:
                if clock() >= deadline:
                    return None
                break  # the unprompted look is due
            if (yield operations.wait_ready(step_ms / 1000)):
                break


def _claim_on_cluster(
    orchestrator_id: str, deadline: float, clock: Clock, *, ttl_ms: int, step_cap_ms: int, caps: RunningCaps
) -> Flow[codec.ClaimedTurn | None]:
    # `claim` on a cluster's sharded queue: wait for a ready token and pick in the shard it names; a step with
    # no token looks over every shard (a turn whose token was lost, a woken one whose token was trimmed).
    shards: list[keys.QueueShard] = []
    while True:
        for shard in shards:
            claimed = yield from cluster.claim_in(shard, orchestrator_id, ttl_ms, caps)
            if claimed is not None:
                return claimed
        step_ms = build_step_ms(deadline, clock(), step_cap_ms)
        if step_ms is None:
            return None
        woken: keys.QueueShard | None = yield cluster.wait_ready(step_ms / 1000)
        shards = [woken] if woken is not None else (yield cluster.find_queued_shards())


def wait_reply(reply_key: str, timeout_s: float, *, cap_ms: int, clock: Clock) -> Flow[bool]:
    """Block on a direct call's reply list, in steps of at most `cap_ms`; False when `timeout_s` passed."""
    deadline = clock() + timeout_s
    while (step_ms := build_step_ms(deadline, clock(), cap_ms)) is not None:
        if (yield operations.pop_reply(reply_key, step_ms / 1000)):
            return True
    return False


def conversation_history(conversation_id: str) -> Flow[Prior]:
    """The history of the conversation's last finished turn (none for a new conversation), in one round trip;
    a conversation last written by the previous layout (its head the bare id of a turn whose outcome holds the
    messages) in two."""
    head: Head = yield history.get_conversation_head(conversation_id)
    if head.prior is not None:
        return head.prior
    if head.legacy_turn_id is None:
        return Prior([], [])
    outcome: TurnOutcome | None = yield history.get_outcome(head.legacy_turn_id)
    # Not in the conversation's list yet: the next turn's first save writes them there.
    return Prior(list(outcome.messages) if outcome else [], [])


def save_outcome(
    turn_id: str,
    outcome: TurnOutcome,
    conversation_id: str | Unread | None,
    now: float,
    retention: Retention = DEFAULT_RETENTION,
    *,
    orchestrator_id: str | None = None,
    tenant: str | None = None,
) -> Flow[FinishResult]:
    """The terminal write (releasing `orchestrator_id`'s lease); the turn's conversation is read from its
    request when `UNREAD`, and its tenant when None (its owner knows both)."""
    if isinstance(conversation_id, Unread):
        request: TurnRequest | None = yield operations.get_request(turn_id)
        conversation_id = request.conversation_id if request else None
        tenant = request.tenant if request else tenant
    result: FinishResult = yield operations.save_outcome(
        turn_id, outcome, conversation_id, now, retention, orchestrator_id=orchestrator_id, tenant=tenant
    )
    if keys.is_cluster_layout():
        # Whichever terminal write won: the first one's owner may have died.
        home = cluster.Home(tenant, conversation_id) if tenant is not None else None
        yield from cluster.end(turn_id, now, home=home)
    return result


def write_outcome(outcome: ToolOutcome, retention: Retention = DEFAULT_RETENTION) -> Flow[ToolOutcome]:
    """First writer wins: the outcome stored for the call, `outcome` or an earlier one."""
    stored = operations.pack_outcome(outcome)  # compressed once, for the record and the notification alike
    result, owner = yield operations.write_outcome(outcome, retention, stored)
    if owner is not None:
        yield operations.notify_owner(owner, outcome, stored)
    if result is WriteResult.WON:
        return outcome
    winner: ToolOutcome | None = yield operations.get_tool_outcome(outcome.call_id, outcome.turn_id)
    return winner if winner is not None else outcome


def send_control(
    turn_id: str,
    kind: str,
    call_id: str | None,
    approved: bool | None,
    now: float,
    *,
    arguments: Mapping[str, Any] | None = None,
    reason: str | None = None,
    decided_by: str | None = None,
    result_json: str | None = None,
) -> Flow[bool]:
    """Record a cancel, an approval or a client-side tool's answer for the turn's owner (a parked turn is
    woken): False when the turn had ended already; `CallNotWaitingError` for an answer about a call answered
    already."""
    result = yield operations.control(
        turn_id,
        kind,
        call_id,
        approved,
        now,
        arguments=arguments,
        reason=reason,
        decided_by=decided_by,
        result=result_json,
    )
    if isinstance(result, operations.OwnerToTell):
        result = yield from cluster.tell_owner(turn_id, result)
    if result is ControlResult.UNKNOWN:
        raise UnknownTurnError(turn_id)
    if result is ControlResult.DECIDED:
        raise CallNotWaitingError(turn_id, call_id or "", decided=True, waiting_for=kind)
    return result is ControlResult.RECORDED


def send_approval(
    turn_id: str,
    call_id: str,
    approved: bool,
    now: float,
    *,
    arguments: Mapping[str, Any] | None = None,
    reason: str | None = None,
    decided_by: str | None = None,
) -> Flow[bool]:
    """Approve (with the person's edited `arguments`, run instead of the model's) or deny (with a `reason`
    the model sees) a call waiting for confirmation; False when the turn had ended already. `decided_by` (who
    answered) and `reason` are kept in the turn's `approvals`, for either answer.

    A running turn must be waiting for this call (`CallNotWaitingError` otherwise: an unknown call, or one
    answered already — the first answer stands). Edited arguments are checked first, when they can be,
    against the tool's schema in the live catalogue (`ValueError` naming what is wrong); the turn's
    orchestrator validates them again before it runs them."""
    if not call_id:
        raise ValueError("call_id must not be empty")
    if arguments is not None:
        if not approved:
            raise ValueError("'arguments' edit a call that is approved; a denial says why in 'reason'")
        codec.dump_control_arguments(arguments)  # what JSON cannot carry is refused before any read
    view: TurnView = yield operations.require_view(turn_id)
    if not view.status.terminal:
        waiting = _find_waiting(view, call_id, "approval")
        if waiting is None:
            # A call a sub-agent's child turn waits on is approved through its parent too.
            child = yield from _find_waiting_child(view, call_id)
            if child is None:
                raise CallNotWaitingError(turn_id, call_id, decided=_was_answered(view, call_id, "approval"))
            flow = send_approval(
                child, call_id, approved, now, arguments=arguments, reason=reason, decided_by=decided_by
            )
            return (yield from flow)
        if arguments is not None:
            yield from check_edited_arguments(waiting.tool, arguments, now)
    flow = send_control(
        turn_id,
        "approval",
        call_id,
        approved,
        now,
        arguments=arguments,
        reason=reason,
        decided_by=decided_by,
    )
    return (yield from flow)


def _find_waiting_child(view: TurnView, call_id: str, depth: int = 0) -> Flow[str | None]:
    """The running child turn (or grandchild…) of `view`'s turn whose call `call_id` waits for a person."""
    if depth > MAX_APPROVAL_DEPTH:
        return None
    for child in view.children:
        if child.status is not None:
            continue
        child_view: TurnView | None = yield operations.get_view(child.turn_id)
        if child_view is None or child_view.status.terminal:
            continue
        if _find_waiting(child_view, call_id, "approval") is not None:
            return child.turn_id
        deeper = yield from _find_waiting_child(child_view, call_id, depth + 1)
        if deeper is not None:
            return deeper
    return None


# How many generations of child turns an approval is looked for in (sub-agents nest a few levels).
MAX_APPROVAL_DEPTH = 8


def _find_waiting(view: TurnView, call_id: str, waiting_for: str) -> PendingApproval | None:
    return next(
        (p for p in view.pending_approvals if p.call_id == call_id and p.waiting_for == waiting_for), None
    )


# What a waiting call may wait for that an answer reaches (`approve`, `submit_tool_result`); a call waiting on
# its sub-agent's child turn ("child_turn") is answered by the child's end.
_ANSWERABLE = frozenset({"approval", "client_result"})


def _was_answered(view: TurnView, call_id: str, waiting_for: str) -> bool:
    # A call that waits no more because its answer was taken (a second answer is refused as `decided`):
    # an approval is in the turn's decisions, a client-side tool's result in its history.
    if waiting_for == "approval":
        return any(decision.call_id == call_id for decision in view.approvals)
    client_tools = {tool.name for tool in view.request.client_tools}
    return any(
        isinstance(message, ToolMessage) and message.tool_call_id == call_id and message.name in client_tools
        for message in view.messages
    )


def send_client_result(
    turn_id: str, call_id: str, now: float, *, result: Any = None, error: str | None = None
) -> Flow[bool]:
    """Answer a call of a client-side tool with its `result` (any JSON: what the model reads as the tool's
    output) or an `error` (a message, what the model reads as its failure); False when the turn had ended.

    The answer is checked first (`ValueError`: both or a blank error, a value JSON cannot carry, a result
    over `codec.CLIENT_RESULT_MAX_BYTES` as shown to the model). A running turn must be waiting for this
    call's result (`CallNotWaitingError` otherwise: an unknown call, or one answered already — the first
    answer stands)."""
    if not call_id:
        raise ValueError("call_id must not be empty")
    if error is not None and result is not None:
        raise ValueError("send either 'result' or 'error', not both")
    if error is not None and not error.strip():
        raise ValueError("'error' must not be blank")
    result_json = (
        None if error is not None else codec.dump_client_result(result, codec.CLIENT_RESULT_MAX_BYTES)
    )
    view: TurnView = yield operations.require_view(turn_id)
    if not view.status.terminal and _find_waiting(view, call_id, "client_result") is None:
        answered = _was_answered(view, call_id, "client_result")
        raise CallNotWaitingError(turn_id, call_id, decided=answered, waiting_for="client_result")
    flow = send_control(turn_id, "client_result", call_id, None, now, reason=error, result_json=result_json)
    return (yield from flow)


def send_child_result(parent: ParentLink, report: ChildReport, now: float) -> Flow[bool]:
    """Tell a child turn's parent that the child ended: `report` for the parent's call that started it. False
    when the parent has ended or is gone, or was told already (the first report stands)."""
    try:
        flow = send_control(
            parent.turn_id, "child_result", parent.call_id, None, now, result_json=report.model_dump_json()
        )
        return (yield from flow)
    except (UnknownTurnError, CallNotWaitingError):
        return False


def get_progress(turn_id: str) -> Batch[tuple[str, TurnStatus | None]]:
    """The id of the turn's newest event ("0": none yet) and its status, in one round trip.

    No MULTI (two commands fewer a wait): the id is read first and a status only moves on, so a status not
    terminal yet was not terminal when the id was read either, and the `turn_finished` it will be written
    with comes after that id."""
    newest = RedisCommand(
        ("XREVRANGE", keys.turn_events(turn_id), "+", "-", "COUNT", 1),
        lambda entries: codec.text(entries[0][0]) if entries else "0",
    )
    status = RedisCommand(("GET", keys.turn_status(turn_id)), codec.parse_status)
    return Batch((newest, status), lambda replies: (replies[0], replies[1]))


def wait_outcome(turn_id: str, timeout_s: float, *, cap_ms: int, clock: Clock) -> Flow[TurnOutcome]:
    """Block on the events stream (no tight polling) until the turn is terminal; else `TimeoutError`.

    Each read blocks at most `cap_ms`, so a turn silent for longer (a long tool, a wait for approval) never
    trips the Redis client's socket timeout. The outcome is read only when there is one to read: the turn
    terminal when the wait starts (its status, read with the newest event id), after `turn_finished`, or
    after a quiet read (the turn may have ended or expired unseen)."""
    deadline = clock() + timeout_s
    after, status = yield get_progress(turn_id)
    look = status is not None and status.terminal
    while True:
        if status is None:
            raise UnknownTurnError(turn_id)
        if look:
            outcome: TurnOutcome | None = yield history.get_outcome(turn_id)
            if outcome is not None:
                return outcome
        step_ms = build_step_ms(deadline, clock(), cap_ms)
        if step_ms is None:
            raise TimeoutError(f"turn {turn_id} did not finish within {timeout_s:g} s")
        batch: list[TurnEvent] = yield operations.read_events(turn_id, after, step_ms)
        if batch:
            after = batch[-1].id
            # The outcome is stored together with `turn_finished`: a batch without it (a turn writes a dozen
            # events or more) is no reason to read the outcome.
            look = any(event.name == codec.TURN_FINISHED for event in batch)
        else:
            status = yield operations.get_status(turn_id)
            look = status is not None and status.terminal


def follow_events(turn_id: str, after: str, *, block_ms: int | None, cap_ms: int) -> Stream[TurnEvent]:
    """Item every event from `after` on, as they come, ending after `turn_finished` (UnknownTurnError).

    However long the turn stays silent: each read blocks at most `block_ms` (default and cap: `cap_ms`),
    then the turn's status is checked and the next read starts."""
    if (yield operations.get_status(turn_id)) is None:
        raise UnknownTurnError(turn_id)
    while True:
        # Checked before the read: the terminal status and `turn_finished` are written together, so a turn
        # that had ended already has all its events in the stream for this read to return.
        status = yield operations.get_status(turn_id)
        ended = status is None or status.terminal
        block = None if ended else build_block_ms(block_ms or cap_ms, cap_ms)
        batch: list[TurnEvent] = yield operations.read_events(turn_id, after, block)
        for event in batch:
            yield Item(event)
            if event.name == codec.TURN_FINISHED:
                return
        if batch:
            after = batch[-1].id
        elif ended:
            return  # ended (or expired) and its turn_finished is not in the stream any more


def list_pending(limit: int = 1000) -> Flow[list[tuple[str, PendingApproval]]]:
    """Every call waiting for an answer (a person's approval, a client-side tool's result), with its turn's
    id, the longest waiting first (`toolloop pending`):
    the active turns' statuses in one round trip, then the view of each waiting one (at most `limit`)."""
    statuses: list[tuple[str, TurnStatus | None]]
    if keys.is_cluster_layout():
        statuses = yield from cluster.read_active_statuses()
    else:
        statuses = yield operations.read_active_statuses()
    found: list[tuple[str, PendingApproval]] = []
    for turn_id, status in statuses:
        if status is not TurnStatus.WAITING:
            continue
        view: TurnView | None = yield operations.get_view(turn_id)
        if view is not None:
            # A call waiting on its sub-agent's child turn is no one's to answer: the child's own waiting
            # calls are listed under the child.
            found += [(turn_id, p) for p in view.pending_approvals if p.waiting_for in _ANSWERABLE]
        if len(found) >= limit:
            break
    found.sort(key=lambda item: item[1].since if item[1].since is not None else 0.0)
    return found[:limit]


def check_edited_arguments(tool: str, arguments: Mapping[str, Any], now: float) -> Flow[None]:
    """`ValueError` when edited arguments fail the schema of `tool`, the tool of the call waiting for
    approval; unchecked (left to the orchestrator) when no live worker serves it."""
    catalogue: dict[str, ToolSpec] = yield get_catalogue(now)
    spec = catalogue.get(tool)
    problems = build_schema_messages(spec.name, spec.parameters, arguments) if spec is not None else []
    if problems:
        raise ValueError(f"arguments: invalid arguments for '{tool}': " + "; ".join(problems))
