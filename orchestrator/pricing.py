"""What a model call cost, and what the maintained price list knows of a model. A model with no price costs
None — never a guess.

The price list is genai-prices' data snapshot (the `genai-prices` package, locked like any dependency: its
prices and context windows change when the lock moves it to a newer release, never at run time — nothing
is downloaded). Its own matching rules find a model: `gpt-4.1-mini-2025-04-14` is `gpt-4.1-mini`,
`us.anthropic.claude-sonnet-4-5-20250929-v1:0` is Bedrock's Claude Sonnet 4.5; its prices are list prices
(standard tier, no batch discount), tiers included (a long Claude prompt costs its higher rate).

    find_listed_model    `provider:model` → the list's model (its provider id, context window, prices);
                         cached per name, so the orchestrator never scans the list per call
    PriceTable           the deployment's own prices (`settings.model_prices`, TOOLLOOP_MODEL_PRICES) over the
                         list, and its aliases (`settings.model_aliases`, TOOLLOOP_MODEL_ALIASES)
    cost_usd             one call's usage → USD, by a table (the list alone by default)

A toolloop provider maps to a list provider by its profile's `prices_provider` (`GENAI_PRICES_PROVIDER_IDS`);
a provider without one has no listed models. A provider's base URL the list knows names the vendor first:
an OpenAI-compatible wire at Groq's or Google's endpoint is priced as Groq's or Google's, and as OpenAI's
otherwise. A model is never looked for at another vendor than these — a local `openai:deepseek-r1:8b` is
not DeepSeek's paid API; a gateway's name gets an alias or an entry of its own. A bare model name (no
provider) is matched across providers as genai-prices does. A free provider's models (`scripted:`) cost 0.

An alias (`{"openai:gw-model": "openai:gpt-5-mini"}`) is priced as the model it stands for
(`resolve_model_alias`, the one place aliases are read; `context.windows` fits by it too); an entry of the
deployment's own for the alias itself comes first.

Cached input is priced at the cache rates. The providers count it differently, and the list's rule is the
one genai-prices' usage extractors encode: the input count is every input token, cache reads and writes
included, as OpenAI, Gemini and Cohere report it; Anthropic's Messages and Bedrock's Converse report their
cache reads and writes apart from `input_tokens`, so `cost_usd` adds them back for those wires. The wire is
the provider of the name as called: an alias to a Claude model behind an OpenAI-compatible gateway reports
usage the OpenAI way.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING

from orchestrator.errors import ModelConfigError
from orchestrator.model import Usage
from orchestrator.providers.profiles import PROFILES

if TYPE_CHECKING:
    from genai_prices.data_snapshot import DataSnapshot
    from genai_prices.types import ModelInfo, Provider

    from orchestrator.settings import Settings

TOKENS_PER_PRICE_UNIT = 1_000_000
REMEMBERED_MODELS = 4096
"""Model names a process remembers the look-up of (each distinct name a turn named; a bounded cache)."""
PRICE_FIELDS = ("input", "output", "cache_read", "cache_write")

GENAI_PRICES_PROVIDER_IDS: Mapping[str, str] = MappingProxyType(
    {name: profile.prices_provider for name, profile in PROFILES.items() if profile.prices_provider}
)
"""toolloop's provider name → the genai-prices provider id its models are priced (and windowed) by."""

FREE_PROVIDERS = frozenset(name for name, profile in PROFILES.items() if profile.free)
"""Providers whose models cost 0 (toolloop's own scripted model)."""

# Wires whose input count leaves out the cache reads and writes reported beside it (genai-prices' extractors
# for Anthropic Messages and Bedrock Converse add them back); for a bare name, the list providers of those.
_CACHE_APART_PROVIDERS = frozenset(name for name, profile in PROFILES.items() if profile.cache_apart)
_CACHE_APART_LIST_IDS = frozenset(PROFILES[name].prices_provider or name for name in _CACHE_APART_PROVIDERS)
# Dated and `-latest` names of the deployment's own entries match their family (the list has its own rules).
_DATE_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


@dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens; a cache rate of None means cached tokens cost the input rate."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


@dataclass(frozen=True)
class ListedModel:
    """A model as genai-prices lists it: its provider id and model id there, its context window in tokens
    (None when the list has none), and the list's own records, which price a call exactly (tiers, dated
    price changes)."""

    provider_id: str
    model_id: str
    context_window: int | None
    info: ModelInfo = field(repr=False, compare=False)
    provider: Provider = field(repr=False, compare=False)


def resolve_model_alias(model: str, aliases: Mapping[str, str] | None) -> str:
    """The `provider:model` that `model` stands for by `aliases` (TOOLLOOP_MODEL_ALIASES, matched on the name
    as written), or `model` itself. One step: an alias names a model, not another alias."""
    target = aliases.get(model.strip()) if aliases else None
    return model if target is None else target.strip()


def split_model_name(model: str) -> tuple[str, str]:
    """`provider:model` → (provider lower-cased, model); a bare name → ("", name)."""
    provider, sep, name = model.strip().partition(":")
    return (provider.strip().lower(), name.strip()) if sep else ("", provider.strip())


