"""L3 rollouts: whole action sequences from a synced start, compared step by step up to the
reference's own predictable horizon; without state sync, or for a stochastic reference, return
distributions under a fixed policy compared by TOST."""
from __future__ import annotations

import warnings

import gymnasium as gym
import jax
import numpy as np

from envs_fast.probes import ReferenceStepper, field_names, flat_values, perturb_float32, scripted_plans
from envs_fast.report import LevelReport
from envs_fast.stats import tost
from envs_fast.verify.context import STATISTICAL_ONLY, Context
from envs_fast.verify.formatting import describe, format_action, format_state, num
from envs_fast.verify.shared import (episode_returns, failing_on_crash, seeds, stack, statistical_horizon, tolerance_text,
                                     tost_tolerance)


def run(ctx: Context) -> LevelReport:
    report = LevelReport(3)
    with failing_on_crash(report):
        _check(ctx, report)
    return report


def _check(ctx: Context, report: LevelReport):
    syncs = bool(ctx.backend and ctx.backend.syncs_state)
    sync = ctx.sync
    if sync.broken:
        report.add("trajectories from synced starts", False,
                   "the backend's state sync does not round-trip, so trajectories cannot start in sync (see L2)")
    elif syncs and not sync.stochastic:
        _synced(ctx, report)
    else:
        report.note = ("the reference is stochastic: return distributions under a fixed policy, TOST"
                       if syncs else STATISTICAL_ONLY)
        _returns_equivalence(ctx, report)


def _synced(ctx: Context, report: LevelReport):
    s = ctx.settings
    report.tolerances = {"per step": tolerance_text(s) + f" + {s.chaos_factor:g} * |shadow - reference|",
                         "shadow": "the reference itself with its state rounded to float32 after every step (and, in a second "
                                   "run, also moved by one float32 rounding); "
                                   "steps where it has diverged (>1% or a different termination) are past the "
                                   "predictable horizon and not compared"}
    horizon = min(ctx.max_episode_steps or s.rollout_steps, s.rollout_steps)
    stepper = ReferenceStepper(ctx.env_id, ctx.backend)
    plans = scripted_plans(ctx.action_space)
    ctx.action_space.seed(s.seed + 7)
    trajectories = []
    try:
        for i in range(s.l3_trajectories):
            if i < len(plans):
                name, plan = plans[i]
                actions = [plan(t) for t in range(horizon)]
            else:
                name, actions = "random actions", [ctx.action_space.sample() for _ in range(horizon)]
            trajectories.append(_reference_trajectory(ctx, stepper, s.seed + 100 + i, actions, name))
    finally:
        stepper.close()
    start = stack([t["start"] for t in trajectories])
    actions = np.stack([np.stack([np.asarray(a) for a in t["actions"]]) for t in trajectories])
    try:
        out = ctx.backend.rollout(seeds(s.seed, len(trajectories)), start, actions)
    except Exception as exc:
        report.add("trajectories from synced starts", False, f"the backend failed: {type(exc).__name__}: {exc}")
        return
    compared, horizons, lengths, first = 0, [], [], None
    largest = None
    for index, traj in enumerate(trajectories):
        b_obs, b_reward, b_term = out[0][index], out[1][index], out[2][index]
        steps = len(traj["reward"])
        predictable = steps
        for t in range(steps):
            ref = np.concatenate([traj["obs"][t], [traj["reward"][t]]])
            spread = np.max([np.abs(np.concatenate([o[t], [r[t]]]) - ref)
                             for o, r in zip(traj["shadow_obs"], traj["shadow_reward"])], axis=0)
            if (any(term[t] != traj["term"][t] for term in traj["shadow_term"])
                    or np.max(spread / (1 + np.abs(ref))) > 0.01):
                predictable = t
                break
            back = np.concatenate([b_obs[t], [b_reward[t]]])
            allowed = s.atol + s.rtol * np.abs(ref) + s.chaos_factor * spread
            diff = np.abs(back - ref)
            relative = diff / allowed
            worst = int(np.nanargmax(relative))
            if largest is None or relative[worst] > largest["fraction of allowed"]:
                largest = {"field": traj["names"][worst], "abs": float(diff[worst]), "allowed": float(allowed[worst]),
                           "fraction of allowed": float(relative[worst]), "trajectory": index, "step": t}
            compared += 1
            bad = (diff > allowed) | np.isnan(back)
            term_bad = bool(b_term[t]) != traj["term"][t]
            if (bad.any() or term_bad) and first is None:
                fields = [{"field": traj["names"][j], "reference": num(ref[j]), "backend": num(back[j]),
                           "diff": f"{diff[j]:.3g}", "allowed": f"{allowed[j]:.3g}"} for j in np.flatnonzero(bad)]
                if term_bad:
                    fields.append({"field": "terminated", "reference": traj["term"][t], "backend": bool(b_term[t]),
                                   "diff": "", "allowed": "exact"})
                first = {"trajectory": f"{traj['name']}, reset seed {traj['seed']}", "step": t,
                         "state": format_state(traj["states"][t]), "action": format_action(traj["actions"][t]),
                         "fields": fields}
            if bad.any() or term_bad:
                break
        horizons.append(predictable)
        lengths.append(steps)
    report.largest_deviation = largest
    detail = (f"{len(trajectories)} trajectories of up to {horizon} steps ({sum(lengths)} reference steps), "
              f"{compared} steps compared")
    past = [h for h, n in zip(horizons, lengths) if h < n]
    if past:
        detail += f"; {len(past)} trajectories went past the reference's predictable horizon (earliest at step {min(past)})"
    report.add("trajectories from synced starts", first is None, detail, first)


