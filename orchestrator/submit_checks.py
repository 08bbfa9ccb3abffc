"""What a submitted turn's models and model controls are checked against before it is stored, pure: the
client side of the store (the API, the clients and the orchestrator's adoption call it; the store imports no
provider).

A setting the target provider cannot honour is refused at submit, never dropped silently: for each model of
the request (a name, or the fallback list), the provider it names, or the tier resolves to with the
submitting process's settings, is asked (`providers.controls.refuse_controls`). A tier the submitting
process has not configured, or no model with no default configured here, is left to the orchestrator, which
checks again when it resolves it. An `output_schema` must be a valid JSON Schema.

Each refusal names the request field it is about (`model_settings.seed`, `output_schema`), so the HTTP API
answers a 422 whose `loc` points at it and the Python client a `ValueError` naming it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from orchestrator.errors import ModelConfigError
from orchestrator.model import ModelSettings, TurnRequest
from orchestrator.providers.base import check_model_name, parse_model_ref
from orchestrator.providers.controls import refuse_controls, refuse_output_schema
from orchestrator.settings import Settings


@dataclass(frozen=True)
class ModelNames:
    """How the submitting process resolves a model name: its configured tiers, and its default model when
    it configured one (TOOLLOOP_MODEL) — else the orchestrator's default is unknown here."""

    tiers: Mapping[str, str] = field(default_factory=dict)
    default: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelNames:
        """The names `settings` resolves: only what the process set, not the built-in default model."""
        default = settings.model if "model" in settings.model_fields_set else None
        return cls(settings.model_tiers, default)

    def resolve(self, name: str | None) -> str | None:
        """The `provider:model` that `name` is here, or None when only the orchestrator can tell."""
        name = (name or "").strip()
        if not name or name == "default":
            return self.tiers.get("default") or self.default
        if ":" in name:
            return name
        return self.tiers.get(name)


@dataclass(frozen=True)
class Refusal:
    """One thing a submitted turn asks that cannot be done: the request field, and why."""

    field: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"{'.'.join(self.field)}: {self.message}"


def check_output_schema(schema: Mapping[str, Any] | None) -> str | None:
    """None for a valid JSON Schema (by its `$schema`, Draft 2020-12 by default), else why it is not."""
    if schema is None:
        return None
    text = json.dumps(schema, sort_keys=True)
    return (_check_schema_cached if len(text) <= CACHED_SCHEMA_MAX_CHARS else _check_schema_text)(text)


def _check_schema_text(text: str) -> str | None:
    schema = json.loads(text)
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.path)
        return f"not a valid JSON Schema: {exc.message}" + (f" (at {where})" if where else "")
    return None


def _refuse_schema_text(provider: str, text: str) -> tuple[str, ...]:
    return tuple(refuse_output_schema(provider, json.loads(text)))


# Checking a schema against its meta-schema takes a millisecond or so; the API checks a request before it
# submits it, and a fallback list asks each provider, so a schema is checked once per process — a small one:
# the caches hold at most 128 schemas of at most 16 KiB, so a client sending big ones cannot grow them.
CACHED_SCHEMA_MAX_CHARS = 16 * 1024
_check_schema_cached = lru_cache(maxsize=128)(_check_schema_text)
_refuse_schema_cached = lru_cache(maxsize=128)(_refuse_schema_text)


def find_refusals(request: TurnRequest, names: ModelNames | None = None) -> list[Refusal]:
    """Everything the request asks that its schema or its models' providers refuse; [] when all is well."""
    schema_problem = check_output_schema(request.output_schema) or _not_an_object(request.output_schema)
    refusals = [Refusal(("output_schema",), schema_problem)] if schema_problem else []
    schema = None if schema_problem else request.output_schema
    for model in _requested_models(request.model):
        resolved = (names or ModelNames()).resolve(model)
        if resolved is None:
            continue
        try:
            provider = parse_model_ref(resolved).provider
        except ModelConfigError:
            continue  # a tier configured with a bad name: the orchestrator reports it where it is used
        refusals += _refusals_of(provider, resolved, request, schema)
    return list(dict.fromkeys(refusals))


def check_submit(request: TurnRequest, names: ModelNames | None = None) -> None:
    """What a submit checks of a request's models before anything is stored: each model's name
    (`ModelConfigError` for a provider nobody knows) and what their providers refuse (`check_refusals`)."""
    check_model_name(request.model)
    check_refusals(request, names)


def check_refusals(request: TurnRequest, names: ModelNames | None = None) -> None:
    """`ValueError` naming every field `find_refusals` refuses."""
    refusals = find_refusals(request, names)
    if refusals:
        raise ValueError("; ".join(map(str, refusals)))


def _not_an_object(schema: Mapping[str, Any] | None) -> str | None:
    # Whatever the model: the answer is a JSON object on every provider (OpenAI's formats, Anthropic's answer
    # tool), so a schema of anything else is refused even when no provider can be asked here.
    if schema is None or schema.get("type") == "object" or ("type" not in schema and "properties" in schema):
        return None
    return "must describe a JSON object (type: object): a typed answer is a JSON object on every provider"


def _requested_models(model: str | list[str] | None) -> Sequence[str | None]:
    return model if isinstance(model, list) else [model]


def _refusals_of(
    provider: str, model: str, request: TurnRequest, schema: Mapping[str, Any] | None
) -> list[Refusal]:
    choice = request.tool_choice
    refused_schema: tuple[str, ...] = ()
    if schema is not None:
        text = json.dumps(schema, sort_keys=True)
        refuse = _refuse_schema_cached if len(text) <= CACHED_SCHEMA_MAX_CHARS else _refuse_schema_text
        refused_schema = refuse(provider, text)
    everything = refuse_controls(provider, request.model_settings, tool_choice=choice)
    found: list[Refusal] = []
    if everything:
        # Asked one field at a time, so that each refusal names the field it is about.
        explained: set[str] = set()
        for path, single in _one_at_a_time(request.model_settings):
            messages = refuse_controls(provider, single, tool_choice=choice)
            explained.update(messages)
            found += [Refusal(path, f"{message} (model {model})") for message in messages]
        # What only a combination of fields is refused for names the settings as a whole.
        found += [
            Refusal(("model_settings",), f"{m} (model {model})") for m in everything if m not in explained
        ]
    return found + [Refusal(("output_schema",), f"{m} (model {model})") for m in refused_schema]


def _one_at_a_time(settings: ModelSettings) -> list[tuple[tuple[str, ...], ModelSettings]]:
    singles: list[tuple[tuple[str, ...], ModelSettings]] = []
    for name in ModelSettings.model_fields.keys() - {"extra"}:
        value = getattr(settings, name)
        if value is not None:
            singles.append((("model_settings", name), ModelSettings.model_validate({name: value})))
    for key, value in settings.extra.items():
        singles.append((("model_settings", "extra", key), ModelSettings(extra={key: value})))
    return sorted(singles, key=lambda single: single[0])
