"""Forking a turn: a new turn whose history is an earlier turn's up to one of its messages, that message
replaced (an edited tool result, another user prompt) or kept, and which runs on from there with the
original's request — `Client.fork`, `POST /v1/turns/{id}/fork`, `toolloop fork`.

The fork's history is the original's messages `[0, at)`, then `replace` (or, without one, the original's
message `at` itself: forking "at k" without a replacement re-runs everything after message k). Its next step
is a model call, so the history must end where a model answers: a user message or a tool result. A tool
result must answer a call of the assistant message its round starts with, one not answered before it; the
round's other results follow it as the original has them, so that no call goes to the model without its
result. The request is the original's (tools, limits, model settings, output schema, context, tenant,
priority …) with `model` and `instructions` replaced when given; it joins no conversation (a fork is a
branch: it must not move the conversation's head), continues the caller's trace, not the original's, and
is nobody's sub-agent nor a schedule's run.

The original is only read: its request, status, state or outcome and the history list they reference, in one
round trip (`read_history.lua`), unredacted — what is copied is what ran, never a view's `***`. A finished
turn and a running one alike: a running turn's stored history holds its completed rounds.

The fork's messages are copied into its request, not shared with the original's list: a stored history is one
append-only list per turn (or conversation) referenced as `(key, length)`, and the original's list goes on
past `at`, so the fork cannot append to it; sharing the prefix would need a reference made of two lists in
every reader and writer of the layout, and would keep the original's list — its whole history, not only the
prefix — alive as long as the fork, past the retention the original was stored under. A copy lives and
expires with the fork: it keeps working when the original has expired.

Both link to each other: the fork's request says `forked_from` (`ForkedFrom`: turn id, index), and the
original's forks are a sorted set (`workers.keys.turn_forks`) written after the fork is stored, with the
original's retention (`build_links_ttl_ms`), and read beside its view (`read_view`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from orchestrator.errors import UnknownTurnError
from orchestrator.machine.state import load_state
from orchestrator.model import (
    AssistantMessage,
    ForkedFrom,
    Message,
    ToolMessage,
    TurnRequest,
    TurnStatus,
    UserMessage,
)
from orchestrator.store import codec, flows, history, operations
from orchestrator.store.catalogue import RecentCatalogue
from orchestrator.store.effects import Flow, RedisCommand, ScriptCall, Transaction
from orchestrator.store.scripts import READ_HISTORY
from orchestrator.store.turn_view import (
    ForkLink,
    TurnView,
    build_initial_messages,
    parse_state_messages,
    view_keys,
)
from workers import keys

_MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)
# What a turn's request keeps of where it came from, none of which a fork is: a sub-agent's child (its parent
# waits for the original, not for the fork) or a schedule's run. Left out by name: a field this release does
# not know is not dumped anyway.
_NOT_INHERITED = {
    "prompt",
    "messages",
    "conversation_id",
    "trace_context",
    "forked_from",
    "parent",
    "schedule",
}


@dataclass(frozen=True)
class ForkSource:
    """What a fork reads of the original: its request, status and messages as stored (unredacted)."""

    turn_id: str
    request: TurnRequest
    status: TurnStatus
    messages: list[Message]


# --- pure ---------------------------------------------------------------------------------------------------


def parse_replacement(replace: Message | Mapping[str, Any] | None) -> Message | None:
    """`replace` as a message (a model, or a dict with its `role`); `ValueError` naming what is wrong."""
    if replace is None or isinstance(replace, UserMessage | AssistantMessage | ToolMessage):
        return replace
    if isinstance(replace, Mapping):
        try:
            return _MESSAGE.validate_python(dict(replace))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'message'}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"replace: not a message ({problems})") from None
    try:
        return _MESSAGE.validate_python(replace)
    except ValidationError:
        raise ValueError(f"replace: not a message but {type(replace).__name__}") from None


def _open_round(messages: Sequence[Message]) -> tuple[AssistantMessage, set[str]] | None:
    """The assistant message whose round of tool results `messages` end in, and its calls still without a
    result; None when they do not end in a round (or the round is complete)."""
    answered: set[str] = set()
    for message in reversed(messages):
        if isinstance(message, ToolMessage):
            answered.add(message.tool_call_id)
            continue
        if isinstance(message, AssistantMessage) and message.tool_calls:
            open_ids = {call.id for call in message.tool_calls} - answered
            return (message, open_ids) if open_ids else None
        return None
    return None


def _check_tool_result(prefix: Sequence[Message], result: ToolMessage, at: int) -> None:
    opened = _open_round(prefix)
    if opened is None:
        raise ValueError(
            f"replace: a tool result must answer a call of the assistant message before it; message {at} "
            "follows no tool call waiting for a result"
        )
    assistant, open_ids = opened
    call = next((c for c in assistant.tool_calls if c.id == result.tool_call_id), None)
    if call is None or call.id not in open_ids:
        waiting = ", ".join(c.id for c in assistant.tool_calls if c.id in open_ids)
        raise ValueError(
            f"replace: tool_call_id {result.tool_call_id!r} answers no call waiting at message {at} "
            f"(calls waiting for a result there: {waiting})"
        )
    if result.name != call.name:
        raise ValueError(f"replace: call {call.id!r} is a call of {call.name!r}, not of {result.name!r}")


def build_fork_history(messages: Sequence[Message], at: int, replace: Message | None) -> list[Message]:
    """The history a fork at message `at` starts from: `messages[:at]`, then `replace` (else `messages[at]`),
    then — after a tool result — the rest of its round's results as the original has them.

    `ValueError` for an `at` out of range, a replacement that does not fit where it goes (a tool result
    answering no waiting call, anything but a tool result inside a round), and a history that does not end
    where a model answers (a user message or a tool result)."""
    if not 0 <= at < len(messages):
        last = f"0 to {len(messages) - 1}" if messages else "none yet"
        raise ValueError(f"at: {at} is out of range: the turn has {len(messages)} messages ({last})")
    prefix = list(messages[:at])
    chosen = replace if replace is not None else messages[at]
    if isinstance(chosen, ToolMessage):
        _check_tool_result(prefix, chosen, at)
    elif _open_round(prefix) is not None:
        raise ValueError(
            f"at: message {at} is inside a round of tool results: only a tool result of that round fits there"
        )
    built = [*prefix, chosen]
    if isinstance(chosen, ToolMessage):
        for later in messages[at + 1 :]:
            opened = _open_round(built)
            if opened is None or not isinstance(later, ToolMessage):
                break
            if later.tool_call_id in opened[1]:
                built.append(later)
        opened = _open_round(built)
        if opened is not None:
            raise ValueError(f"replace: calls left without a result: {', '.join(sorted(opened[1]))}")
    if not isinstance(chosen, UserMessage | ToolMessage):
        hint = f" (to have the model answer again, fork at {at - 1})" if at > 0 else ""
        raise ValueError(
            f"at: a fork runs on with a model call, which answers a user message or tool results; message "
            f"{at} would be a {chosen.role} message{hint}"
        )
    return built


def build_fork_request(
    source: ForkSource,
    at: int,
    replace: Message | None,
    *,
    model: str | Sequence[str] | None = None,
    instructions: str | None = None,
) -> TurnRequest:
    """The fork's request: the original's, its history `build_fork_history`'s, linked back (`forked_from`),
    with `model` and `instructions` replacing the original's when given (`ValueError` if bad)."""
    messages = build_fork_history(source.messages, at, replace)
    fields = source.request.model_dump(exclude=_NOT_INHERITED)
    fields |= {"messages": messages, "forked_from": ForkedFrom(turn_id=source.turn_id, at=at)}
    if model is not None:
        fields["model"] = model if isinstance(model, str) else list(model)
    if instructions is not None:
        fields["instructions"] = instructions
    return TurnRequest.model_validate(fields)


