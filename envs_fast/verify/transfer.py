"""L4 transfer: a linear policy trained on the backend by the cross-entropy method scores
equivalently (TOST) on the backend and on the reference; for a translation that declares
TRANSFER_PPO (a physics scene, where a linear policy learns too little to tell), PPO trained on the
backend scores on the reference as PPO trained there does (ppo_transfer.py)."""
from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np

from envs_fast.verify.report import LevelReport
from envs_fast.verify.stats import tost
from envs_fast.verify.ppo_transfer import run as ppo_transfer
from envs_fast.verify.context import Context
from envs_fast.verify.formatting import describe
from envs_fast.verify.shared import episode_returns, failing_on_crash, flatten_batch, statistical_horizon, tost_tolerance


def run(ctx: Context) -> LevelReport:
    report = LevelReport(4)
    with failing_on_crash(report):
        if ctx.declarations.transfer_ppo:
            ppo_transfer(ctx, report, ctx.declarations.transfer_ppo)
        else:
            _check(ctx, report)
    return report


def _check(ctx: Context, report: LevelReport):
    s = ctx.settings
    horizon = statistical_horizon(ctx)
    report.tolerances = tost_tolerance(s)
    weights, history = _train_cem(ctx, horizon)
    policy = _linear_policy(weights, ctx.action_space)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backend = episode_returns(ctx, True, s.seed + 5, s.episodes, horizon, policy)
        reference = episode_returns(ctx, False, s.seed + 5, s.episodes, horizon, policy)
    result = tost(backend, reference, margin_sd=s.margin_sd)
    report.largest_deviation = {"mean return difference": result.mean_a - result.mean_b, "margin": result.margin}
    report.add("trained policy transfers (TOST)", result.equivalent,
               f"linear policy trained on the backend by the cross-entropy method ({s.l4_iterations} iterations, "
               f"mean return {history[0]:.4g} -> {history[-1]:.4g}); scored over at most {horizon} steps: "
               f"backend {result.describe()}",
               None if result.equivalent else {"backend returns": describe(backend), "reference returns": describe(reference)})


def _train_cem(ctx: Context, horizon: int, population: int = 64, elite: int = 8):
    s = ctx.settings
    rng = np.random.default_rng(s.seed)
    dim_in = gym.spaces.flatdim(ctx.obs_space)
    space = ctx.action_space
    dim_out = space.n if isinstance(space, gym.spaces.Discrete) else int(np.prod(space.shape))
    mean, std = np.zeros((dim_in + 1, dim_out)), np.ones((dim_in + 1, dim_out))
    history = []
    venv = ctx.make_vec(population, s.seed + 9)
    try:
        for iteration in range(s.l4_iterations):
            candidates = mean + std * rng.normal(size=(population,) + mean.shape)
            obs, _ = venv.reset(seed=s.seed + 9 + iteration)
            returns, active = np.zeros(population), np.ones(population, bool)
            for _ in range(horizon):
                x = np.concatenate([np.clip(flatten_batch(ctx.obs_space, obs), -10, 10), np.ones((population, 1))], axis=1)
                scores = np.einsum("pi,pio->po", x, candidates)
                obs, reward, terminated, truncated, _ = venv.step(_scores_to_actions(scores, space))
                returns += np.where(active, reward, 0.0)
                active &= ~(terminated | truncated)
                if not active.any():
                    break
            best = candidates[np.argsort(returns)[-elite:]]
            mean, std = best.mean(axis=0), best.std(axis=0) + 0.05
            history.append(float(returns.mean()))
    finally:
        venv.close()
    return mean, history


def _scores_to_actions(scores: np.ndarray, space: gym.Space):
    if isinstance(space, gym.spaces.Discrete):
        return np.argmax(scores, axis=1) + space.start
    low = np.where(np.isfinite(space.low), space.low, -1.0).ravel()
    high = np.where(np.isfinite(space.high), space.high, 1.0).ravel()
    return (low + (np.tanh(scores) + 1) / 2 * (high - low)).reshape((len(scores),) + space.shape).astype(space.dtype)


def _linear_policy(weights: np.ndarray, action_space: gym.Space):
    def act(flat_obs: np.ndarray, _noise) -> np.ndarray:
        x = np.concatenate([np.clip(flat_obs, -10, 10), np.ones((len(flat_obs), 1))], axis=1)
        return _scores_to_actions(x @ weights, action_space)

    return act
