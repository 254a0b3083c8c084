"""What an agent's tokens cost: a per-model price table in USD per million tokens.

The built-in table covers the current Claude models; `--price-table FILE.json` overrides or extends
it with entries such as

    {"claude-sonnet-4-5": {"input": 3.0, "output": 15.0, "cache_write": 3.75, "cache_read": 0.30}}

`cache_write` defaults to 1.25 x input and `cache_read` to 0.1 x input (Anthropic's multipliers for
the 5-minute cache); one-hour cache writes are priced at 2 x input unless `cache_write_1h` is given.
A model is found by its exact name; a dated id such as `claude-sonnet-4-5-20250929` uses the entry
of its alias `claude-sonnet-4-5`. A model with no price is refused before the run starts, since a
cost cap cannot work without one.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional


class PricingError(ValueError):
    """A price table that cannot be used, or a model with no price: the run must not start."""


@dataclass(frozen=True)
class ModelPrice:
    """USD per million tokens."""
    input: float
    output: float
    cache_write: float
    cache_read: float
    cache_write_1h: float

    @classmethod
    def of(cls, input: float, output: float, cache_write: Optional[float] = None,
           cache_read: Optional[float] = None, cache_write_1h: Optional[float] = None) -> "ModelPrice":
        return cls(
            input=input,
            output=output,
            cache_write=input * 1.25 if cache_write is None else cache_write,
            cache_read=input * 0.10 if cache_read is None else cache_read,
            cache_write_1h=input * 2.0 if cache_write_1h is None else cache_write_1h,
        )


# Fields: input, output, 5-minute cache write, cache read, one-hour cache write. From Anthropic's
# pricing and model pages as seen in November 2026; Sonnet 5.5's cache read reflects the cut of
# 2026-10-07, and Opus 5.5's cache prices assume the 5.5 multipliers (1.25x, 0.05x, 2x). A table
# here is a snapshot: check claude.com/pricing when it matters, and override with --price-table.
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "claude-fable-5-1": ModelPrice.of(10.0, 50.0, 12.50, 0.25, 20.0),
    "claude-mythos-5-1": ModelPrice.of(10.0, 50.0, 12.50, 0.25, 20.0),
    "claude-fable-5": ModelPrice.of(10.0, 50.0, 12.50, 1.00, 20.0),
    "claude-mythos-5": ModelPrice.of(10.0, 50.0, 12.50, 1.00, 20.0),
    "claude-opus-5-5": ModelPrice.of(4.0, 20.0, 5.00, 0.20, 8.0),
    "claude-opus-5": ModelPrice.of(5.0, 25.0, 6.25, 0.50, 10.0),
    "claude-opus-4-8": ModelPrice.of(5.0, 25.0, 6.25, 0.50, 10.0),
    "claude-opus-4-7": ModelPrice.of(5.0, 25.0, 6.25, 0.50, 10.0),
    "claude-opus-4-6": ModelPrice.of(5.0, 25.0, 6.25, 0.50, 10.0),
    "claude-opus-4-5": ModelPrice.of(5.0, 25.0, 6.25, 0.50, 10.0),
    "claude-opus-4-1": ModelPrice.of(15.0, 75.0, 18.75, 1.50, 30.0),
    "claude-opus-4": ModelPrice.of(15.0, 75.0, 18.75, 1.50, 30.0),
    "claude-sonnet-5-5": ModelPrice.of(2.0, 10.0, 2.50, 0.10, 4.0),
    "claude-sonnet-5": ModelPrice.of(2.0, 10.0, 2.50, 0.20, 4.0),
    "claude-sonnet-4-6": ModelPrice.of(3.0, 15.0, 3.75, 0.30, 6.0),
    "claude-sonnet-4-5": ModelPrice.of(3.0, 15.0, 3.75, 0.30, 6.0),
    "claude-sonnet-4": ModelPrice.of(3.0, 15.0, 3.75, 0.30, 6.0),
    "claude-3-7-sonnet": ModelPrice.of(3.0, 15.0, 3.75, 0.30, 6.0),
    # Haiku 5.5 is billed by prompt length; this is the band for prompts over 100k tokens, so a
    # cost cap errs on the safe side (shorter prompts cost a fifth of this).
    "claude-haiku-5-5": ModelPrice.of(0.50, 2.50, 0.625, 0.05, 1.0),
    "claude-haiku-4-5": ModelPrice.of(1.0, 5.0, 1.25, 0.10, 2.0),
    "claude-3-5-haiku": ModelPrice.of(0.80, 4.0, 1.00, 0.08, 1.6),
    "claude-3-haiku": ModelPrice.of(0.25, 1.25, 0.30, 0.03, 0.50),
}
# A dated model id (claude-sonnet-4-5-20250929) uses the price of its alias.
DATED_SUFFIX = re.compile(r"-\d{8}$")

PRICE_FIELDS = ("input", "output", "cache_write", "cache_read", "cache_write_1h")


@dataclass(frozen=True)
class TokenUsage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_write_tokens: int = 0        # all cache writes (5-minute and one-hour)
    cache_read_tokens: int = 0
    cache_write_1h_tokens: int = 0     # the one-hour part of cache_write_tokens

    def __add__(self, other: "TokenUsage") -> "TokenUsage":
        return TokenUsage(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple[int, ...]:
        return (self.input_tokens, self.output_tokens, self.cache_write_tokens,
                self.cache_read_tokens, self.cache_write_1h_tokens)

    @classmethod
    def from_api(cls, usage: Any) -> "TokenUsage":
        """From the `usage` of an anthropic Message (fields the server leaves out count as 0)."""
        if usage is None:
            return cls()
        one_hour = 0
        breakdown = getattr(usage, "cache_creation", None)
        if breakdown is not None:
            one_hour = getattr(breakdown, "ephemeral_1h_input_tokens", 0) or 0
        return cls(
            input_tokens=getattr(usage, "input_tokens", 0) or 0,
            output_tokens=getattr(usage, "output_tokens", 0) or 0,
            cache_write_tokens=getattr(usage, "cache_creation_input_tokens", 0) or 0,
            cache_read_tokens=getattr(usage, "cache_read_input_tokens", 0) or 0,
            cache_write_1h_tokens=one_hour,
        )


class PriceTable:
    def __init__(self, prices: Mapping[str, ModelPrice]):
        self.prices = dict(prices)

    @classmethod
    def load(cls, path: Optional[str | Path] = None) -> "PriceTable":
        """The built-in prices, overridden by the JSON file at `path` when given."""
        prices = dict(DEFAULT_PRICES)
        if path is not None:
            prices.update(_read_price_file(Path(path)))
        return cls(prices)

    def price_for(self, model: str) -> ModelPrice:
        if model in self.prices:
            return self.prices[model]
        alias = DATED_SUFFIX.sub("", model)
        if alias in self.prices:
            return self.prices[alias]
        raise PricingError(
            f"no price known for model {model!r}; give one with --price-table FILE.json, e.g. "
            f'{{"{model}": {{"input": 3.0, "output": 15.0}}}} (USD per million tokens). '
            f"Known models: {', '.join(sorted(self.prices))}"
        )

    def cost_usd(self, model: str, usage: TokenUsage) -> float:
        price = self.price_for(model)
        five_minute_writes = usage.cache_write_tokens - usage.cache_write_1h_tokens
        return (
            usage.input_tokens * price.input
            + usage.output_tokens * price.output
            + five_minute_writes * price.cache_write
            + usage.cache_write_1h_tokens * price.cache_write_1h
            + usage.cache_read_tokens * price.cache_read
        ) / 1_000_000


def _read_price_file(path: Path) -> dict[str, ModelPrice]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PricingError(f"price table {path} does not exist") from None
    except (OSError, json.JSONDecodeError) as err:
        raise PricingError(f"price table {path} is not readable JSON: {err}") from None
    if not isinstance(data, dict):
        raise PricingError(f"price table {path} must be a JSON object mapping model names to prices")
    prices = {}
    for model, entry in data.items():
        if not isinstance(entry, dict):
            raise PricingError(f"price table {path}: {model!r} must map to an object like "
                               f'{{"input": 3.0, "output": 15.0}}')
        unknown = set(entry) - set(PRICE_FIELDS)
        missing = {"input", "output"} - set(entry)
        if unknown or missing:
            raise PricingError(
                f"price table {path}: {model!r} "
                + (f"has unknown fields {sorted(unknown)} " if unknown else "")
                + (f"lacks {sorted(missing)} " if missing else "")
                + f"(fields: {', '.join(PRICE_FIELDS)}; USD per million tokens)"
            )
        for name, value in entry.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise PricingError(f"price table {path}: {model}.{name} must be a non-negative number, "
                                   f"not {value!r}")
        prices[model] = ModelPrice.of(**{name: float(value) for name, value in entry.items()})
    return prices