def parse_source(turn_id: str, raw: Sequence[Any]) -> ForkSource:
    """The original as `read_source` reads it (request, status, state, outcome, then the history and log its
    outcome or state references); `UnknownTurnError` when it is not stored."""
    request, status = codec.parse_request(raw[0]), codec.parse_status(raw[1])
    if request is None or status is None:
        raise UnknownTurnError(turn_id)
    outcome = history.parse_outcome(raw[3], raw[4])
    if outcome is not None:
        messages = list(outcome.messages)
    elif raw[2] is not None:
        messages = _parse_state_history(turn_id, raw[2], raw[4], raw[5])
    else:
        messages = build_initial_messages(request)  # queued: nobody has started it
    return ForkSource(turn_id, request, status, messages)


def _parse_state_history(
    turn_id: str, state: Any, entries: Sequence[Any], log: Sequence[Any]
) -> list[Message]:
    try:
        return list(
            load_state(codec.text(state), history.read_entries(entries), [codec.text(e) for e in log]).history
        )
    except ValueError:
        inline = parse_state_messages(state)  # a layout this release reads only for its messages
    if inline is None:
        raise ValueError(f"turn {turn_id!r} has a state this release cannot read: fork it once it has ended")
    return inline


def build_link_member(fork_id: str, at: int) -> str:
    """The member of the original's forks set for one fork: the same text for the same fork, so that a
    retried link adds it once."""
    return json.dumps({"at": at, "turn_id": fork_id}, sort_keys=True, separators=(",", ":"))


def parse_fork_links(reply: Sequence[Any]) -> list[ForkLink]:
    """The forks set as read (`ZRANGE … WITHSCORES`: member, score, …), oldest first; a member this release
    cannot read is skipped."""
    links: list[ForkLink] = []
    for member, score in _score_pairs(reply):
        try:
            data = json.loads(codec.text(member))
            links.append(ForkLink(turn_id=str(data["turn_id"]), at=int(data["at"]), forked_at=float(score)))
        except (ValueError, KeyError, TypeError):
            continue
    return links


def _score_pairs(reply: Sequence[Any]) -> list[tuple[Any, Any]]:
    flat = list(reply)
    if flat and isinstance(flat[0], list | tuple):  # RESP3 pairs them itself
        return [(pair[0], pair[1]) for pair in flat]
    return list(zip(flat[::2], flat[1::2], strict=True))


