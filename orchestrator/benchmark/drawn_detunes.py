"""The night benchmark's drawn detunes (bench/nights.py --drawn N): problems the default agent
cannot be fitted to.

`--drawn N --envs Pendulum-v1,MountainCar-v0`: a family of problems the agent cannot be
fitted to. For each env, N draws (`--draw-seed S`, documented in the JSON): a constant drawn
uniformly from every constant of the block the night's path reads that has a prior
(orchestrator/agents/ppo_priors.py), set 4x, 8x or 16x outside its usual range (on its own scale: a
rate or a size divided or multiplied, a discount's distance to 1 multiplied, a flag off its usual
value; a constant only continuous actions read, such as INIT_LOG_STD, is not drawn for a discrete
env). Before the night the draw is checked to cost score on that path: the detuned and the
shipped train.py each train CHECK_RUNS baselines at the problem's budget (the daemon's own setup
and baselines, `--max-experiments 0`); a draw whose cost is under 4 sigma (sigma pooled over the
two groups' spreads, 6 degrees of freedom) is recorded as rejected and redrawn. (Draws checked
before November 27 trained 2 runs a side: sigma from 2 degrees of freedom, and Acrobot's
JAX_NUM_ENVS 32 -> 1 passed at 13.5 sigma and rescored no worse than the shipped train.py.) Each searcher's night then starts from the same
draw. `--json FILE` is rewritten after every night; `--resume FILE` reads such a file and adds the
nights it lacks (draws are reproducible from the seed).
"""
from __future__ import annotations

import math

import numpy as np

from orchestrator.benchmark.rescoring import REPO, TRAIN_PY

DRAW_FACTORS = (4, 8, 16)    # how far outside the usual range a drawn detune sits
COST_SIGMAS = 4.0            # a draw must cost at least this many sigma to be a problem
CHECK_RUNS = 4               # runs a side of the cost check


def drawable(path: str = "jax-e2e", env_id: str | None = None) -> list[tuple[str, object]]:
    """(name, shipped value) of every constant of the shipped block that the `path` reads (and
    `env_id`'s action space: a constant of continuous actions only is no problem on a discrete env)
    and that has a prior with something atypical to it."""
    from orchestrator.agents.hyperparameter_block import FIXED_NAMES, read_block, reads
    from orchestrator.agents.ppo_priors import prior_of

    text = (REPO / TRAIN_PY).read_text()
    lines, discrete = text.splitlines(), env_id is not None and _discrete(env_id)
    out = []
    for c in read_block(text):
        prior = prior_of(c.name)
        if c.name in FIXED_NAMES or isinstance(c.value, str) or prior is None or not reads(c.path, path):
            continue
        if discrete and "(continuous actions)" in lines[c.line]:   # its comment says so
            continue
        if prior.low is None and prior.usual == (False, True):
            continue
        out.append((c.name, c.value))
    return out


def _discrete(env_id: str) -> bool:
    import gymnasium as gym

    env = gym.make(env_id)
    try:
        return isinstance(env.action_space, gym.spaces.Discrete)
    finally:
        env.close()


def draw_detune(env_id: str, index: int, seed: int, path: str = "jax-e2e") -> dict:
    """Draw `index` of `env_id`: {constant, value, shipped, factor, side, why}; reproducible from `seed`."""
    from orchestrator.agents.ppo_priors import prior_of

    rng = np.random.default_rng([seed, index, sum(map(ord, env_id))])
    constants = drawable(path, env_id)
    name, shipped = constants[int(rng.integers(len(constants)))]
    prior, factor = prior_of(name), int(rng.choice(DRAW_FACTORS))
    if isinstance(shipped, bool):
        value, side = (not prior.default), "flag"
    elif "GAMMA" in name or "LAMBDA" in name:   # a discount: its distance to 1, factor times the usual one
        value, side = round(max(0.0, 1 - (1 - prior.low) * factor), 4), "below"
    else:
        below = prior.low > 0 and (not isinstance(shipped, int) or prior.low / factor >= 1) and rng.random() < 0.5
        if below:
            value, side = prior.low / factor, "below"
        else:
            value, side = (prior.high * factor if prior.high > 0 else prior.low - (prior.high - prior.low) * factor), "above"
        value = int(round(value)) if isinstance(shipped, int) else float(f"{value:.4g}")
    return {"env_id": env_id, "index": index, "seed": seed, "constant": name, "value": value, "shipped": shipped,
            "factor": factor, "side": side, "path": path,
            "why": f"{name} {shipped} -> {value} ({factor}x {side} its usual {prior.low}..{prior.high})"
            if prior.low is not None else f"{name} {shipped} -> {value} (off its usual value)"}


def cost_figures(detuned: list[float], shipped: list[float]) -> dict:
    """What a draw costs: the shipped train.py's mean minus the detuned one's, in sigma pooled over
    the two groups of runs (two runs a side: each pair's difference / sqrt 2)."""
    squares = sum(float(np.sum((np.asarray(g) - np.mean(g)) ** 2)) for g in (detuned, shipped))
    sigma = max(math.sqrt(squares / (len(detuned) + len(shipped) - 2)), 1e-9)
    cost = float(np.mean(shipped) - np.mean(detuned))
    return {"detuned": detuned, "shipped": shipped, "sigma": sigma, "cost": cost, "cost_sigmas": cost / sigma}
