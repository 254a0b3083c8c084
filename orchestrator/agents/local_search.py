"""The optuna agent's search: `LocalSearch`, the Optuna sampler that proposes a neighbour of the best
configuration, first where the prior points, then by a screening pass, then at a growing radius
(see optuna_agent's docstring for why a local search; search_space.py for the space it moves in)."""
from __future__ import annotations

import ast
import json
import math
import random
from typing import Optional

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution

from .hyperparameter_block import format_value
from .ppo_priors import prior_of
from .search_space import (choice_beyond, clip, coarse, high_of, key_of, low_of, neighbour, steps_between,
                           steps_to)

# ---------------------------------------------------------------- the prior
# Where each constant usually sits (ppo_priors.PRIORS, from CleanRL's, SB3's, the rl-zoo's and
# PureJaxRL's configs): a constant of the best outside its range is the likeliest mistake in it, so
# the first trials around a best move such constants to the nearest edge of their range (a flag to
# its usual value), the furthest out first, then to their usual default, before any random neighbour.
# (The search space of such a constant reaches its default for that.) (All the way in one trial:
# an octave at a time, GAMMA 0.8 -> 0.9 on Pendulum gained +276 but so unevenly across seeds that
# the keep rule could not tell it from noise.) The shipped train.py has none outside.


def towards_typical(centre: dict, space: dict[str, BaseDistribution]) -> list[dict]:
    """The centre with one atypical constant moved to the nearest edge of its usual range (on the
    constant's step grid, inside its search bounds; a flag to its usual value; a power of two to the
    nearest one in range), one configuration per such constant, the furthest out first; then each such
    constant at its usual default: an edge can still be far from where the problem wants it, and the
    space derived around a detuned value ended at the edge (a drawn JAX_NUM_STEPS 64 -> 1 was searched
    over 1..8, so no trial could reach 64 or 128 without keeps on the way)."""
    edges, defaults = [], []
    for name, dist in space.items():
        prior, value = prior_of(name), centre.get(name)
        if prior is None or value is None or isinstance(value, str) or not prior.atypical(value):
            continue
        params = dict(centre)
        if isinstance(value, bool):
            params[name], far = prior.default, 1.0
        elif isinstance(dist, CategoricalDistribution):
            inside = [c for c in dist.choices if isinstance(c, (int, float)) and not isinstance(c, bool)
                      and prior.low <= c <= prior.high]
            if not inside or value <= 0:
                continue
            params[name] = min(inside, key=lambda c: abs(math.log2(max(c, 1e-12) / value)))
            far = 2 * abs(math.log2(params[name] / value))
        else:
            edge, sign = (prior.low, 1) if value < prior.low else (prior.high, -1)
            far = steps_between(value, edge, dist)
            moved = neighbour(value, dist, max(1, round(far)), random.Random(0), sign)
            # at the edge, not past it on the step grid (the space may reach on to the default)
            params[name] = type(value)(min(moved, edge) if sign > 0 else max(moved, edge))
        if format_value(params[name]) != format_value(value):
            edges.append((-far, name, params))
        default = _default_in(prior, value, dist)
        if default is not None and format_value(default) not in (format_value(value), format_value(params[name])):
            defaults.append((-far, name, {**centre, name: default}))
    order = lambda m: (m[0], m[1])  # noqa: E731
    return [params for _, _, params in sorted(edges, key=order) + sorted(defaults, key=order)]


def _default_in(prior, value, dist: BaseDistribution):
    """The prior's usual default as a value of the constant's search space (None for a flag)."""
    if isinstance(value, bool) or isinstance(prior.default, bool) or not isinstance(prior.default, (int, float)):
        return None
    return clip(type(value)(prior.default), dist)


# ---------------------------------------------------------------- the screening pass
# When nothing is known (no keep yet, or a best that stayed put for SCREEN_AFTER trials) the prior
# has nothing left to say: a constant can be wrong inside its usual range, or have no prior (one the
# agent added). The screen then moves each constant once, far (to its usual default when it sits
# elsewhere, else SCREEN_STEPS towards the side of its range with more room), one trial per
# constant. The loop's --screen trains each at a fraction of the budget and only those at least as
# good as the best go on to a full budget (so the agent screens only when the run does: at full
# budgets one pass would cost a dozen experiments). The trials that moved the score most, either
# way, name the constants the neighbourhood then spends its trials on (SCREEN_FOCUS of them, in the
# direction that helped, or away from the one that hurt).
SCREEN_AFTER = 8      # trials around one best without a keep before it is screened again
SCREEN_STEPS = 4      # a screening move when the constant sits at its default: two octaves
SCREEN_FOCUS = 4      # constants the trials after a screen move, until the radius reaches 3


