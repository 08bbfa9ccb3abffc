"""What a model call cost: a price table in USD per million tokens, and the cost of one call's
usage. A model with no price costs None — never a guess.

The shipped table holds the providers' published list prices (standard tier, no batch discount, Anthropic's
5-minute cache writes) for common models, as of late 2025; `build_price_table` merges the deployment's own
(`settings.model_prices`, TOOLLOOP_MODEL_PRICES) over it. A key is `provider:model` or a bare model name;
a model is looked up as `provider:model` first, then bare, each as written and then without a date suffix
(`gpt-4.1-mini-2025-04-14` → `gpt-4.1-mini`, `claude-sonnet-4-5-20250929` → `claude-sonnet-4-5`) or a
`-latest` one. A name is never matched by a mere prefix: `gpt-4o-audio-preview` is not `gpt-4o`.

Cached input is priced at the cache rates when the table gives them, at the input rate otherwise. The
providers count it differently: Anthropic's `input_tokens` leave out the cache reads and writes it reports
beside them, OpenAI's include the cached tokens; `cost_usd` prices each way by the model's provider
(`anthropic:`, or a bare `claude-` name). `scripted:` models cost 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from orchestrator.errors import ModelConfigError
from orchestrator.model import Usage

TOKENS_PER_PRICE_UNIT = 1_000_000
PRICE_FIELDS = ("input", "output", "cache_read", "cache_write")
_DATE_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")
_FREE_PROVIDERS = frozenset({"scripted"})
# Providers whose input count leaves out the cached tokens reported beside it.
_CACHE_APART_PROVIDERS = frozenset({"anthropic"})


@dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens; a cache rate of None means cached tokens cost the input rate."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None


PriceTable = Mapping[str, ModelPrice]


def _openai(input_usd: float, cached_usd: float, output_usd: float) -> ModelPrice:
    return ModelPrice(input=input_usd, output=output_usd, cache_read=cached_usd)


def _anthropic(input_usd: float, output_usd: float) -> ModelPrice:
    # Anthropic prices cache hits at a tenth of the input rate and 5-minute cache writes at 1.25 times it.
    return ModelPrice(input_usd, output_usd, cache_read=input_usd / 10, cache_write=input_usd * 1.25)


SHIPPED_PRICES: PriceTable = MappingProxyType(
    {
        "gpt-4.1": _openai(2.00, 0.50, 8.00),
        "gpt-4.1-mini": _openai(0.40, 0.10, 1.60),
        "gpt-4.1-nano": _openai(0.10, 0.025, 0.40),
        "gpt-4o": _openai(2.50, 1.25, 10.00),
        "gpt-4o-mini": _openai(0.15, 0.075, 0.60),
        # The first gpt-4o snapshot kept its launch price, and had no cached rate.
        "gpt-4o-2024-05-13": ModelPrice(input=5.00, output=15.00),
        "o3": _openai(2.00, 0.50, 8.00),
        "o4-mini": _openai(1.10, 0.275, 4.40),
        "gpt-5": _openai(1.25, 0.125, 10.00),
        "gpt-5-mini": _openai(0.25, 0.025, 2.00),
        "gpt-5-nano": _openai(0.05, 0.005, 0.40),
        "claude-opus-4-5": _anthropic(5.00, 25.00),
        "claude-opus-4-1": _anthropic(15.00, 75.00),
        "claude-opus-4-0": _anthropic(15.00, 75.00),
        "claude-opus-4": _anthropic(15.00, 75.00),
        "claude-sonnet-4-5": _anthropic(3.00, 15.00),
        "claude-sonnet-4-0": _anthropic(3.00, 15.00),
        "claude-sonnet-4": _anthropic(3.00, 15.00),
        "claude-3-7-sonnet": _anthropic(3.00, 15.00),
        "claude-3-5-sonnet": _anthropic(3.00, 15.00),
        "claude-haiku-4-5": _anthropic(1.00, 5.00),
        "claude-3-5-haiku": _anthropic(0.80, 4.00),
    }
)
"""Published list prices, USD per million tokens, by bare model name."""


def build_price_table(overrides: Mapping[str, Mapping[str, float]] | None = None) -> PriceTable:
    """The shipped table with `overrides` (`settings.model_prices`) merged over it, field by field: an entry
    for a model the table knows may give only the rates it changes; a new one needs `input` and `output`.
    `ModelConfigError` names an entry with an unknown field, a negative price or a missing rate."""
    table = dict(SHIPPED_PRICES)
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
        known = table.get(name) or table.get(name.partition(":")[2])
        merged = {**(_as_fields(known) if known else {}), **fields}
        if "input" not in merged or "output" not in merged:
            raise ModelConfigError(f"model price {key!r}: a new model needs both `input` and `output`")
        table[name] = ModelPrice(
            input=float(merged["input"]),
            output=float(merged["output"]),
            cache_read=_optional_float(merged.get("cache_read")),
            cache_write=_optional_float(merged.get("cache_write")),
        )
    return MappingProxyType(table)


def _as_fields(price: ModelPrice) -> dict[str, float]:
    fields = {"input": price.input, "output": price.output}
    if price.cache_read is not None:
        fields["cache_read"] = price.cache_read
    if price.cache_write is not None:
        fields["cache_write"] = price.cache_write
    return fields


def _optional_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def find_price(model: str, table: PriceTable) -> ModelPrice | None:
    """The price of `model` (`provider:model` or bare) in `table`, or None when the table has none."""
    name = model.strip()
    provider, _, bare = name.partition(":") if ":" in name else ("", "", name)
    undated = _DATE_SUFFIX.sub("", bare)
    names = [bare, undated]
    if provider:
        names = [f"{provider}:{bare}", f"{provider}:{undated}", *names]
    for name in dict.fromkeys(names):
        if name in table:
            return table[name]
    return None


def cost_usd(model: str, usage: Usage, table: PriceTable | None = None) -> float | None:
    """What one call of `model` (`provider:model`) that used `usage` cost, in USD, by `table` (the shipped
    one by default); None when the model has no price. Scripted models cost 0."""
    provider = model.partition(":")[0].strip().lower() if ":" in model else ""
    if provider in _FREE_PROVIDERS:
        return 0.0
    price = find_price(model, SHIPPED_PRICES if table is None else table)
    if price is None:
        return None
    cache_read = usage.cache_read_tokens or 0
    cache_write = usage.cache_write_tokens or 0
    cache_apart = provider in _CACHE_APART_PROVIDERS or (not provider and model.startswith("claude"))
    uncached = usage.input_tokens if cache_apart else max(usage.input_tokens - cache_read - cache_write, 0)
    cost = (
        uncached * price.input
        + cache_read * (price.input if price.cache_read is None else price.cache_read)
        + cache_write * (price.input if price.cache_write is None else price.cache_write)
        + usage.output_tokens * price.output
    )
    return cost / TOKENS_PER_PRICE_UNIT
