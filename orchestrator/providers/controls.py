"""Which model settings each provider honours: refusals as plain messages, decided before a turn
is stored, so that a setting is never dropped silently. Each provider's profile says what it refuses
(`providers.profiles.<name>`: `unsupported_settings`, `owned_fields`, `max_stop_sequences`, `check_controls`);
the docs' models guide has the table. `extra` is merged into the body last, replacing what toolloop built,
except the fields a profile owns (the model, the messages, streaming).

A provider with no profile refuses nothing here: `check_model_name` refuses its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema

from orchestrator.model import ModelSettings
from orchestrator.providers.profiles import find_profile
from orchestrator.providers.traits import provider_of


def refuse_controls(
    provider: str,
    settings: ModelSettings,
    *,
    output_schema: Mapping[str, Any] | None = None,
    tool_choice: str | None = None,
) -> list[str]:
    """One message per setting `provider` cannot honour (naming the setting and the provider); [] when it
    can honour them all. `tool_choice` is the turn's, which some providers restrict (Anthropic's extended
    thinking). What each provider refuses is its profile's (`providers.profiles`)."""
    provider = provider.strip().lower()
    profile = find_profile(provider)
    if profile is None:
        return []
    refusals = [
        f"{name} is not supported by {provider}"
        for name in profile.unsupported_settings
        if getattr(settings, name) is not None
    ]
    refusals.extend(
        f"extra.{key} is not allowed: toolloop builds {key!r} itself"
        for key in profile.owned_fields
        if key in settings.extra
    )
    most = profile.max_stop_sequences
    if most is not None and settings.stop is not None and len(settings.stop) > most:
        refusals.append(f"stop: {provider} takes at most {most} sequences (got {len(settings.stop)})")
    if profile.check_controls is not None:
        refusals.extend(profile.check_controls(settings, tool_choice))
    if output_schema is not None:
        refusals.extend(refuse_output_schema(provider, output_schema))
    return refusals


def refuse_model_controls(
    model: str,
    settings: ModelSettings,
    *,
    output_schema: Mapping[str, Any] | None = None,
    tool_choice: str | None = None,
) -> list[str]:
    """`refuse_controls` for a model named `provider:model` (a tier must be resolved first: a name without a
    provider refuses nothing)."""
    if ":" not in model:
        return []
    return refuse_controls(provider_of(model), settings, output_schema=output_schema, tool_choice=tool_choice)


def refuse_output_schema(provider: str, schema: Mapping[str, Any]) -> list[str]:
    """An output schema must be a valid JSON Schema describing an object: the answer is a JSON object on
    every provider (OpenAI's formats and Anthropic's answer tool take nothing else)."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        return [f"output_schema is not a valid JSON Schema: {exc.message}"]
    kind = schema.get("type")
    if kind != "object" and not (kind is None and "properties" in schema):
        return [f"output_schema must describe a JSON object (type: object) for {provider}"]
    return []


def build_extra(body: dict[str, Any], settings: ModelSettings) -> dict[str, Any]:
    """`body` with `settings.extra` merged in last: a key there replaces what toolloop built (shallowly)."""
    return {**body, **settings.extra} if settings.extra else body
