"""What the orchestrator outside `providers/` may know about a model provider, as data.

A model is named `provider:model`. Each provider speaks one wire format, its *wire family*: providers of one
family can read each other's tool calls and continuation data, and the request-time view
(`orchestrator.machine.view`) reshapes what another family wrote before sending it. Each provider also
accepts only some tool-call ids; the view remaps the others.

Pure data and tiny lookups, read from the providers' profiles (`providers.profiles`), so that the state
machine can use them: nothing here imports httpx or a wire module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from orchestrator.providers.profile import DEFAULT_TOOL_CALL_ID_MAX_CHARS, SAFE_TOOL_CALL_ID, ProviderProfile
from orchestrator.providers.profiles import PROFILES

# The tiers a turn may name instead of a model. Which model each one means is the orchestrator's
# configuration, not the submitting process's: a submit checks only that the word is one of them.
MODEL_TIERS = ("fast", "default", "smart")


@dataclass(frozen=True)
class ProviderTraits:
    """The wire family of a provider and the tool-call ids it accepts."""

    wire_family: str
    tool_call_id_pattern: re.Pattern[str]
    tool_call_id_max_chars: int

    def accepts_tool_call_id(self, call_id: str) -> bool:
        """True when the provider takes `call_id` as the id of a tool call (and of its result) as is."""
        return (
            len(call_id) <= self.tool_call_id_max_chars
            and self.tool_call_id_pattern.match(call_id) is not None
        )


_DEFAULT_ID_MAX_CHARS = DEFAULT_TOOL_CALL_ID_MAX_CHARS


def _traits(profile: ProviderProfile) -> ProviderTraits:
    return ProviderTraits(profile.wire_family, profile.tool_call_id_pattern, profile.tool_call_id_max_chars)


PROVIDER_TRAITS: Mapping[str, ProviderTraits] = MappingProxyType(
    {
        **{profile.wire_family: _traits(profile) for profile in list(PROFILES.values())[::-1]},
        **{name: _traits(profile) for name, profile in PROFILES.items()},
    }
)
"""The traits of each known provider, by the name used in `provider:model` (and in a message's `provider`),
and of each wire family by its name (`openai_chat`: its first provider's): read from the providers'
profiles."""


def provider_of(model: str) -> str:
    """The provider part of a `provider:model` name, as written."""
    return model.split(":", 1)[0]


def traits_of(provider: str) -> ProviderTraits:
    """The traits of a provider name or `provider:model`.

    A provider not in the table is a wire family of its own, held to the default id rule (the strictest one).
    """
    name = _normalise(provider)
    known = PROVIDER_TRAITS.get(name)
    return known if known is not None else ProviderTraits(name, SAFE_TOOL_CALL_ID, _DEFAULT_ID_MAX_CHARS)


def wire_family(provider: str | None) -> str | None:
    """The wire family of a provider name or `provider:model` (`openai` → `openai_chat`); None stays None."""
    if provider is None:
        return None
    name = _normalise(provider)
    known = PROVIDER_TRAITS.get(name)
    return known.wire_family if known is not None else name


def _normalise(provider: str) -> str:
    return provider_of(provider).strip().lower()
