"""L3 rollouts: whole action sequences from a synced start, compared step by step up to the
reference's own predictable horizon; without state sync, or for a stochastic reference, return
distributions under a fixed policy compared by TOST."""
from __future__ import annotations

import warnings

import gymnasium as gym
import jax
import numpy as np

from envs_fast.verify.probes import ReferenceStepper, field_names, flat_values, perturb_float32, scripted_plans
from envs_fast.verify.report import LevelReport
from envs_fast.verify.stats import tost
from envs_fast.verify.context import STATISTICAL_ONLY, Context
from envs_fast.verify.formatting import describe, format_action, format_state, num
from envs_fast.verify.shared import (episode_returns, failing_on_crash, seeds, stack, statistical_horizon, tolerance_text,
                                     tost_tolerance, twin_tolerances)


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
        if ctx.declarations.chaotic:  # past each trajectory's predictable horizon only distributions can be compared
            _episode_statistics(ctx, report)
    else:
        report.note = ("the reference is stochastic: return distributions under a fixed policy, TOST"
                       if syncs else STATISTICAL_ONLY)
        _returns_equivalence(ctx, report)


def _synced(ctx: Context, report: LevelReport):
    s = ctx.settings
    chaotic = ctx.declarations.chaotic
    if chaotic:
        report.tolerances = {
            "per step": tolerance_text(s) + ", up to each trajectory's predictable horizon",
            "predictable horizon": "the first step at which the reference itself, started from the same state moved by one "
                                   "float32 rounding, departs from its own run by more than that tolerance (or ends "
                                   "otherwise): where a port that rounds one operation differently could no longer be "
                                   "told from a wrong one"}
    else:
        report.tolerances = {"per step": tolerance_text(s) + f" + {s.chaos_factor:g} * |shadow - reference|",
                             "shadow": "the reference itself with its state rounded to float32 after every step (and, in a second "
                                       "run, also moved by one float32 rounding); "
                                       "steps where it has diverged (>1% or a different termination) are past the "
                                       "predictable horizon and not compared"}
    horizon = min(ctx.max_episode_steps or s.rollout_steps, s.rollout_steps)
    stepper = ReferenceStepper(ctx.env_id, ctx.backend)
    plans = [(name, (lambda t, obs, plan=plan: plan(t)), False) for name, plan in scripted_plans(ctx.action_space)]
    plans += [(policy.name, policy, policy.past_termination) for policy in ctx.declarations.policies]
    ctx.action_space.seed(s.seed + 7)
    trajectories = []
    try:
        for i in range(max(s.l3_trajectories, len(plans))):
            if i < len(plans):
                name, plan, past_end = plans[i]
            else:  # drawn up front, a whole horizon's worth, so later trajectories' draws do not hang on this one's end
                drawn = [ctx.action_space.sample() for _ in range(horizon)]
                name, plan, past_end = "random actions", (lambda t, obs, drawn=drawn: drawn[t]), False
            if not callable(plan):  # a declared policy: closed loop on the reference's observations
                plan = (lambda act: (lambda t, obs: act(obs)))(plan.make(s.seed + 100 + i))
            traj = _reference_trajectory(ctx, stepper, s.seed + 100 + i, plan, horizon, name, past_termination=past_end,
                                         record_states=not chaotic)
            if chaotic:
                traj["predictable"] = _nudged_horizon(ctx, stepper, traj)
            else:
                _shadow_runs(stepper, traj)
            trajectories.append(traj)
        longest = max(len(t["actions"]) for t in trajectories)
        start = stack([t["start"] for t in trajectories])
        # actions padded to the longest trajectory (steps past a trajectory's end are not compared)
        actions = np.stack([np.stack([np.asarray(a) for a in t["actions"]]
                                     + [np.asarray(t["actions"][-1])] * (longest - len(t["actions"])))
                            for t in trajectories])
        try:
            out = ctx.compared.rollout(seeds(s.seed, len(trajectories)), start, actions)
            own = ctx.backend.rollout(seeds(s.seed, len(trajectories)), start, actions) if ctx.twin else None
        except Exception as exc:
            report.add("trajectories from synced starts", False, f"the backend failed: {type(exc).__name__}: {exc}")
            return
        compared = _compare_trajectories(ctx, report, stepper, trajectories, out)
        if own is not None:
            report.tolerances.update(twin_tolerances([_departure(ctx, trajectories, compared, out, own)]))
    finally:
        stepper.close()


