"""The stored layout of a machine state, apart from the models (`orchestrator.machine.state`): pure, on JSON.

A version 3 state's JSON holds neither its history, nor its audit lists (`LOGGED_FIELDS`), nor the fields
fixed at its start (`STATIC_FIELDS`): they are entries of Redis lists (`orchestrator.store.history`),
referenced by the fields named here, so that a step writes only what changed. The log's entries are
`[field, item]`, in order of arrival. Also the upgrade of version 1 states, which kept only the kind of a
requested outcome.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from workers.contract import FailureKind, build_failure

# The fields of a version 3 state's JSON that are not `TurnState` fields: where its lists are.
HISTORY_KEY_FIELD = "history_key"
HISTORY_LEN_FIELD = "history_len"
LOG_KEY_FIELD = "log_key"
LOG_LEN_FIELD = "log_len"
# The append-only audit fields kept in the log list: one entry `[field, item]` per item, in order of arrival.
LOGGED_FIELDS = ("llm_call_records", "view_diagnostics", "late_outcomes")
# The fields set when the turn starts and rarely changed after (the request's essentials, the tools offered;
# `model` moves on a fallback): one log entry `["static", {field: value}]`, written again whenever they change
# (the last one counts). Fields at their defaults are left out of it, so that an orchestrator of the previous
# release, during a rolling deploy, still reads the state of a turn that uses none of the newer fields.
STATIC = "static"
STATIC_FIELDS = frozenset(
    {
        "model",
        "models",
        "instructions",
        "model_settings",
        "output_schema",
        "limits",
        "context",
        "tools_allowed",
        "tool_choice",
        "stream",
        "offered",
        "catalogue_names",
        "client_tools",
        "agent",
        "agents",
        "sub_agents",
        "handoffs",
        "parent",
        "max_agent_depth",
        "lost_grace_s",
        "lost_wait_s",
        "model_retry_base_s",
        "model_retry_cap_s",
    }
)


def count_log_entries(entries: Sequence[str]) -> tuple[int, ...]:
    """How many entries of each of `LOGGED_FIELDS` a log holds."""
    return tuple(sum(1 for e in entries if e.startswith(f'["{name}",')) for name in LOGGED_FIELDS)


def dump_log(state: BaseModel, stored: Sequence[str] = ()) -> list[str]:
    """The log entries to append after `stored` (the entries the log holds): the static fields unless the log
    holds them as they are, then the items of `LOGGED_FIELDS` past those it holds."""
    static = f'["{STATIC}",{state.model_dump_json(include=set(STATIC_FIELDS), exclude_defaults=True)}]'
    last = next((e for e in reversed(stored) if e.startswith(f'["{STATIC}",')), None)
    entries = [static] if static != last else []
    counts = count_log_entries(stored)
    for index, name in enumerate(LOGGED_FIELDS):
        items: Sequence[BaseModel] = getattr(state, name)
        entries += [f'["{name}",{item.model_dump_json()}]' for item in items[counts[index] :]]
    return entries


def read_message(message: Any) -> Any:
    # A stored entry is one message's JSON; a parsed one is validated as it is.
    return json.loads(message) if isinstance(message, str | bytes) else message


def read_log(entries: Sequence[str | bytes]) -> dict[str, Any]:
    """The state fields a log holds: its lists, and the static fields of its last static entry."""
    fields: dict[str, Any] = {name: [] for name in LOGGED_FIELDS}
    static: dict[str, Any] = {}
    for entry in entries:
        name, item = json.loads(entry)
        if name == STATIC:
            # Only the last one: a field it leaves out is at its default, whatever an earlier one said.
            static = item
        else:
            fields[name].append(item)
    return {**fields, **static}


def upgrade_from_v1(data: dict[str, Any]) -> dict[str, Any]:
    # Version 1 kept only the kind of a requested outcome. Its message is gone; the rebuilt outcome says so
    # rather than inventing one, and is written first-writer-wins like any other (an outcome already
    # written before the upgrade still wins).
    current = data.get("current")
    if isinstance(current, dict):
        calls = [_upgrade_call_v1(call, data.get("turn_id")) for call in current.get("calls", [])]
        data = {**data, "current": {**current, "calls": calls}}
    return {**data, "version": 2}


def _upgrade_call_v1(call: Any, turn_id: Any) -> Any:
    if not isinstance(call, dict) or not isinstance(call.get("requested"), str):
        return call
    kind = FailureKind(call["requested"])
    outcome = build_failure(
        (str(call.get("call_id")), str(call.get("tool")), turn_id if isinstance(turn_id, str) else None),
        kind,
        f"{kind.value} (decided before the turn moved to another orchestrator; details were not kept)",
        attempts=int(call.get("attempt") or 0),
        synthetic=kind in _SYNTHETIC_KINDS,
        worker=call.get("worker"),
    )
    return {**call, "requested": outcome.model_dump(mode="json")}


# Kinds the orchestrator writes for calls that did not get to finish (the others are verdicts before a run).
_SYNTHETIC_KINDS = frozenset(
    {FailureKind.DEADLINE_EXCEEDED, FailureKind.CANCELLED, FailureKind.SKIPPED, FailureKind.WORKER_LOST}
)
