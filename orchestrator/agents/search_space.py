"""The space of each hyperparameter the optuna agent may move, and how a value moves in it: the
range (derived once from the baseline's value and the constant's usual range, ppo_priors), the
steps of a move on the constant's own scale (half-octaves of a rate or a size, of a discount's
distance to 1, sixteenths of a signed range), and the configuration as train.py's block writes it."""
from __future__ import annotations

import math
import random
from typing import Optional

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from .hyperparameter_block import FIXED_NAMES, Constant, format_value
from .ppo_priors import prior_of


def _around(low: float, high: float, value: float) -> tuple[float, float]:
    return min(low, value), max(high, value)


def _categorical(choices: list, value) -> CategoricalDistribution:
    return CategoricalDistribution(sorted(set(choices) | {value}))


DISCOUNT_WORDS = ("GAMMA", "LAMBDA")   # a discount or a GAE lambda: below 1 whatever its value


def distribution_for(name: str, value) -> Optional[BaseDistribution]:
    """A search range around the baseline value (None: the constant stays fixed), reaching the
    constant's usual range, and its usual default, when the value is outside it (ppo_priors)."""
    dist = _range_around(name, value)
    typical = typical_range(name)
    if typical is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return dist
    atypical = not typical[0] <= value <= typical[1]
    default = prior_of(name).default
    if isinstance(dist, CategoricalDistribution):  # powers of two: the one nearest the range joins the choices
        if not atypical or not all(isinstance(c, int) for c in dist.choices):
            return dist
        extra = {_nearest_power(typical[0] if value < typical[0] else typical[1], typical)}
        if isinstance(default, int) and not isinstance(default, bool):
            extra.add(_nearest_power(default, typical))
        return CategoricalDistribution(sorted(set(dist.choices) | extra))
    if not isinstance(dist, (FloatDistribution, IntDistribution)):
        return dist
    low, high = min(dist.low, typical[1]), max(dist.high, typical[0])   # the nearest edge at least
    if atypical and isinstance(default, (int, float)) and not isinstance(default, bool):
        low, high = min(low, default), max(high, default)   # and the default the prior tries after it
    if dist.log and low <= 0:
        return dist
    return type(dist)(type(dist.low)(low), type(dist.high)(high), log=dist.log)


def _nearest_power(value: float, typical: tuple) -> int:
    """The power of two nearest `value`, if it is inside the usual range, else `value` itself."""
    power = 2 ** round(math.log2(max(value, 1)))
    return power if typical[0] <= power <= typical[1] else int(value)