def _compare_trajectories(ctx: Context, report: LevelReport, stepper: ReferenceStepper, trajectories: list, out):
    s = ctx.settings
    compared, exact, horizons, lengths, first = 0, 0, [], [], None
    largest, steps_compared = None, []
    for index, traj in enumerate(trajectories):
        b_obs, b_reward, b_term = out[0][index], out[1][index], out[2][index]
        steps = len(traj["reward"])
        predictable = traj.get("predictable", steps)
        compared_before = compared
        for t in range(steps):
            if t >= predictable:
                break
            ref = np.concatenate([traj["obs"][t], [traj["reward"][t]]])
            spread = np.zeros_like(ref)
            if traj["shadow_obs"]:
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
            exact += not (bad.any() or term_bad) and not diff.any()
            if (bad.any() or term_bad) and first is None:
                fields = [{"field": traj["names"][j], "reference": num(ref[j]), "backend": num(back[j]),
                           "diff": f"{diff[j]:.3g}", "allowed": f"{allowed[j]:.3g}"} for j in np.flatnonzero(bad)]
                if term_bad:
                    fields.append({"field": "terminated", "reference": traj["term"][t], "backend": bool(b_term[t]),
                                   "diff": "", "allowed": "exact"})
                first = {"trajectory": f"{traj['name']}, reset seed {traj['seed']}", "step": t,
                         "state": format_state(_state_before(stepper, traj, t)), "action": format_action(traj["actions"][t]),
                         "fields": fields}
            if bad.any() or term_bad:
                break
        horizons.append(predictable)
        lengths.append(steps)
        steps_compared.append(compared - compared_before)
    report.largest_deviation = largest
    names = list(dict.fromkeys(t["name"] for t in trajectories))
    detail = (f"{len(trajectories)} trajectories of up to {max(lengths)} steps ({sum(lengths)} reference steps; "
              f"{', '.join(names)}), {compared} steps compared, {exact} of them bit for bit")
    past = [h for h, n in zip(horizons, lengths) if h < n]
    if ctx.declarations.chaotic:
        detail += "; predictable horizon per trajectory " + _horizon_summary(trajectories, horizons)
    elif past:
        detail += f"; {len(past)} trajectories went past the reference's predictable horizon (earliest at step {min(past)})"
    report.add("trajectories from synced starts", first is None, detail, first)
    return steps_compared


def _departure(ctx: Context, trajectories: list, steps_compared: list[int], twin, own) -> dict:
    """How far the float32 backend's trajectories are from its float64 twin's over the steps L3 compared,
    in units of the base tolerance (atol + rtol * |twin|); a differing termination counts as beyond."""
    s = ctx.settings
    worst = {"check": "trajectories from synced starts", "fraction of allowed": 0.0, "steps": sum(steps_compared), "beyond": 0}
    for index, (traj, n) in enumerate(zip(trajectories, steps_compared)):
        twin_values = np.concatenate([twin[0][index][:n], twin[1][index][:n, None]], axis=1)
        own_values = np.concatenate([own[0][index][:n], own[1][index][:n, None]], axis=1)
        relative = np.abs(own_values - twin_values) / (s.atol + s.rtol * np.abs(twin_values))
        relative = np.where(np.isnan(relative), np.inf, relative)
        flips = twin[2][index][:n] != own[2][index][:n]
        worst["beyond"] += int(((relative > 1).any(axis=1) | flips).sum())
        if n and relative.max() > worst["fraction of allowed"]:
            t, j = np.unravel_index(int(np.argmax(relative)), relative.shape)
            worst.update({"fraction of allowed": float(relative[t, j]), "field": traj["names"][j],
                          "origin": f"{traj['name']}, reset seed {traj['seed']}, step {t}"})
    return worst


def _horizon_summary(trajectories: list, horizons: list) -> str:
    """min/median/max of the measured horizons, per kind of trajectory."""
    parts = []
    for name in dict.fromkeys(t["name"] for t in trajectories):
        found = [h for t, h in zip(trajectories, horizons) if t["name"] == name]
        parts.append(f"{name} {min(found)}/{int(np.median(found))}/{max(found)}")
    return "(min/median/max steps): " + ", ".join(parts)