@functools.cache
def _snapshot() -> DataSnapshot:
    # Imported here: the list is loaded (~20 ms, 7 MB; about 0.5 s without bytecode) by the first process
    # that prices or fits a model, never by a CLI command that does neither.
    from genai_prices.data_snapshot import get_snapshot

    return get_snapshot()


def _find_in_list(name: str, provider_id: str | None) -> ListedModel | None:
    try:
        provider, info = _snapshot().find_provider_model(name, None, provider_id, None)
    except LookupError:
        return None
    return ListedModel(provider.id, info.id, info.context_window, info, provider)


def _list_provider_at(api_url: str) -> str | None:
    try:
        return _snapshot().find_provider(None, None, api_url).id
    except LookupError:
        return None


@functools.lru_cache(maxsize=REMEMBERED_MODELS)
def find_listed_model(model: str, api_url: str | None = None) -> ListedModel | None:
    """`model` (`provider:model`, or a bare name matched across providers) in genai-prices' list, or None.

    `api_url` is the base URL the provider's requests go to: a URL the list knows names the vendor (an
    OpenAI-compatible endpoint of Groq or Google) and is asked first. Cached per name and URL, misses too.
    """
    provider, name = split_model_name(model)
    if not name or provider in FREE_PROVIDERS:
        return None
    if not provider:
        return _find_in_list(name, None)
    at_url = _list_provider_at(api_url) if api_url else None
    for provider_id in dict.fromkeys(p for p in (at_url, GENAI_PRICES_PROVIDER_IDS.get(provider)) if p):
        found = _find_in_list(name, provider_id)
        if found is not None:
            return found
    return None


@dataclass(frozen=True)
class _Priced:
    """A model's price: its flat rates (an entry of the deployment's, or the list's base rates), and the
    list's model when the price is the list's own, which prices a call exactly."""

    flat: ModelPrice
    listed: ListedModel | None = None


class PriceTable(Mapping[str, ModelPrice]):
    """The prices calls are charged by: as a mapping, the deployment's own entries (`provider:model` or
    bare name → `ModelPrice`), matched first; behind them genai-prices' list. `aliases` price an alias as
    its model; `api_urls` (toolloop provider → its base URL) tell which vendor an OpenAI-compatible URL is.
    Each model name is resolved once and remembered."""

    def __init__(
        self,
        entries: Mapping[str, ModelPrice] | None = None,
        *,
        aliases: Mapping[str, str] | None = None,
        api_urls: Mapping[str, str | None] | None = None,
    ) -> None:
        self._entries = dict(entries or {})
        self.aliases: Mapping[str, str] = MappingProxyType(dict(aliases or {}))
        self.api_urls: Mapping[str, str | None] = MappingProxyType(dict(api_urls or {}))
        # Each model name resolved once: a bounded cache, as names come from the turns submitted.
        self._price_of = functools.lru_cache(maxsize=REMEMBERED_MODELS)(self._resolve)

    def __getitem__(self, key: str) -> ModelPrice:
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def _listed(self, model: str) -> ListedModel | None:
        return find_listed_model(model, self.api_urls.get(split_model_name(model)[0]))

    def _resolve(self, model: str) -> _Priced | None:
        # The price of `model` as called: an alias's own entry, else its model's price.
        target = resolve_model_alias(model, self.aliases)
        entry = self._entry(model) or self._entry(target)
        if entry is not None:
            priced: _Priced | None = _Priced(entry)
        else:
            listed = self._listed(target)
            price = _flat_price(listed) if listed is not None else None
            priced = _Priced(price, listed) if price is not None and listed is not None else None
        return priced

    def _entry(self, model: str) -> ModelPrice | None:
        provider, bare = split_model_name(model)
        undated = _DATE_SUFFIX.sub("", bare)
        names = [bare, undated]
        if provider:
            names = [f"{provider}:{bare}", f"{provider}:{undated}", *names]
        for name in dict.fromkeys(names):
            if name in self._entries:
                return self._entries[name]
        return None


_LIST_ONLY = PriceTable()


def _flat_price(listed: ListedModel) -> ModelPrice | None:
    # The list's base rates (a tiered rate's first tier) today; None for a model it prices by no token rate
    # (an image or a speech model): a chat call of it has no known price.
    try:
        price = listed.info.get_prices(datetime.now(tz=UTC))
    except (IndexError, ValueError):
        return None
    input_rate, output_rate = _rate(price.input_mtok), _rate(price.output_mtok)
    if input_rate is None and output_rate is None:
        return None
    return ModelPrice(
        input=input_rate or 0.0,
        output=output_rate or 0.0,
        cache_read=_rate(price.cache_read_mtok),
        cache_write=_rate(price.cache_write_mtok),
    )


def _rate(value: object) -> float | None:
    from genai_prices.types import TieredPrices

    if isinstance(value, TieredPrices):
        return float(value.base)
    return None if value is None else float(str(value))


