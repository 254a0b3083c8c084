"""L1 properties: spaces, the protocol's shapes and dtypes, observation bounds, finite rewards, flag
dtypes, the reset distribution per observation component, determinism under a key or a seed."""
from __future__ import annotations

import gymnasium as gym
import jax
import numpy as np

from envs_fast.verify.probes import ReferenceStepper, field_names, flat_values
from envs_fast.protocol import SIGNATURE_PROBLEM
from envs_fast.verify.report import LevelReport
from envs_fast.verify.stats import same_distribution_p
from envs_fast.verify.context import Context
from envs_fast.verify.formatting import describe, summary
from envs_fast.verify.shared import batched_in_space, failing_on_crash, flatten_batch, obs_names, seeds


def run(ctx: Context) -> LevelReport:
    report = LevelReport(1)
    with failing_on_crash(report):
        _check(ctx, report)
    return report


def _check(ctx: Context, report: LevelReport):
    s = ctx.settings
    n = s.reset_samples if ctx.backend else min(s.reset_samples, s.vector_reset_samples)
    venv = ctx.make_vec(n, s.seed)
    try:
        same_spaces = (venv.single_observation_space == ctx.obs_space
                       and venv.single_action_space == ctx.action_space)
        report.add("spaces", same_spaces,
                   f"observation {summary(ctx.obs_space)} and action {summary(ctx.action_space)} equal the reference's"
                   if same_spaces else
                   f"observation {venv.single_observation_space} / action {venv.single_action_space} "
                   f"vs reference {ctx.obs_space} / {ctx.action_space}")
        if ctx.backend:
            _protocol(ctx, report)
        obs, _ = venv.reset(seed=s.seed)
        backend_resets = flatten_batch(ctx.obs_space, obs)
        _rollout_properties(ctx, report, venv, obs)
    finally:
        venv.close()
    reference_resets = np.stack([gym.spaces.flatten(ctx.obs_space, ctx.reference.reset(seed=10_000 + i)[0])
                                 for i in range(n)]).astype(np.float64)
    _reset_distribution(ctx, report, backend_resets, reference_resets)
    if ctx.backend and ctx.backend.syncs_state:
        _reset_state_distribution(ctx, report)
    _determinism(ctx, report)


def _protocol(ctx: Context, report: LevelReport):
    try:
        problems = ctx.backend.protocol_problems(ctx.obs_space, ctx.action_space)
    except Exception as exc:
        report.add("reset/step run", False, f"{type(exc).__name__}: {exc}")
        return
    signature = [p[len(SIGNATURE_PROBLEM):] for p in problems if p.startswith(SIGNATURE_PROBLEM)]
    if signature:
        report.add("step signature", False, "; ".join(signature))
        return
    report.add("shapes and dtypes", not problems,
               "; ".join(problems) or "observation, reward (float scalar) and terminated (bool scalar) match the protocol and the reference spaces")


def _rollout_properties(ctx: Context, report: LevelReport, venv, obs, steps: int = 200):
    outside, bad_reward, bad_flags = [], 0, []
    inside = batched_in_space(ctx.obs_space, obs)
    if not inside.all():
        outside.append(("reset", int(np.argmin(inside)), jax.tree_util.tree_map(lambda x: x[int(np.argmin(inside))], obs)))
    venv.action_space.seed(ctx.settings.seed)
    episodes_ended = 0
    limit = min(steps, 64 if venv.num_envs > 256 else steps)
    for t in range(limit):
        obs, reward, terminated, truncated, _ = venv.step(venv.action_space.sample())
        inside = batched_in_space(ctx.obs_space, obs)
        if not inside.all() and len(outside) < 3:
            i = int(np.argmin(inside))
            outside.append((f"step {t}", i, jax.tree_util.tree_map(lambda x: x[i], obs)))
        bad_reward += int((~np.isfinite(np.asarray(reward, dtype=np.float64))).sum())
        for name, flag in (("terminated", terminated), ("truncated", truncated)):
            flag = np.asarray(flag)
            if flag.dtype != bool or flag.shape != (venv.num_envs,):
                bad_flags.append(f"{name} dtype {flag.dtype} shape {flag.shape}")
        episodes_ended += int(np.sum(terminated | truncated))
    report.add("observation bounds", not outside,
               f"{limit} random-action steps x {venv.num_envs} envs inside the reference observation space"
               if not outside else f"{len(outside)} observations outside {ctx.obs_space}",
               None if not outside else {"where": outside[0][0], "env": outside[0][1],
                                         "observation": np.asarray(outside[0][2]).tolist()})
    report.add("rewards finite", bad_reward == 0, f"{bad_reward} non-finite rewards")
    report.add("flag dtypes", not bad_flags, "; ".join(sorted(set(bad_flags))) or
               f"terminated/truncated are bool arrays of shape ({venv.num_envs},); {episodes_ended} episodes ended")


def component_p(backend: np.ndarray, reference: np.ndarray, rtol: float, atol: float) -> tuple[float, str]:
    """p-value that one component's samples on the two sides come from one distribution, and the test.
    A component that is one value up to the float tolerance on both sides (every sample within
    atol + rtol * |median| of the reference's median: what L2 calls equal) is that value on both:
    p 1, "constant within tolerance". Without this a KS test tells apart two float roundings of one
    constant (a JAX port's reset lidar reading, 0.5341 +- 4e-7 on both sides); a constant that
    differs beyond it is left to the test. NaN is a value of its own (a field the
    reference leaves unset)."""
    backend, reference = np.asarray(backend, np.float64), np.asarray(reference, np.float64)
    if np.isnan(backend).any() or np.isnan(reference).any():
        return same_distribution_p(np.nan_to_num(backend, nan=-1e300), np.nan_to_num(reference, nan=-1e300))
    centre = np.median(reference)
    allowed = atol + rtol * abs(centre)
    if np.all(np.abs(reference - centre) <= allowed) and np.all(np.abs(backend - centre) <= allowed):
        return 1.0, "constant within tolerance"
    return same_distribution_p(backend, reference)