def _reference_trajectory(ctx: Context, stepper: ReferenceStepper, seed: int, plan, steps: int, name: str,
                          past_termination: bool = False, record_states: bool = True) -> dict:
    """The reference from its reset state (written, so both sides start from what it reads back) under
    `plan(t, observation)`; the actions taken are recorded for the backend to replay. Without
    `record_states` the states along the way are not read (a physics scene's read is slow): a failure
    replays the actions to the step it needs (_state_before)."""
    obs, _ = stepper.env.reset(seed=seed)
    start = stepper.write_state(stepper.read_state())
    obs_names = ["obs" + n for n in field_names(ctx.obs_space.sample())] \
        if isinstance(ctx.obs_space, (gym.spaces.Box, gym.spaces.Discrete)) else None
    traj = {"name": name, "seed": seed, "start": start, "states": [start], "obs": [], "reward": [], "term": [],
            "shadow_obs": [], "shadow_reward": [], "shadow_term": [], "actions": []}
    for t in range(steps):
        action = plan(t, obs)
        traj["actions"].append(action)
        if record_states:
            obs, reward, terminated, state = stepper.step(action)
            traj["states"].append(state)
        else:
            obs, reward, terminated = _bare_step(stepper, action)
        traj["obs"].append(flat_values(obs))
        traj["reward"].append(reward)
        traj["term"].append(terminated)
        if terminated and not past_termination:
            break
    names = obs_names or [f"obs[{j}]" for j in range(len(traj["obs"][0]))]
    traj["names"] = names + ["reward"]
    return traj


def _bare_step(stepper: ReferenceStepper, action):
    """A reference step without reading the state back."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        obs, reward, terminated, _truncated, _info = stepper.unwrapped.step(action)
    return obs, float(reward), bool(terminated)


def _state_before(stepper: ReferenceStepper, traj: dict, t: int):
    """The reference's state before step t of the trajectory (replayed when it was not recorded)."""
    if len(traj["states"]) > t:
        return traj["states"][t]
    stepper.write_state(traj["start"])
    for action in traj["actions"][:t]:
        _bare_step(stepper, action)
    return stepper.read_state()


def _nudged_horizon(ctx: Context, stepper: ReferenceStepper, traj: dict) -> int:
    """The trajectory's predictable horizon: the reference rerun from its start moved by one float32
    rounding (every float field, random signs) under the same actions; the first step at which it
    departs from the trajectory by more than the tolerance, or ends differently."""
    s = ctx.settings
    rng = np.random.default_rng(traj["seed"])
    stepper.write_state(perturb_float32(traj["start"], rng.choice([-1.0, 1.0], size=flat_values(traj["start"]).size)))
    for t, action in enumerate(traj["actions"]):
        obs, reward, terminated = _bare_step(stepper, action)
        ref = np.concatenate([traj["obs"][t], [traj["reward"][t]]])
        moved = np.concatenate([flat_values(obs), [reward]])
        if terminated != traj["term"][t] or np.any(np.abs(moved - ref) > s.atol + s.rtol * np.abs(ref)):
            return t
    return len(traj["actions"])


def _shadow_runs(stepper: ReferenceStepper, traj: dict):
    """Two runs of the reference itself under float32-sized perturbations: its state rounded to
    float32 after every step, and in the second run also moved by one float32 rounding."""
    for shadow in range(2):
        rng = np.random.default_rng(traj["seed"] + shadow)
        stepper.write_state(traj["start"])
        shadow_obs, shadow_reward, shadow_term = [], [], []
        for action in traj["actions"]:
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


