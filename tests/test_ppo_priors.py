"""Every constant of train.py's hyperparameter block has a prior from the literature, the shipped
block sits inside all of them, and a constant detuned far outside its range, whichever it is, is
the first one the default agent moves back (not only the GAMMA its prior was first written for)."""
from __future__ import annotations

import copy
import math

import pytest

from orchestrator.agents.hyperparameter_block import FIXED_NAMES, read_block
from orchestrator.agents.local_search import towards_typical
from orchestrator.agents.search_space import search_space
from orchestrator.agents.ppo_priors import PRIORS, prior_of
from tests.conftest import AUTORL_ROOT

SHIPPED = read_block((AUTORL_ROOT / "candidate" / "train.py").read_text())


def searchable():
    """The shipped block's constants the agent may move (copies: a test detunes its own)."""
    return [copy.copy(c) for c in SHIPPED if c.name not in FIXED_NAMES and not isinstance(c.value, str)]


def test_every_constant_of_the_block_has_a_prior_with_its_source():
    missing = [c.name for c in searchable() if prior_of(c.name) is None]
    assert not missing, f"constants without a prior: {missing}"
    for name, prior in PRIORS.items():
        assert prior.source, name
        if prior.low is None:
            assert prior.default in prior.usual or prior.usual == (False, True), name
        else:
            assert prior.low <= prior.default <= prior.high, name


def test_the_shipped_block_sits_inside_every_prior():
    centre = {c.name: c.value for c in searchable()}
    assert [c.name for c in searchable() if prior_of(c.name).atypical(c.value)] == []
    assert towards_typical(centre, search_space(searchable())) == []


def far_outside(name: str, value):
    """A detune of `name` well outside its usual range, the way bench/nights.py draws them."""
    prior = prior_of(name)
    if isinstance(value, bool):
        return not prior.default
    if "GAMMA" in name or "LAMBDA" in name:
        return round(1 - (1 - prior.low) * 4, 4)
    if prior.low > 0:
        low = prior.low / 8
        return int(max(1, low)) if isinstance(value, int) and low >= 1 else (low if isinstance(value, float) else None)
    return prior.high * 8 if isinstance(value, (int, float)) else None


# (a flag both of whose values are usual, CLIP_VLOSS, has nothing atypical to detect)
@pytest.mark.parametrize("name", [c.name for c in searchable() if prior_of(c.name).usual != (False, True)])
def test_a_constant_detuned_far_outside_its_range_is_moved_back_first(name):
    constants = searchable()
    shipped = {c.name: c.value for c in constants}
    prior = prior_of(name)
    detuned = far_outside(name, shipped[name])
    if detuned is None or not prior.atypical(detuned):
        # an integer constant whose range starts at 1 (or 0) cannot go below it: detune it above
        detuned = type(shipped[name])(prior.high * 8)
    assert prior.atypical(detuned), (name, detuned)
    centre = {**shipped, name: detuned}
    for constant in constants:
        if constant.name == name:
            constant.value = detuned
    moves = towards_typical(centre, search_space(constants))
    assert moves, f"{name} = {detuned} is outside {prior} and not moved"
    first = moves[0]
    assert [n for n in first if first[n] != centre[n]] == [name]
    moved = first[name]
    if isinstance(detuned, bool):
        assert moved == prior.default
    else:   # at the range, or at least much nearer to it
        distance = lambda v: 0.0 if prior.low <= v <= prior.high else min(
            abs(math.log(max(v, 1e-12) / prior.low)) if prior.low > 0 else abs(v - prior.low),
            abs(math.log(max(v, 1e-12) / prior.high)) if prior.high > 0 else abs(v - prior.high))
        assert distance(moved) < 0.5 * distance(detuned), (name, detuned, moved)