def _reset_distribution(ctx: Context, report: LevelReport, backend: np.ndarray, reference: np.ndarray):
    names = [f"obs{n}" for n in obs_names(ctx.obs_space)]
    if backend.shape[1] != reference.shape[1]:
        report.add("reset distribution", False, f"flattened observation sizes differ: {backend.shape[1]} vs {reference.shape[1]}")
        return
    threshold = 1e-3 / max(1, backend.shape[1])
    worst = (1.0, "", "")
    for column in range(backend.shape[1]):
        p, test = component_p(backend[:, column], reference[:, column], ctx.settings.rtol, ctx.settings.atol)
        if p < worst[0]:
            worst = (p, names[column] if column < len(names) else f"[{column}]", test)
    ok = worst[0] >= threshold
    detail = (f"{len(backend)} backend vs {len(reference)} reference resets, per observation component, "
              f"p >= {threshold:.2g} (0.001 Bonferroni-corrected); lowest p={worst[0]:.3g}"
              + (f" at {worst[1]} ({worst[2]})" if worst[1] else ""))
    failure = None
    if not ok:
        column = names.index(worst[1]) if worst[1] in names else 0
        failure = {"field": worst[1], "test": worst[2],
                   "backend mean/sd/min/max": describe(backend[:, column]),
                   "reference mean/sd/min/max": describe(reference[:, column])}
    report.add("reset distribution", ok, detail, failure)


def _reset_state_distribution(ctx: Context, report: LevelReport):
    """The reset state's distribution per field, where the backend draws it from its own random
    stream (a Rust port cannot repeat numpy's): what the observation does not show, e.g. a physics
    scene's terrain. Fields the sync cannot write or read (the reference derives them) are left out."""
    s = ctx.settings
    n = s.state_reset_samples
    _, batch = ctx.backend.reset(seeds(s.seed + 2, n))
    leaves = [np.asarray(leaf, dtype=np.float64).reshape(n, -1) for leaf in jax.tree_util.tree_leaves(batch)]
    backend = np.concatenate(leaves, axis=1)
    stepper = ReferenceStepper(ctx.env_id, ctx.backend)
    try:
        reference = np.stack([flat_values(stepper.reset(30_000 + i)) for i in range(n)])
        names = field_names(stepper.read_state())
    finally:
        stepper.close()
    if backend.shape != reference.shape:
        report.add("reset state distribution", False, f"state sizes differ: {backend.shape[1]} vs {reference.shape[1]}")
        return
    derived = set(getattr(ctx.backend, "read_only_fields", ()) or ()) | set(getattr(ctx.backend, "unreadable_fields", ()) or ())
    columns = [j for j, name in enumerate(names) if name.lstrip(".") not in derived]
    threshold = 1e-3 / max(1, len(columns))
    worst = (1.0, None, "")
    for j in columns:
        both = np.concatenate([backend[:, j], reference[:, j]])
        if np.all(np.isnan(both)):
            continue
        p, test = component_p(backend[:, j], reference[:, j], s.rtol, s.atol)
        if p < worst[0]:
            worst = (p, j, test)
    ok = worst[0] >= threshold
    where = f" at state{names[worst[1]]} ({worst[2]})" if worst[1] is not None else ""
    failure = None if ok else {"field": f"state{names[worst[1]]}", "test": worst[2],
                               "backend mean/sd/min/max": describe(backend[:, worst[1]]),
                               "reference mean/sd/min/max": describe(reference[:, worst[1]])}
    report.add("reset state distribution", ok,
               f"{n} backend vs {n} reference reset states, per state field the sync writes ({len(columns)} of "
               f"{len(names)}), p >= {threshold:.2g} (0.001 Bonferroni-corrected); lowest p={worst[0]:.3g}{where}", failure)


def _determinism(ctx: Context, report: LevelReport):
    s = ctx.settings
    if ctx.backend:
        batch = seeds(s.seed + 1, 64)
        obs_a, state_a = ctx.backend.reset(batch)
        obs_b, state_b = ctx.backend.reset(batch)
        actions = np.stack([ctx.action_space.sample() for _ in range(64)])
        out_a = ctx.backend.step(batch, state_a, actions)
        out_b = ctx.backend.step(batch, state_b, actions)
        same = all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True) for x, y in
                   zip(jax.tree_util.tree_leaves((obs_a, out_a)), jax.tree_util.tree_leaves((obs_b, out_b))))
        report.add("determinism under a key", same, "reset(key) and step(key, state, action) repeat exactly for the same key"
                   if same else "the same key gave different results")
        return
    runs = []
    for _ in range(2):
        venv = ctx.make_vec(4, s.seed)
        venv.action_space.seed(s.seed)
        obs, _ = venv.reset(seed=s.seed)
        trace = [flatten_batch(ctx.obs_space, obs)]
        for _t in range(30):
            obs, reward, *_ = venv.step(venv.action_space.sample())
            trace.append(flatten_batch(ctx.obs_space, obs))
            trace.append(np.asarray(reward, dtype=np.float64)[:, None])
        venv.close()
        runs.append(trace)
    same = all(np.array_equal(a, b) for a, b in zip(*runs))
    report.add("determinism under a seed", same, "two instances with the same seed and actions gave identical trajectories"
               if same else "two instances with the same seed and actions diverged")
