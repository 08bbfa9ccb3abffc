"""Reading records another process wrote: tolerant of the release before ours and of the one after it.

Turn requests, states, outcome envelopes, control requests and catalogue entries cross processes through
Redis, and during a rolling deploy (or a rollback) the writer may run another release than the reader. The
rule, written once here:

- a field this release does not know is ignored when a record is read back (`STORED`), and refused in what a
  person sends (a misspelt limit must be an error, not silently dropped): the models that forbid unknown
  fields derive from `ForbidsUnknownFields`, which drops them only under the `STORED` validation context;
- a field this release expects and a record lacks takes its default (every field added since a record's first
  release has one);
- a value of a closed set this release does not know (a failure kind added later) is read as the nearest
  one it does (`read_known`), never a crash;
- a change an older reader must not misread bumps the record's version (the turn state's `version`), and a
  reader leaves a record of a version it does not read to a process that does.

Design notes: docs/operations/deploying.md, "Upgrades and rollbacks".
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

StrT = TypeVar("StrT", bound=str)

# The validation context of a record read back from Redis: `Model.model_validate(data, context=STORED)`.
STORED: Final[Mapping[str, bool]] = {"toolloop_stored_record": True}


def is_stored(info: ValidationInfo) -> bool:
    """Whether this validation reads a stored record (`STORED`), rather than what a person sent."""
    context = info.context
    return isinstance(context, Mapping) and bool(context.get("toolloop_stored_record"))


class ForbidsUnknownFields(BaseModel):
    """A model whose unknown fields are an error where a person writes it, and ignored where it is read back
    (`STORED`): a record a newer release wrote, with a field added since, still reads here."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _ignore_unknown_fields_when_stored(cls, data: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and is_stored(info):
            fields = cls.model_fields
            if any(name not in fields for name in data):
                return {name: value for name, value in data.items() if name in fields}
        return data


def read_known(value: object, known: Collection[StrT], fallback: StrT) -> object:
    """`value` when it is one of `known` (or not a string: left to the field's own validation), else
    `fallback`: a value a newer release added to a closed set, read as the nearest one this release has."""
    if isinstance(value, str) and value not in known:
        return fallback
    return value


# How many records `warn_once` remembers having told of (the oldest forgotten first).
REMEMBERED_WARNINGS = 10_000
_warned: OrderedDict[str, None] = OrderedDict()


def warn_once(log: logging.Logger, record: str, message: str, *args: object) -> bool:
    """Log `message` at WARNING the first time `record` (a turn id, an outcome key) is told of, in this
    process; True then. A record read again and again (each claim, each inbox batch) is told of once."""
    if record in _warned:
        _warned.move_to_end(record)
        return False
    _warned[record] = None
    if len(_warned) > REMEMBERED_WARNINGS:
        _warned.popitem(last=False)
    log.warning(message, *args)
    return True
