"""The stored history: append-only lists of messages, and the references to them (pure, no I/O).

A turn's messages are stored once, one JSON each (compressed when large: `workers.packing`), in a Redis list
(`workers.keys.history`): its conversation's, shared by the conversation's turns, or its own. Whatever holds a
history refers to the list instead of copying it: the machine's state
(`orchestrator.machine.state.dump_state`), the terminal outcome and the conversation's head hold `history_key`
(the list) and `history_len` (its first so many entries are theirs: the list only grows, so a reference stays
true). `read_history.lua` reads a value and the history it references in one round trip; the parsers here put
the messages back, so every reader gets a `TurnOutcome` with all its `messages`.

Values written by the previous layout hold their messages inline (a version 2 state, an outcome with
`messages`, a head holding a bare turn id): they are read as they are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import TypeAdapter

from orchestrator.machine.layout import HISTORY_KEY_FIELD, HISTORY_LEN_FIELD
from orchestrator.model import Message, TurnOutcome, TurnRequest
from orchestrator.store import codec
from orchestrator.store.effects import ScriptCall
from orchestrator.store.scripts import READ_HISTORY
from workers import keys, packing
from workers.contract import ToolOutcome
from workers.records import STORED

T = TypeVar("T")
_MESSAGES = TypeAdapter(list[Message])


def read_entries(entries: Sequence[Any]) -> list[str]:
    """A history list's entries as read (compressed when large: `workers.packing`) as their JSON texts."""
    return [packing.unpack(e) for e in entries]


def parse_messages(entries: Sequence[Any]) -> list[Message]:
    """List entries (JSON texts, or as read) as messages."""
    return _MESSAGES.validate_json("[" + ",".join(read_entries(entries)) + "]", context=STORED)


def _with_reference(body: str, history_key: str, history_len: int) -> str:
    # The reference goes first, so that a JSON object stays one (`body` is one: "{...}").
    head = json.dumps({HISTORY_KEY_FIELD: history_key, HISTORY_LEN_FIELD: history_len}, ensure_ascii=False)
    return head[:-1] + ("," + body[1:] if body != "{}" else "}")


def dump_outcome(outcome: TurnOutcome, history_key: str) -> str:
    """The stored outcome: everything but its messages, which are the list's first `len(messages)`."""
    body = outcome.model_dump_json(exclude={"messages"})
    return _with_reference(body, history_key, len(outcome.messages))


def parse_outcome(raw: bytes | str | None, history: Sequence[Any]) -> TurnOutcome | None:
    """A stored outcome with its messages: from `history` (the entries its reference points to) when it has a
    reference, else inline (the previous layout, and lost turns' records)."""
    if raw is None:
        return None
    data = json.loads(raw)
    if isinstance(data, dict) and HISTORY_KEY_FIELD in data:
        data.pop(HISTORY_KEY_FIELD)
        data.pop(HISTORY_LEN_FIELD, None)
        outcome = TurnOutcome.model_validate(data, context=STORED)
        return outcome.model_copy(update={"messages": parse_messages(history)})
    return TurnOutcome.model_validate(data, context=STORED)


def dump_head(turn_id: str, history_key: str, history_len: int) -> str:
    """A conversation's head: its last finished turn and that turn's history."""
    return _with_reference(json.dumps({"turn_id": turn_id}), history_key, history_len)


@dataclass(frozen=True)
class Appended:
    """The messages a step adds to its history list, which holds `start` messages before them, the outcomes
    those messages answer (their keys become stubs: the history holds their content now), and the entries it
    adds to the turn's log list, which holds `log_start` before them."""

    history_key: str
    start: int
    messages: tuple[str, ...]
    consumed: tuple[ToolOutcome, ...] = ()
    log_key: str = ""
    log_start: int = 0
    log: tuple[str, ...] = ()


@dataclass(frozen=True)
class Prior:
    """What a conversation's next turn starts from: the history so far, and the entries of the
    conversation's list that hold it (all of it, except for a conversation last written by the previous
    layout, whose list holds none yet)."""

    messages: list[Message]
    entries: list[str]


@dataclass(frozen=True)
class Head:
    """A conversation head as read: the prior history when it references a list, else the id of the turn
    whose outcome holds it (the previous layout); None and None for a new conversation."""

    prior: Prior | None
    legacy_turn_id: str | None


def parse_head(raw: bytes | str | None, history: Sequence[Any]) -> Head:
    """A head read by `read_history.lua`, with the entries it references."""
    if raw is None:
        return Head(None, None)
    text = codec.text(raw)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and HISTORY_KEY_FIELD in data:
        entries = read_entries(history)
        return Head(Prior(parse_messages(entries), entries), None)
    return Head(None, text)


@dataclass(frozen=True)
class StoredState:
    """A turn's state as read: its JSON, and the entries of its history and log lists that are its own (none
    for a version 1 or 2 state, which holds all inline: its next save writes them)."""

    text: str
    history: list[str]
    log: list[str]


def parse_state(raw: bytes | str | None, history: Sequence[Any], log: Sequence[Any]) -> StoredState | None:
    """A state read by `read_history.lua`, with the entries it references."""
    if raw is None:
        return None
    return StoredState(codec.text(raw), read_entries(history), [codec.text(e) for e in log])


# --- the operations reading them (`read_history.lua`) ----------------------------------------------------


def _read(keys_: list[str], references: tuple[int, ...], parse: Callable[[Any], T]) -> ScriptCall[T]:
    return ScriptCall(READ_HISTORY, tuple(keys_), tuple(str(i) for i in references), parse)


def get_state_and_request(turn_id: str) -> ScriptCall[tuple[StoredState | None, TurnRequest | None]]:
    """The state with its history and log, and the request, in one round trip (what adopting a turn reads)."""
    return _read(
        [keys.turn_state(turn_id), keys.turn_request(turn_id)],
        (1,),
        lambda raw: (parse_state(raw[0], raw[2], raw[3]), codec.parse_request(raw[1])),
    )


def get_outcome(turn_id: str) -> ScriptCall[TurnOutcome | None]:
    """The turn's terminal outcome with its messages; None while it runs (or when unknown)."""
    return _read([keys.turn_outcome(turn_id)], (1,), lambda raw: parse_outcome(raw[0], raw[1]))


def get_conversation_head(conversation_id: str) -> ScriptCall[Head]:
    """Where the conversation's last finished turn left its history, read with that history."""
    return _read([keys.conversation_head(conversation_id)], (1,), lambda raw: parse_head(raw[0], raw[1]))