def build_links_ttl_ms(request_ttl_ms: int, links_ttl_ms: int, *, turn_ttl_s: int, deadline_s: float) -> int:
    """How long the original's forks set lives (ms), from the `PTTL`s of the original's request and of the
    set: as long as the request when it has an expiry (the original has ended), else — the original still
    running, its keys not expiring yet — `turn_ttl_s` plus its deadline; never shorter than the set has."""
    wanted = request_ttl_ms if request_ttl_ms > 0 else int((turn_ttl_s + deadline_s) * 1000)
    return max(wanted, links_ttl_ms)


# --- operations ---------------------------------------------------------------------------------------------


def read_source(turn_id: str) -> ScriptCall[ForkSource]:
    """The original's request, status and messages in one round trip (`read_history.lua`: its outcome's
    history, else its state's); the reply raises `UnknownTurnError` for an unknown turn."""
    # The view's keys (request, status, state, outcome): the outcome's reference first, then the state's.
    keys_ = tuple(view_keys(turn_id))
    return ScriptCall(READ_HISTORY, keys_, ("4", "3"), lambda raw: parse_source(turn_id, raw))


def read_links(turn_id: str) -> RedisCommand[list[ForkLink]]:
    """The forks made of a turn, oldest first."""
    return RedisCommand(("ZRANGE", keys.turn_forks(turn_id), 0, -1, "WITHSCORES"), parse_fork_links)


def read_link_ttls(turn_id: str) -> Transaction[tuple[int, int]]:
    """The `PTTL`s of the original's request and of its forks set (-2: missing, -1: no expiry)."""
    commands = (("PTTL", keys.turn_request(turn_id)), ("PTTL", keys.turn_forks(turn_id)))
    return Transaction(commands, lambda r: (int(r[0]), int(r[1])))


def write_link(turn_id: str, fork_id: str, at: int, now: float, ttl_ms: int) -> Transaction[None]:
    """Add the fork to the original's forks set (once: `NX` keeps when it was first made) and set the set's
    expiry."""
    key = keys.turn_forks(turn_id)
    commands = (("ZADD", key, "NX", repr(now), build_link_member(fork_id, at)), ("PEXPIRE", key, ttl_ms))
    return Transaction(commands, lambda _: None)


# --- flows --------------------------------------------------------------------------------------------------


def fork(
    turn_id: str,
    at: int,
    replace: Message | Mapping[str, Any] | None,
    now: float,
    *,
    model: str | Sequence[str] | None = None,
    instructions: str | None = None,
    fork_id: str | None = None,
    check: flows.SubmitCheck | None = None,
    prepare: Callable[[TurnRequest], TurnRequest] | None = None,
    recent: RecentCatalogue | None = None,
    tool_gone_after_s: float = keys.TOOL_GONE_AFTER_S,
    turn_ttl_s: int = keys.TURN_TTL_S,
) -> Flow[str]:
    """Fork turn `turn_id` at message `at`: store and queue the fork, link the two; returns the fork's id.

    `fork_id` is the caller's id for the fork (None: a new one): a fork repeated with it, as a client retrying
    after a lost answer does, stores it once; an id another turn holds is a `ValueError`. The fork is checked
    as any submit is (`flows.submit`: `check` for its models, its tools against the catalogue); `prepare`
    gives it what the caller adds to a request (its trace context). `turn_ttl_s` is the retention of the
    original's keys once it ends (TOOLLOOP_TURN_TTL_S), which its forks set follows."""
    replacement = parse_replacement(replace)
    source: ForkSource = yield read_source(turn_id)
    request = build_fork_request(source, at, replacement, model=model, instructions=instructions)
    if prepare is not None:
        request = prepare(request)
    fid = codec.validate_turn_id(fork_id) if fork_id else codec.new_turn_id()
    if fork_id:
        held: TurnRequest | None = yield operations.get_request(fid)
        if held is not None and held.forked_from != request.forked_from:
            raise ValueError(f"fork_id: turn id {fid!r} is another turn's")
    submitted = yield from flows.submit(
        request, fid, now, check=check, recent=recent, tool_gone_after_s=tool_gone_after_s
    )
    request_ttl_ms, links_ttl_ms = yield read_link_ttls(turn_id)
    if request_ttl_ms != -2:  # the original expired meanwhile: nothing left to list its forks
        ttl_ms = build_links_ttl_ms(
            request_ttl_ms, links_ttl_ms, turn_ttl_s=turn_ttl_s, deadline_s=source.request.limits.deadline_s
        )
        yield write_link(turn_id, submitted, at, now, ttl_ms)
    return submitted


def read_view(turn_id: str) -> Flow[TurnView]:
    """A turn's view (`operations.require_view`) with the forks made of it: what the clients' `get` shows."""
    view: TurnView = yield operations.require_view(turn_id)
    links: list[ForkLink] = yield read_links(turn_id)
    return view.model_copy(update={"forks": links}) if links else view
