"""Helpers more than one level uses: spaces, the fixed stochastic policy, episode returns over the
backend's vector env vs the reference, the tolerance texts of the report, crash handling. (The
formatters that need no Context are in formatting.py, which context.py imports too.)"""
from __future__ import annotations

from contextlib import contextmanager

import gymnasium as gym
import jax
import numpy as np

from envs_fast.verify.probes import field_names
from envs_fast.protocol import BackendError
from envs_fast.verify.report import LevelReport
from envs_fast.verify.context import Context, Settings


@contextmanager
def failing_on_crash(report: LevelReport):
    """A backend that raises mid-level fails the level with the reason; the checks done so far stay."""
    try:
        yield report
    except BackendError:
        raise
    except Exception as exc:
        report.add("runs", False, f"{type(exc).__name__}: {exc}")


def seeds(base: int, count: int) -> np.ndarray:
    """`count` distinct uint32 seeds from `base` (what a BatchedBackend takes per env)."""
    return ((base + np.arange(count, dtype=np.int64)) % 2**32).astype(np.uint32)


def stack(trees):
    """One batched pytree (numpy leaves with a leading axis) from single-env pytrees."""
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *trees)


# ---------------------------------------------------------------- spaces

def batched_in_space(space: gym.Space, batch) -> np.ndarray:
    """Per-env membership of a batched observation in a single space."""
    if isinstance(space, gym.spaces.Box):
        values = np.asarray(batch, dtype=np.float64).reshape((-1,) + space.shape)
        axes = tuple(range(1, values.ndim))
        return np.all((values >= space.low) & (values <= space.high), axis=axes) & np.all(np.isfinite(values) | ~np.isfinite(space.low), axis=axes)
    from gymnasium.vector.utils import iterate

    return np.array([space.contains(item) for item in iterate(gym.vector.utils.batch_space(space, len(jax.tree_util.tree_leaves(batch)[0])), batch)])


def flatten_batch(space: gym.Space, batch) -> np.ndarray:
    if isinstance(space, gym.spaces.Box):
        return np.asarray(batch, dtype=np.float64).reshape(len(batch), -1)
    from gymnasium.vector.utils import batch_space, iterate

    n = len(jax.tree_util.tree_leaves(batch)[0])
    return np.stack([gym.spaces.flatten(space, item) for item in iterate(batch_space(space, n), batch)]).astype(np.float64)


def obs_names(space: gym.Space) -> list[str]:
    """Per-component names of a flattened observation, e.g. `[2]`."""
    if isinstance(space, (gym.spaces.Box, gym.spaces.Discrete)):
        return field_names(space.sample())
    return [f"[{i}]" for i in range(gym.spaces.flatdim(space))]


# ---------------------------------------------------------------- policies and returns

def fixed_policy(space_in: gym.Space, space_out: gym.Space, seed: int):
    """A fixed stochastic policy: 75% a random linear map of the flattened observation, 25% random."""
    rng = np.random.default_rng(seed)
    dim_in = gym.spaces.flatdim(space_in)
    if isinstance(space_out, gym.spaces.Discrete):
        weights = rng.normal(size=(dim_in, space_out.n))
    elif isinstance(space_out, gym.spaces.Box):
        weights = rng.normal(size=(dim_in, int(np.prod(space_out.shape))))
    else:
        raise BackendError(f"statistical checks need a Discrete or Box action space, got {space_out}")

    def act(flat_obs: np.ndarray, noise: np.random.Generator) -> np.ndarray:
        scores = np.clip(flat_obs, -10, 10) @ weights / np.sqrt(dim_in)
        n = flat_obs.shape[0]
        explore = noise.random(n) < 0.25
        if isinstance(space_out, gym.spaces.Discrete):
            chosen = np.argmax(scores, axis=1) + space_out.start
            chosen[explore] = noise.integers(space_out.start, space_out.start + space_out.n, explore.sum())
            return chosen
        low = np.where(np.isfinite(space_out.low), space_out.low, -1.0).ravel()
        high = np.where(np.isfinite(space_out.high), space_out.high, 1.0).ravel()
        chosen = low + (np.tanh(scores) + 1) / 2 * (high - low)
        chosen[explore] = noise.uniform(low, high, size=(explore.sum(), low.size))
        return chosen.reshape((n,) + space_out.shape).astype(space_out.dtype)

    return act


def episode_returns(ctx: Context, run_backend: bool, policy_seed: int, episodes: int, horizon: int,
                    policy=None) -> np.ndarray:
    """Returns of `episodes` episodes of at most `horizon` steps under `policy` (default: the fixed
    policy), on the backend's vector env or on the reference."""
    policy = policy or fixed_policy(ctx.obs_space, ctx.action_space, policy_seed)
    noise = np.random.default_rng(policy_seed + (1 if run_backend else 2))
    returns = np.zeros(episodes)
    if run_backend:
        venv = ctx.make_vec(episodes, ctx.settings.seed + 1)
        obs, _ = venv.reset(seed=ctx.settings.seed + 1)
        active = np.ones(episodes, bool)
        for _ in range(horizon):
            obs, reward, terminated, truncated, _ = venv.step(policy(flatten_batch(ctx.obs_space, obs), noise))
            returns += np.where(active, reward, 0.0)
            active &= ~(terminated | truncated)
            if not active.any():
                break
        venv.close()
        return returns
    for episode in range(episodes):
        obs, _ = ctx.reference.reset(seed=20_000 + episode)
        for _ in range(horizon):
            action = policy(gym.spaces.flatten(ctx.obs_space, obs)[None].astype(np.float64), noise)[0]
            obs, reward, terminated, truncated, _ = ctx.reference.step(action)
            returns[episode] += reward
            if terminated or truncated:
                break
    return returns


def statistical_horizon(ctx: Context) -> int:
    return min(ctx.max_episode_steps or ctx.settings.horizon, ctx.settings.horizon)


# ---------------------------------------------------------------- tolerances in the report

def tolerance_text(s: Settings) -> str:
    return f"|backend - reference| <= {s.atol:g} + {s.rtol:g} * |reference|"


def tost_tolerance(s: Settings) -> dict[str, str]:
    return {"TOST": f"equivalence margin {s.margin_sd} pooled sd (floor 1% of the reference mean), alpha 0.05"}


def twin_tolerances(departures: list[dict]) -> dict[str, str]:
    """The report's account of a float32 backend verified through its float64 twin (Context.twin):
    what the tolerances above were held to, and how far the backend itself is from it."""
    compared = sum(d["steps"] for d in departures)
    beyond = sum(d["beyond"] for d in departures)
    worst = max(departures, key=lambda d: d["fraction of allowed"], default=None)
    if worst is None or "field" not in worst:
        measured = "its steps equal the twin's"
    else:
        measured = (f"its steps depart from the twin's by up to {worst['fraction of allowed']:.3g} times the base tolerance "
                    f"({worst['field']}, {worst['origin']}, in '{worst['check']}'); {beyond} of {compared} steps go beyond it")
    return {"float64 twin": "the tolerances above hold the backend's float64 twin (the same program under "
                            "jax_enable_x64) to the reference, which computes in float64: the algorithm, apart from float32 rounding",
            "float32 backend": f"not held to them, as float32 rounding at stiff constraints exceeds them; {measured}; "
                               "L1 and L4 (what a policy trained on it scores on the reference) run the float32 backend itself"}