def _reference_trajectory(ctx: Context, stepper: ReferenceStepper, seed: int, actions: list, name: str) -> dict:
    start = stepper.write_state(stepper.reset(seed))
    obs_names = ["obs" + n for n in field_names(ctx.obs_space.sample())] \
        if isinstance(ctx.obs_space, (gym.spaces.Box, gym.spaces.Discrete)) else None
    traj = {"name": name, "seed": seed, "start": start, "states": [start], "obs": [], "reward": [], "term": [],
            "shadow_obs": [], "shadow_reward": [], "shadow_term": [], "actions": actions}
    for action in actions:
        obs, reward, terminated, state = stepper.step(action)
        traj["obs"].append(flat_values(obs))
        traj["reward"].append(reward)
        traj["term"].append(terminated)
        traj["states"].append(state)
        if terminated:
            break
    for shadow in range(2):  # two runs of the reference itself under float32-sized perturbations
        rng = np.random.default_rng(seed + shadow)
        stepper.write_state(start)
        shadow_obs, shadow_reward, shadow_term = [], [], []
        for action in actions[: len(traj["reward"])]:
            obs, reward, terminated, state = stepper.step(action)
            shadow_obs.append(flat_values(obs))
            shadow_reward.append(reward)
            shadow_term.append(terminated)
            rounded = jax.tree_util.tree_map(
                lambda x: np.asarray(x).astype(np.float32) if np.asarray(x).dtype.kind == "f" else x, state)
            if shadow:
                rounded = perturb_float32(rounded, rng.choice([-1.0, 1.0], size=flat_values(rounded).size))
            stepper.write_state(rounded)
        traj["shadow_obs"].append(shadow_obs)
        traj["shadow_reward"].append(shadow_reward)
        traj["shadow_term"].append(shadow_term)
    names = obs_names or [f"obs[{j}]" for j in range(len(traj["obs"][0]))]
    traj["names"] = names + ["reward"]
    return traj


def _returns_equivalence(ctx: Context, report: LevelReport):
    s = ctx.settings
    horizon = statistical_horizon(ctx)
    report.tolerances = tost_tolerance(s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backend = episode_returns(ctx, True, s.seed + 3, s.episodes, horizon)
        reference = episode_returns(ctx, False, s.seed + 3, s.episodes, horizon)
    result = tost(backend, reference, margin_sd=s.margin_sd)
    report.largest_deviation = {"mean return difference": result.mean_a - result.mean_b, "margin": result.margin}
    report.add("return distribution (fixed policy, TOST)", result.equivalent,
               f"return over at most {horizon} steps: backend {result.describe()}",
               None if result.equivalent else {"policy": "75% fixed random linear map of the observation, 25% uniform random",
                                               "backend returns": describe(backend), "reference returns": describe(reference)})