def build_price_table(
    overrides: Mapping[str, Mapping[str, float]] | None = None,
    *,
    aliases: Mapping[str, str] | None = None,
    api_urls: Mapping[str, str | None] | None = None,
) -> PriceTable:
    """genai-prices' list with `overrides` (`settings.model_prices`) over it, field by field: an entry for a
    model the list prices may give only the rates it changes; a new one needs `input` and `output`.
    `ModelConfigError` names an entry with an unknown field, a negative price or a missing rate. `aliases`
    (`settings.model_aliases`) and `api_urls` as `PriceTable` takes them."""
    entries: dict[str, ModelPrice] = {}
    for key, fields in (overrides or {}).items():
        name = key.strip()
        unknown = sorted(set(fields) - set(PRICE_FIELDS))
        if unknown:
            raise ModelConfigError(
                f"model price {key!r}: unknown field(s) {', '.join(unknown)} "
                f"(fields: {', '.join(PRICE_FIELDS)})"
            )
        if any(value < 0 for value in fields.values()):
            raise ModelConfigError(f"model price {key!r}: a price cannot be negative")
        listed = find_listed_model(name, (api_urls or {}).get(split_model_name(name)[0]))
        known = _flat_price(listed) if listed is not None else None
        merged = {**(_as_fields(known) if known else {}), **fields}
        if "input" not in merged or "output" not in merged:
            raise ModelConfigError(f"model price {key!r}: a new model needs both `input` and `output`")
        entries[name] = ModelPrice(
            input=float(merged["input"]),
            output=float(merged["output"]),
            cache_read=_optional_float(merged.get("cache_read")),
            cache_write=_optional_float(merged.get("cache_write")),
        )
    return PriceTable(entries, aliases=aliases, api_urls=api_urls)


def build_api_urls(settings: Settings) -> dict[str, str | None]:
    """Each provider's base URL as the deployment sets it (its profile's variable; None when unset), as
    `build_price_table` takes them."""
    urls: dict[str, str | None] = {}
    for name, profile in PROFILES.items():
        variable = profile.endpoint.base_url_variable if profile.endpoint is not None else None
        if variable:
            urls[name] = settings.provider_variables([variable]).get(variable)
    return urls


def _as_fields(price: ModelPrice) -> dict[str, float]:
    fields = {"input": price.input, "output": price.output}
    if price.cache_read is not None:
        fields["cache_read"] = price.cache_read
    if price.cache_write is not None:
        fields["cache_write"] = price.cache_write
    return fields


def _optional_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def find_price(model: str, table: PriceTable | None = None) -> ModelPrice | None:
    """The flat rates of `model` (`provider:model` or bare) by `table` (the list alone by default): the
    deployment's entry, else the list's base rates; None when neither prices it."""
    priced = (_LIST_ONLY if table is None else table)._price_of(model)
    return None if priced is None else priced.flat


def cost_usd(model: str, usage: Usage, table: PriceTable | None = None) -> float | None:
    """What one call of `model` (`provider:model`) that used `usage` cost, in USD, by `table` (the list alone
    by default); None when the model has no price. Scripted models cost 0."""
    provider, _ = split_model_name(model)
    if provider in FREE_PROVIDERS:
        return 0.0
    priced = (_LIST_ONLY if table is None else table)._price_of(model)
    if priced is None:
        return None
    cache_read = usage.cache_read_tokens or 0
    cache_write = usage.cache_write_tokens or 0
    if provider:
        cache_apart = provider in _CACHE_APART_PROVIDERS
    else:
        listed = priced.listed or find_listed_model(model)
        cache_apart = listed is not None and listed.provider_id in _CACHE_APART_LIST_IDS
    # Every input token, as the list counts them; a count smaller than its cached share is taken as that.
    input_tokens = max(
        usage.input_tokens + (cache_read + cache_write if cache_apart else 0), cache_read + cache_write
    )
    if priced.listed is not None:
        listed_cost = _listed_cost(priced.listed, input_tokens, usage.output_tokens, cache_read, cache_write)
        if listed_cost is not None:
            return listed_cost
    return _flat_cost(priced.flat, input_tokens, usage.output_tokens, cache_read, cache_write)


def _listed_cost(
    listed: ListedModel, input_tokens: int, output_tokens: int, cache_read: int, cache_write: int
) -> float | None:
    from genai_prices.types import Usage as ListedUsage

    counts = ListedUsage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=cache_read or None,
        cache_write_tokens=cache_write or None,
    )
    try:
        calculated = listed.info.calc_price(counts, listed.provider)
    except ValueError:  # counts the list's rules refuse: priced at the flat rates instead
        return None
    return float(calculated.total_price)


def _flat_cost(
    price: ModelPrice, input_tokens: int, output_tokens: int, cache_read: int, cache_write: int
) -> float:
    uncached = input_tokens - cache_read - cache_write
    cost = (
        uncached * price.input
        + cache_read * (price.input if price.cache_read is None else price.cache_read)
        + cache_write * (price.input if price.cache_write is None else price.cache_write)
        + output_tokens * price.output
    )
    return cost / TOKENS_PER_PRICE_UNIT
