"""Every provider's profile, found by listing this package: a provider is its wire module plus one module
here declaring `PROFILE` (`providers.profile.ProviderProfile`), and nothing else names it.

`PROFILES` holds them by name, `find_profile` looks one up by its name or any alias (`claude`,
`vertex_ai`, `groq` …: the names `toolloop normalize --provider` takes).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

from orchestrator.providers.profile import ProviderProfile


def _load() -> dict[str, ProviderProfile]:
    found: dict[str, ProviderProfile] = {}
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        profile = importlib.import_module(f"{__name__}.{module.name}").PROFILE
        if not isinstance(profile, ProviderProfile):
            raise TypeError(f"{__name__}.{module.name}.PROFILE is not a ProviderProfile")
        found[profile.name] = profile
    return found


PROFILES: Mapping[str, ProviderProfile] = MappingProxyType(_load())
"""Every provider toolloop knows, callable or only read, by name."""

CALLABLE: tuple[str, ...] = tuple(name for name, profile in PROFILES.items() if profile.callable)
"""The providers a model may name (`provider:model`), in name order."""

_BY_ALIAS: Mapping[str, ProviderProfile] = MappingProxyType(
    {alias: profile for profile in PROFILES.values() for alias in (profile.name, *profile.aliases)}
)


def canonical_name(name: str) -> str:
    """A provider name as profiles spell it: lower case, `-`, `.` and spaces as `_`."""
    return name.strip().lower().replace("-", "_").replace(".", "_").replace(" ", "_")


def find_profile(name: str) -> ProviderProfile | None:
    """The profile of a provider name or alias (any case, `-` or `_`); None for a name nobody uses."""
    return _BY_ALIAS.get(canonical_name(name))


def all_aliases() -> Mapping[str, ProviderProfile]:
    """Every name a profile goes by (its own and its aliases), to its profile."""
    return _BY_ALIAS