def _episode_statistics(ctx: Context, report: LevelReport):
    """Whole episodes past the predictable horizon: independent episodes of the backend (its own resets)
    and of the reference under the same policies (random actions and each declared policy with
    `statistics`), their return, length and each declared outcome's rate equivalent by TOST."""
    s = ctx.settings
    n = s.statistics_episodes
    report.tolerances["episode statistics"] = (
        f"{n} independent episodes per side and policy (each side's own resets); TOST (Welch, alpha 0.05) of the "
        f"mean of return, length and each outcome's rate, margin {s.margin_sd} pooled sd (floor 1% of the reference "
        f"mean): a correct port passes each with probability ~{_tost_power(s.margin_sd, n):.3f}")
    policies = [("random actions", None)] + [(p.name, p.make) for p in ctx.declarations.policies if p.statistics]
    worst = None
    for index, (name, make) in enumerate(policies):
        seed = s.seed + 300 + 1000 * index
        backend = _backend_episodes(ctx, make, n, seed)
        reference = _reference_episodes(ctx, make, n, seed)
        for statistic, column in ([("return", 0), ("length", 1)]
                                  + [(f"{outcome} rate", 2 + k) for k, outcome in enumerate(ctx.declarations.episode_outcomes)]):
            result = tost(backend[:, column], reference[:, column], margin_sd=s.margin_sd)
            gap = abs(result.mean_a - result.mean_b) / result.margin
            if worst is None or gap > worst["fraction of margin"]:
                worst = {"statistic": f"episode {statistic} under {name}", "backend mean": result.mean_a,
                         "reference mean": result.mean_b, "margin": result.margin, "fraction of margin": gap}
            report.add(f"episode {statistic} under {name} (TOST)", result.equivalent, f"backend {result.describe()}",
                       None if result.equivalent else {
                           "field": f"episode {statistic}", "policy": name,
                           "backend mean/sd/min/max": describe(backend[:, column]),
                           "reference mean/sd/min/max": describe(reference[:, column])})
    report.largest_deviation = {**(report.largest_deviation or {}), "episode statistics": worst}


def _tost_power(margin_sd: float, n: int, alpha: float = 0.05) -> float:
    """Probability that TOST at `margin_sd` pooled sd shows two equal means equivalent from n per side
    (normal approximation): |difference| must fall below the margin less the one-sided critical value."""
    from scipy import stats as scipy_stats

    se = np.sqrt(2.0 / n)
    return float(max(0.0, 2 * scipy_stats.norm.cdf((margin_sd - scipy_stats.norm.ppf(1 - alpha) * se) / se) - 1))


def _episode_row(total: float, length: int, reward: float, terminated: bool, outcomes: dict) -> list:
    return [total, length] + [float(bool(kind(reward, terminated))) for kind in outcomes.values()]


def _backend_episodes(ctx: Context, make, n: int, seed: int) -> np.ndarray:
    """(return, length, outcomes...) of the first episode of each of n backend envs."""
    outcomes = ctx.declarations.episode_outcomes
    venv = ctx.make_vec(n, seed)
    space = ctx.action_space
    space.seed(seed)
    try:
        obs, _ = venv.reset(seed=seed)
        acts = [make(seed + i) for i in range(n)] if make else None
        totals, lengths = np.zeros(n), np.zeros(n, int)
        rows: list = [None] * n
        limit = ctx.max_episode_steps or statistical_horizon(ctx)
        for _ in range(limit):
            actions = np.stack([acts[i](obs[i]) for i in range(n)] if acts else [space.sample() for _ in range(n)])
            obs, reward, terminated, truncated, _ = venv.step(actions)
            for i in range(n):
                if rows[i] is None:
                    totals[i] += reward[i]
                    lengths[i] += 1
                    if terminated[i] or truncated[i]:
                        rows[i] = _episode_row(totals[i], lengths[i], float(reward[i]), bool(terminated[i]), outcomes)
            if all(row is not None for row in rows):
                break
    finally:
        venv.close()
    return np.array([row if row is not None else _episode_row(totals[i], lengths[i], 0.0, False, outcomes)
                     for i, row in enumerate(rows)])


def _reference_episodes(ctx: Context, make, n: int, seed: int) -> np.ndarray:
    """The same on the reference, each episode in a new env: a physics env may keep its engine's world
    across resets (gymnasium's Box2D envs do: proxy ids and contact order then depend on every
    episode before), where a backend's reset starts a fresh one."""
    outcomes = ctx.declarations.episode_outcomes
    space = ctx.action_space
    space.seed(seed + 1)
    rows = []
    limit = ctx.max_episode_steps or statistical_horizon(ctx)
    for episode in range(n):
        env = gym.make(ctx.env_id)
        obs, _ = env.reset(seed=40_000 + seed + episode)
        act = make(seed + n + episode) if make else (lambda _obs: space.sample())
        total = 0.0
        for length in range(1, limit + 1):
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += reward
            if terminated or truncated:
                break
        env.close()
        rows.append(_episode_row(total, length, float(reward), bool(terminated), outcomes))
    return np.array(rows)