def screening_moves(centre: dict, space: dict[str, BaseDistribution]) -> list[tuple[str, int, dict]]:
    """(name, sign, configuration) per constant: the centre with that one constant moved far."""
    moves = []
    for name in sorted(space):
        dist, value = space[name], centre[name]
        prior = prior_of(name)
        params = dict(centre)
        default = None if prior is None else _default_in(prior, value, dist)
        if isinstance(value, bool):
            params[name] = not value
        elif default is not None and format_value(default) != format_value(value) \
                and steps_to(value, prior.default, dist) >= 2:
            params[name] = default
        else:
            low, high = (prior.low, prior.high) if prior is not None and prior.low is not None else (None, None)
            room_down = steps_to(value, low if low is not None else low_of(dist), dist)
            room_up = steps_to(value, high if high is not None else high_of(dist), dist)
            sign = 1 if room_up >= room_down else -1
            params[name] = neighbour(value, dist, SCREEN_STEPS, random.Random(0), sign)
        if format_value(params[name]) == format_value(value):
            continue
        moved, old = params[name], value
        sign = 1 if (moved > old if not isinstance(moved, bool) else moved) else -1
        moves.append((name, sign, params))
    return moves


def screen_effects(trials) -> list[tuple[str, int]]:
    """The latest screen's constants, the most effective first, as (name, sign that helped).
    A screening trial at least as good as the best at the screen's budget went on to the full
    budget (COMPLETE): those come first, by score. The ones stopped at the screen (PRUNED, scored at
    the screen's budget) follow by how far their score is from the screen's median (most
    constants do not matter, so the median is the best's level): a move that hurt much names a
    constant that matters, to be moved the other way. A failed run tells nothing of direction: last."""
    screens = [t for t in trials if t.user_attrs.get("screen") and t.state != optuna.trial.TrialState.RUNNING]
    if not screens:
        return []
    latest = screens[-1].user_attrs["centre"]
    screens = [t for t in screens if t.user_attrs["centre"] == latest]
    pruned = [(t, t.intermediate_values.get(0)) for t in screens if t.state == optuna.trial.TrialState.PRUNED]
    pruned = [(t, v) for t, v in pruned if v is not None]
    median = sorted(v for _, v in pruned)[len(pruned) // 2] if pruned else 0.0
    ranked = []  # (rank, name, sign)
    for t in screens:
        name, sign = t.user_attrs["screen"], int(t.user_attrs["sign"])
        if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None:
            ranked.append(((0, -t.value), name, sign))
        elif t.state == optuna.trial.TrialState.FAIL:
            ranked.append(((2, 0.0), name, 0))
    for t, v in pruned:
        ranked.append(((1, -abs(v - median)), t.user_attrs["screen"],
                       int(t.user_attrs["sign"]) * (1 if v >= median else -1)))
    return [(name, sign) for _, name, sign in sorted(ranked, key=lambda r: r[0])]


# ---------------------------------------------------------------- the neighbourhood
WIDEN_EVERY = 4      # trials around one best before the trials may go one constant and one step further
MAX_RADIUS = 8


def _repeat_of_last_keep(trials, centre: dict, space: dict[str, BaseDistribution]) -> Optional[dict]:
    """`centre` moved again the way the last kept trial moved its centre (a rate x2 again, a discount's
    distance to 1 halved again, a power of two two octaves on), when `centre` is that trial's
    configuration; else None. A move that began outside the constant's usual range stops at its usual
    default: the prior points there, not past it (HIDDEN_SIZE 2048 -> 256 kept goes on to 64, not 32)."""
    kept = [t for t in trials if t.user_attrs.get("status") == "keep" and t.user_attrs.get("centre")]
    if not kept or key_of(kept[-1].params) != key_of(centre):
        return None
    before = {name: value for name, value in json.loads(kept[-1].user_attrs["centre"])}
    params, moved = dict(centre), False
    for name, dist in space.items():
        if name not in before or isinstance(centre[name], bool) or not isinstance(centre[name], (int, float)):
            continue
        if before[name] == format_value(centre[name]):  # as written (an int 10 is "10", not "10.0")
            continue
        old, new = float(ast.literal_eval(before[name])), float(centre[name])
        if old <= 0 < new or new <= 0 < old:
            continue
        sign = 1 if new > old else -1
        if isinstance(dist, CategoricalDistribution):
            again = choice_beyond(new, new * (new / old), sign, dist)
        else:
            # the same number of steps (at least one: a move cut short by a range's edge is not repeated shorter)
            again = neighbour(centre[name], dist, max(1, round(steps_between(old, new, dist))), random.Random(0), sign)
        if again is None:
            continue
        prior = prior_of(name)
        began_outside = prior is not None and prior.low is not None and prior.atypical(old)
        default = _default_in(prior, centre[name], dist) if began_outside else None
        if default is not None and sign * (default - new) > 0 and sign * (again - default) > 0:
            again = default
        params[name] = type(centre[name])(again)
        moved = moved or format_value(params[name]) != format_value(centre[name])
    return params if moved else None


class LocalSearch(optuna.samplers.BaseSampler):
    """Optuna sampler: a neighbour of the best configuration (`centre`, set before each ask) not
    tried before in the study. Trials around the same centre so far set the radius: 1 + that
    count // WIDEN_EVERY; a trial changes 1 to radius constants, each by 1 to radius steps, coarse
    constants only from radius 2 (a radius with no new neighbour left widens to the next).
    `space` (name -> distribution) is what may change; the agent sets both before asking."""

    def __init__(self, seed: Optional[int] = None, screening: bool = False):
        self.rng = random.Random(seed)
        self.screening = screening  # the screening pass (the run trains candidates at --screen first)
        self.space: dict[str, BaseDistribution] = {}
        self.centre: dict = {}
        self.last: dict = {}      # what the last sample_relative did: radius, changed names

    def reseed_rng(self) -> None:
        self.rng.seed()

    def infer_relative_search_space(self, study, trial) -> dict[str, BaseDistribution]:
        return dict(self.space)

    def sample_relative(self, study, trial, search_space: dict[str, BaseDistribution]) -> dict:
        if not search_space:
            return {}
        centre = {n: clip(self.centre[n], d) for n, d in search_space.items()}
        centre_key = json.dumps(key_of(centre))
        trials = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
        tried = {key_of(t.params) for t in trials if set(t.params) == set(search_space)}
        tried.add(key_of(centre))
        # (a screening pass's trials do not widen the neighbourhood: they were not in it)
        around = sum(1 for t in trials if t.user_attrs.get("centre") == centre_key and not t.user_attrs.get("screen"))
        # Momentum: the first trial around a best that a keep just made repeats the move that won
        # (a detuned constant is often several steps from where it should be).
        again = _repeat_of_last_keep(trials, centre, search_space) if around == 0 else None
        if again is not None and key_of(again) not in tried:
            changed = [n for n in sorted(again) if format_value(again[n]) != format_value(centre[n])]
            self.last = {"centre": centre_key, "radius": 1, "changed": changed, "momentum": True}
            return again
        # The prior: a constant far from where PPO's usually sit is tried towards there first.
        for params in towards_typical(centre, search_space):
            if key_of(params) not in tried:
                changed = [n for n in sorted(params) if format_value(params[n]) != format_value(centre[n])]
                self.last = {"centre": centre_key, "radius": 1, "changed": changed, "prior": True}
                return params
        # Nothing known: screen the constants (once per best; the first best at once).
        if self.screening:
            kept = any(t.user_attrs.get("status") == "keep" for t in trials)
            if not kept or around >= SCREEN_AFTER:
                for name, sign, params in screening_moves(centre, search_space):
                    if key_of(params) not in tried:
                        self.last = {"centre": centre_key, "radius": 1, "changed": [name], "screen": name,
                                     "sign": sign}
                        return params
        effects = screen_effects(trials)
        focus = {name: sign for name, sign in effects[:SCREEN_FOCUS] if name in search_space}
        radius = min(MAX_RADIUS, 1 + around // WIDEN_EVERY)
        while radius <= MAX_RADIUS:
            names = sorted(n for n in search_space if radius >= 2 or not coarse(search_space[n]))
            if focus and radius < 3:  # after a screen: the constants that moved the score first
                names = [n for n in names if n in focus] or names
            for _ in range(200 if names else 0):
                count = self.rng.randint(1, min(len(names), radius))
                params = dict(centre)
                for name in self.rng.sample(names, count):
                    steps = self.rng.randint(1, radius)
                    params[name] = neighbour(centre[name], search_space[name], steps, self.rng,
                                             focus.get(name) or None)
                if key_of(params) not in tried:
                    changed = [n for n in sorted(params) if format_value(params[n]) != format_value(centre[n])]
                    self.last = {"centre": centre_key, "radius": radius, "changed": changed}
                    if focus:
                        self.last["focus"] = sorted(focus)
                    return params
            radius += 1
        self.last = {"centre": centre_key, "radius": radius, "changed": [], "exhausted": True}
        return centre  # every neighbour was tried: the agent sees no change

    def sample_independent(self, study, trial, param_name, param_distribution):
        """Only for a constant outside the space given: it keeps the best's value."""
        return clip(self.centre[param_name], param_distribution)