def _range_around(name: str, value) -> Optional[BaseDistribution]:
    if name in FIXED_NAMES or "SEED" in name or isinstance(value, str) or value is None:
        return None
    if name == "LEARNING_RATE" and isinstance(value, float) and value > 0:
        return FloatDistribution(*_around(1e-5, 3e-3, value), log=True)
    if name == "ENT_COEF" and isinstance(value, (int, float)) and value >= 0:
        return FloatDistribution(*_around(0.0, 0.02, float(value)))
    if name == "INIT_LOG_STD" and isinstance(value, (int, float)):
        return FloatDistribution(*_around(-1.5, 0.5, float(value)))
    if name == "TARGET_KL" and isinstance(value, (int, float)):
        return _categorical([0.0, 0.01, 0.02, 0.05], float(value))
    if isinstance(value, bool):
        return CategoricalDistribution([False, True])
    if isinstance(value, int):
        if value >= 2 and value & (value - 1) == 0:  # a power of two stays one
            return _categorical([max(1, value // 4), value // 2, value * 2, value * 4], value)
        if value >= 1:
            return IntDistribution(max(1, value // 3), max(value * 3, value + 2))
        return None
    if isinstance(value, float):
        if value == 0:
            return None  # no scale to search around
        discount = any(word in name for word in DISCOUNT_WORDS)
        if 0.9 <= value < 1 or (discount and 0.5 <= value < 1):  # discount-like: search the distance to 1
            return FloatDistribution(max(0.5, 1 - (1 - value) * 4), 1 - (1 - value) / 4)
        if discount and 0 < value < 1:  # a discount (or GAE lambda) never reaches 1
            return FloatDistribution(value / 3, min(3 * value, 0.5), log=True)
        if value > 0:
            factor = 10 if value < 0.01 else 3
            return FloatDistribution(value / factor, value * factor, log=True)
        return FloatDistribution(value * 3, value / 3)
    return None


def search_space(constants: list[Constant], only: Optional[set[str]] = None) -> dict[str, BaseDistribution]:
    space = {}
    for const in constants:
        if only is not None and const.name not in only:
            continue
        dist = distribution_for(const.name, const.value)
        if dist is not None:
            space[const.name] = dist
    return space


def typical_range(name: str) -> Optional[tuple]:
    prior = prior_of(name)
    return None if prior is None or prior.low is None else (prior.low, prior.high)


def steps_between(value: float, edge: float, dist: BaseDistribution) -> float:
    """How many of neighbour()'s steps lie between `value` and `edge` on the constant's scale."""
    if discount_like(dist):
        return 2 * abs(math.log2((1 - value) / (1 - edge)))
    if (dist.log or isinstance(dist, IntDistribution)) and value > 0 and edge > 0:
        return 2 * abs(math.log2(value / edge))
    return abs(value - edge) / ((dist.high - dist.low) / 16)


def discount_like(dist: BaseDistribution) -> bool:
    return isinstance(dist, FloatDistribution) and not dist.log and 0.5 <= dist.low and dist.high < 1


def low_of(dist: BaseDistribution):
    return min(dist.choices) if isinstance(dist, CategoricalDistribution) else dist.low


def high_of(dist: BaseDistribution):
    return max(dist.choices) if isinstance(dist, CategoricalDistribution) else dist.high


def steps_to(value, edge, dist: BaseDistribution) -> float:
    """steps_between for any numeric constant (choices of powers of two: half-octaves too)."""
    if isinstance(dist, CategoricalDistribution):
        if value > 0 and edge > 0:
            return 2 * abs(math.log2(edge / value))
        return abs(edge - value)
    return steps_between(value, edge, dist)


def key_of(params: dict) -> tuple:
    """A configuration as it is written into train.py (floats to 4 significant digits)."""
    return tuple(sorted((name, format_value(value)) for name, value in params.items()))


def _rounded(value):
    return float(f"{value:.4g}") if isinstance(value, float) else value


def clip(value, dist: BaseDistribution):
    """A value inside the distribution (the best's value can be outside the stored range)."""
    if isinstance(dist, CategoricalDistribution):
        if value in dist.choices:
            return value
        numeric = [c for c in dist.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
        if numeric and isinstance(value, (int, float)):
            return min(numeric, key=lambda c: abs(c - value))
        return dist.choices[0]
    return min(max(value, dist.low), dist.high)


def coarse(dist: BaseDistribution) -> bool:
    """A constant whose smallest move is large (a flag, a power of two, a list of choices): it
    moves from radius 2 on."""
    return isinstance(dist, CategoricalDistribution)


def neighbour(value, dist: BaseDistribution, steps: int, rng: random.Random, sign: Optional[int] = None):
    """`value` moved by `steps` half-octaves (up or down: `sign`, else at random) in the constant's own
    scale, inside its bounds; the same value when no move is possible that way."""
    sign = sign or rng.choice((-1, 1))
    if isinstance(dist, CategoricalDistribution):
        choices = list(dist.choices)
        if len(choices) == 2 and set(map(type, choices)) == {bool}:
            return not value
        if all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices):
            choices.sort()
        index = choices.index(value) if value in choices else 0
        jump = max(1, steps // 2)  # neighbouring powers of two are an octave apart: two steps
        return choices[min(max(index + sign * jump, 0), len(choices) - 1)]
    if isinstance(dist, IntDistribution):  # sizes: half-octave steps, at least 1
        moved = int(round(value * 2 ** (sign * steps / 2)))
        if moved == value:
            moved = value + sign
        return int(min(max(moved, dist.low), dist.high))
    low, high = dist.low, dist.high
    if discount_like(dist):  # discount-like: half-octave steps of 1 - value
        moved = 1 - (1 - value) * 2 ** (-sign * steps / 2)
    elif dist.log:  # rates and other positive scales: half-octave steps
        moved = value * 2 ** (sign * steps / 2)
    else:  # signed or zero-based (entropy coefficient, log-std): sixteenths of the range
        moved = value + sign * steps * (high - low) / 16
    return min(max(_rounded(moved), low), high)  # (rounded first: a value rounded past a bound is no sample)


def choice_beyond(value: float, target: float, sign: int, dist: CategoricalDistribution):
    """The numeric choice past `value` on the `sign` side nearest `target` (on a log scale), or None."""
    beyond = [c for c in dist.choices if isinstance(c, (int, float)) and not isinstance(c, bool)
              and sign * (c - value) > 0 and c > 0]
    if not beyond or target <= 0:
        return None
    return min(beyond, key=lambda c: abs(math.log2(c / target)))


def widened(space: dict[str, BaseDistribution], best: dict) -> dict[str, BaseDistribution]:
    """The space with each range the best has reached the edge of extended past it, as far again as
    distribution_for would reach from there: a start detuned beyond the first range can still walk
    all the way back."""
    out = dict(space)
    for name, dist in space.items():
        value = best.get(name)
        if isinstance(dist, CategoricalDistribution) or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        wider = distribution_for(name, value)
        if wider is None or type(wider) is not type(dist) or wider.log != dist.log:
            continue
        # (within the 4 significant digits train.py's block is written with)
        at_low, at_high = value <= dist.low * (1 + 1e-3), value >= dist.high * (1 - 1e-3)
        if at_low or at_high:
            low = min(dist.low, wider.low) if at_low else dist.low
            high = max(dist.high, wider.high) if at_high else dist.high
            out[name] = type(dist)(low, high, log=dist.log)
    return out
