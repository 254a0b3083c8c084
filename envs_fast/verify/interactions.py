"""L2 interactions (backends with state sync): one backend step from a state synced from the
reference, compared field by field with the reference's step, over states from real rollouts and
states found near every termination and clipping boundary; for a stochastic reference, the
next-step distributions from the same states. Not applicable without state sync (third-party
backends only: see context.STATISTICAL_ONLY)."""
from __future__ import annotations

import warnings

import gymnasium as gym
import jax
import numpy as np

from envs_fast.verify.probes import (ReferenceStepper, Sample, collect_boundary_samples, collect_rollout_samples,
                              field_names, flat_values, numpy_tree, probe_actions)
from envs_fast.protocol import dtype_kind, space_leaves
from envs_fast.verify.report import LevelReport
from envs_fast.verify.stats import same_distribution_p
from envs_fast.verify.context import STATISTICAL_ONLY, Context
from envs_fast.verify.formatting import format_action, format_state, histogram, num
from envs_fast.verify.shared import failing_on_crash, seeds, stack, tolerance_text, twin_tolerances


def run(ctx: Context) -> LevelReport:
    report = LevelReport(2)
    if not (ctx.backend and ctx.backend.syncs_state):
        report.status = "not applicable"
        report.note = STATISTICAL_ONLY
        return report
    with failing_on_crash(report):
        _check(ctx, report)
    return report


def _check(ctx: Context, report: LevelReport):
    s = ctx.settings
    report.tolerances = {"observation, reward and state floats": tolerance_text(s) + f" + {s.sensitivity_factor:g} * sensitivity",
                         "terminated, integer and bool fields": "exact, unless the reference itself flips under a float32 rounding of the state",
                         "sensitivity": "how far the reference's outputs move when every state component moves by 8 float32 roundings (2**-20 relative)"}
    sync = ctx.sync
    if sync.broken and sync.problem is None:
        report.add("reference rollouts", False, "no state could be synced: state_to_reference/"
                   f"state_from_reference or the reference step failed: {sync.unsynced}")
        return
    if sync.problem:
        report.add("state sync round trip", False, sync.problem["detail"], sync.problem)
        return
    read_only = getattr(ctx.backend, "read_only_fields", ()) or ()
    report.add("state sync round trip", True, "states written with state_to_reference read back "
               "unchanged with state_from_reference" + (
                   f" (except {len(read_only)} fields the sync declares read-only: the reference derives "
                   "them, and both sides step from what it holds)" if read_only else ""))
    stepper = ReferenceStepper(ctx.env_id, ctx.backend)
    rng = np.random.default_rng(s.seed)
    try:
        horizon = min(ctx.max_episode_steps or s.rollout_steps, s.rollout_steps)
        policies = [p for p in ctx.declarations.policies if p.l2_episodes > 0]
        # the declared policies' states come out of the same budget, so L2 takes as long with them
        planned = sum(p.l2_episodes * _policy_steps(s, p, horizon) for p in policies)
        rollout = collect_rollout_samples(stepper, ctx.action_space, horizon, max(s.l2_target - planned, 0), s.seed)
        if not rollout:
            report.add("reference rollouts", False, "no state could be synced: state_to_reference/"
                       f"state_from_reference or the reference step failed: {stepper.last_error}")
            return
        under_policies = {p.name: _policy_samples(stepper, p, _policy_steps(s, p, horizon), s.seed + 500 + 10 * k)
                          for k, p in enumerate(policies)}
        if sync.stochastic:
            report.note = "the reference's transitions are stochastic: next-step distributions are compared"
            report.tolerances = {"next-step distribution": "per observation component, reward and terminated: "
                                 "chi-square (few discrete values) or Kolmogorov-Smirnov, p >= 0.001 Bonferroni-corrected"}
            _distributional(ctx, report, stepper, rollout, rng)
            return
        states = [sample.state for sample in rollout]
        values = np.stack([flat_values(st) for st in states])
        spreads, limits = np.std(values, axis=0), np.max(np.abs(values), axis=0)
        picks = sorted(set(int(i) for i in np.linspace(0, len(states) - 1, 4)))
        boundary = collect_boundary_samples(stepper, [states[i] for i in picks], spreads, limits,
                                            probe_actions(ctx.action_space, rng))
    finally:
        stepper.close()
    boundary = _within_capacity(ctx, report, rollout, under_policies, boundary)
    departures = []  # the float32 backend against its float64 twin, per check (with a twin)
    _compare_samples(ctx, report, "step from rollout states", rollout, departures)
    for name, samples in under_policies.items():
        _compare_samples(ctx, report, f"step from states under the {name}", samples, departures)
    _compare_samples(ctx, report, "step from boundary states", boundary, departures)
    if ctx.twin:
        report.tolerances.update(twin_tolerances(departures))
    _coverage(ctx, report, rollout, under_policies, boundary)  # after: a differing step is the failure to show first


def _policy_steps(s, policy, horizon: int) -> int:
    return min(policy.l2_steps or horizon, s.l2_policy_steps or horizon)


def _policy_samples(stepper: ReferenceStepper, policy, steps: int, seed: int) -> list[Sample]:
    """Samples from the states of reference episodes of at most `steps` steps under a declared policy
    (closed loop), past the episode's end if the policy says so. The episode runs on its own, unwritten,
    so its states are those the env really visits (a physics engine's sleep timers, solver warm starts
    and contact events included, which a write resets); each is then synced and stepped as usual."""
    samples = []
    free = gym.make(stepper.env.spec.id)
    try:
        for episode in range(policy.l2_episodes):
            obs, _ = free.reset(seed=seed + episode)
            act = policy.make(seed + episode)
            for t in range(steps):
                action = act(obs)
                state = numpy_tree(stepper.backend.state_from_reference(free))
                sample = stepper.sample(state, action, f"{policy.name}, episode seed {seed + episode}, step {t}")
                if sample is not None:
                    samples.append(sample)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    obs, _reward, terminated, _truncated, _info = free.unwrapped.step(action)
                if sample is None or (terminated and not policy.past_termination):
                    break
    finally:
        free.close()
    return samples


def _within_capacity(ctx: Context, report: LevelReport, rollout: list[Sample], under_policies: dict,
                     boundary: list[Sample]) -> list[Sample]:
    """The boundary samples within the port's declared CAPACITY (all of them without one). The check fails
    when a state of the reference's own episodes, or its step, goes beyond it: there the port would be
    wrong in training. Boundary states beyond it are written states no episode reaches; they are counted
    and reported, not compared."""
    capacity = ctx.declarations.capacity
    if not capacity:
        return boundary

    def peaks(sample: Sample) -> dict:  # each declared count, the larger of before and after the step
        return {name: max(float(count(sample.state)), float(count(sample.next_state)))
                for name, (count, _limit) in capacity.items()}

    def beyond(peak: dict) -> dict:
        return {name: value for name, value in peak.items() if value > capacity[name][1]}

    declared = ", ".join(f"{name} <= {limit:g}" for name, (_count, limit) in capacity.items())
    episodes = rollout + [sample for samples in under_policies.values() for sample in samples]
    episode_peaks = [peaks(smp) for smp in episodes]
    most = {name: max((peak[name] for peak in episode_peaks), default=0.0) for name in capacity}
    over = [(smp, beyond(peak)) for smp, peak in zip(episodes, episode_peaks) if beyond(peak)]
    kept, dropped = [], {}
    for sample in boundary:
        counts = beyond(peaks(sample))
        if counts:
            for name, value in counts.items():
                dropped[name] = max(dropped.get(name, 0.0), value)
        else:
            kept.append(sample)
    reached = "; ".join(f"the episodes' states reach {name} {value:g}" for name, value in most.items())
    skipped = (f"{len(boundary) - len(kept)} of {len(boundary)} boundary states go beyond it ("
               + ", ".join(f"{name} up to {value:g}" for name, value in dropped.items())
               + ") and are not compared: written states no episode reaches") if dropped else \
        "every boundary state is within it"
    if over:
        first, counts = over[0]
        report.add(f"within the port's declared capacity ({declared})", False,
                   f"{len(over)} of {len(episodes)} states of the reference's own episodes go beyond it, first "
                   f"{first.origin} (" + ", ".join(f"{name} {value:g}" for name, value in counts.items())
                   + "): the port cannot represent what training meets")
    else:
        report.add(f"within the port's declared capacity ({declared})", True, f"{reached}; {skipped}")
    return kept


def _coverage(ctx: Context, report: LevelReport, rollout: list[Sample], under_policies: dict, boundary: list[Sample]):
    """How many states of each source and of each declared kind L2 steps from; a declared kind (or
    policy) that yielded none fails: the level would otherwise pass without having looked there."""
    if not (ctx.declarations.state_categories or under_policies):
        return
    real = rollout + [smp for samples in under_policies.values() for smp in samples]
    counts = {name: sum(bool(kind(flat_values(smp.state), flat_values(smp.next_state))) for smp in real)
              for name, kind in ctx.declarations.state_categories.items()}
    random = sum(smp.origin.startswith("random actions") for smp in rollout)
    sources = {"random actions": random, "scripted actions": len(rollout) - random, **{f"the {name}": len(samples)
               for name, samples in under_policies.items()}, "boundary search": len(boundary)}
    missing = [name for name, count in {**counts, **sources}.items() if count == 0 and name != "boundary search"]
    report.add("state coverage", not missing,
               "states from " + ", ".join(f"{name}: {count}" for name, count in sources.items())
               + "; of which (rollouts and policies) " + ", ".join(f"{name}: {count}" for name, count in counts.items())
               + (f"; NONE of: {', '.join(missing)}" if missing else ""))


def _run_backend(ctx: Context, samples: list[Sample], chunk: int = 1024, backend=None):
    """The backend's step (or `backend`'s) on every sample's state and action, in fixed-size chunks
    (one batch shape, so a compiled backend compiles once)."""
    backend = backend or ctx.backend
    outputs = []
    for start in range(0, len(samples), chunk):
        part = samples[start:start + chunk]
        padded = part + [part[0]] * (chunk - len(part)) if len(samples) > chunk else part
        states = stack([p.state for p in padded])
        actions = np.stack([np.asarray(p.action) for p in padded])
        out = backend.step(seeds(ctx.settings.seed + start, len(padded)), states, actions)
        outputs.append(jax.tree_util.tree_map(lambda x: np.asarray(x)[: len(part)], out))
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *outputs)


def _columns(ctx: Context, samples: list[Sample], out):
    """(name, reference matrix, backend matrix, exact?) for every compared field."""
    n = len(samples)
    b_obs, b_state, b_reward, b_term = out
    columns = []
    obs_names = ["obs" + name for name in field_names(samples[0].obs)]
    ref_obs = np.stack([flat_values(smp.obs) for smp in samples])
    back_obs = np.concatenate([np.asarray(leaf, dtype=np.float64).reshape(n, -1) for leaf in jax.tree_util.tree_leaves(b_obs)], axis=1)
    obs_exact = [dtype_kind(space.dtype) != "float" for space in space_leaves(ctx.obs_space)
                 for _ in range(int(np.prod(getattr(space, "shape", ()) or (1,))))]
    if back_obs.shape != ref_obs.shape:
        raise ValueError(f"observation has {back_obs.shape[1]} values, the reference's has {ref_obs.shape[1]}")
    for j, name in enumerate(obs_names):
        columns.append((name, ref_obs[:, j], back_obs[:, j], obs_exact[j] if j < len(obs_exact) else False))
    columns.append(("reward", np.array([smp.reward for smp in samples]), np.asarray(b_reward, dtype=np.float64).reshape(n), False))
    columns.append(("terminated", np.array([smp.terminated for smp in samples], dtype=np.float64),
                    np.asarray(b_term, dtype=np.float64).reshape(n), True))
    state_names = ["state" + name for name in field_names(samples[0].next_state)]
    ref_state = np.stack([flat_values(smp.next_state) for smp in samples])
    back_state = np.concatenate([np.asarray(leaf, dtype=np.float64).reshape(n, -1) for leaf in jax.tree_util.tree_leaves(b_state)], axis=1)
    state_exact = [np.asarray(leaf).dtype.kind in "biu" for leaf in jax.tree_util.tree_leaves(samples[0].next_state)
                   for _ in range(np.size(leaf))]
    if back_state.shape == ref_state.shape:
        for j, name in enumerate(state_names):
            columns.append((name, ref_state[:, j], back_state[:, j], state_exact[j]))
    return columns


def _compare_samples(ctx: Context, report: LevelReport, check: str, samples: list[Sample], departures: list | None = None):
    """Steps `ctx.compared` (the backend, or its float64 twin) from every sample and holds it to the
    tolerance; with a twin, the float32 backend's departure from it joins `departures`."""
    if not samples:
        report.add(check, True, "no states of this kind (the reference rejected every probe)")
        return
    try:
        out = _run_backend(ctx, samples, backend=ctx.compared)
        columns = _columns(ctx, samples, out)
        if ctx.twin and departures is not None:
            own = _columns(ctx, samples, _run_backend(ctx, samples))
            departures.append(_departure(ctx, check, samples, columns, own))
    except Exception as exc:
        report.add(check, False, f"the backend failed on these states: {type(exc).__name__}: {exc}")
        return
    s = ctx.settings
    ratios = []
    sensitivity = np.stack([smp.sensitivity for smp in samples])
    # state fields the reference has but does not expose (a sync reads them as a constant): never compared
    unreadable = {"state." + name for name in (getattr(ctx.backend, "unreadable_fields", ()) or ())}
    for column, (name, ref, back, exact) in enumerate(columns):
        if name in unreadable:
            ratios.append(np.zeros(len(samples)))
            continue
        diff = np.abs(back - ref)
        spread = s.sensitivity_factor * sensitivity[:, column] if column < sensitivity.shape[1] else 0.0
        allowed = (np.zeros_like(ref) if exact else s.atol + s.rtol * np.abs(ref)) + spread
        ratio = np.where(diff <= allowed, diff / np.maximum(allowed, 1e-300), np.inf)
        ratio = np.where(np.isnan(back) & ~np.isnan(ref), np.inf, ratio)
        ratios.append(ratio)
        relative = diff / np.maximum(allowed, 1e-300)
        worst = int(np.nanargmax(relative)) if len(diff) and not exact else 0
        if not exact and (report.largest_deviation is None
                          or relative[worst] > report.largest_deviation["fraction of allowed"]):
            report.largest_deviation = {"field": name, "abs": float(diff[worst]), "allowed": float(allowed[worst]),
                                        "fraction of allowed": float(relative[worst]),
                                        "reference": float(ref[worst]), "backend": float(back[worst]),
                                        "origin": samples[worst].origin}
    failing = np.any(np.stack(ratios) > 1, axis=0)
    count = int(failing.sum())
    detail = f"{len(samples) - count} of {len(samples)} steps agree"
    if unreadable:
        detail += f" ({len(unreadable)} state fields the reference does not expose are not compared)"
    failure = None
    if count:
        i = int(np.argmax(failing))
        fields = [{"field": name, "reference": num(ref[i]), "backend": num(back[i]),
                   "diff": f"{abs(back[i] - ref[i]):.3g}",
                   "allowed": f"{(0 if exact else s.atol + s.rtol * abs(ref[i])) + s.sensitivity_factor * sensitivity[i, c]:.3g}"}
                  for c, ((name, ref, back, exact), ratio) in enumerate(zip(columns, ratios)) if ratio[i] > 1]
        failure = {"origin": samples[i].origin, "state": format_state(samples[i].state),
                   "action": format_action(samples[i].action), "fields": fields,
                   "failing steps": count}
        detail += f"; {count} differ, first in field(s) {', '.join(f['field'] for f in fields)}"
    report.add(check, count == 0, detail, failure)


def _departure(ctx: Context, check: str, samples: list[Sample], twin_columns, own_columns) -> dict:
    """How far the float32 backend's steps are from its float64 twin's, in units of the strict
    allowance (atol + rtol * |twin|): the largest, where, and how many steps go beyond 1."""
    s = ctx.settings
    worst = {"check": check, "fraction of allowed": 0.0, "steps": len(samples), "beyond": 0}
    beyond = np.zeros(len(samples), bool)
    unreadable = {"state." + name for name in (getattr(ctx.backend, "unreadable_fields", ()) or ())}
    for (name, _ref, twin, exact), (_name, _same_ref, own, _exact) in zip(twin_columns, own_columns):
        if name in unreadable:
            continue
        allowed = np.full(len(samples), 0.5) if exact else s.atol + s.rtol * np.abs(twin)
        relative = np.abs(own - twin) / allowed
        relative = np.where(np.isnan(relative), np.inf, relative)
        beyond |= relative > 1
        i = int(np.argmax(relative))
        if relative[i] > worst["fraction of allowed"]:
            worst.update({"fraction of allowed": float(relative[i]), "field": name, "origin": samples[i].origin})
    worst["beyond"] = int(beyond.sum())
    return worst


def _distributional(ctx: Context, report: LevelReport, stepper: ReferenceStepper, rollout: list[Sample],
                    rng: np.random.Generator, pairs: int = 30, draws: int = 64):
    picks = rng.choice(len(rollout), size=min(pairs, len(rollout)), replace=False)
    worst = (1.0, None, None, None, None)
    for index in picks:
        sample = rollout[int(index)]
        reference = []
        for d in range(draws):
            stepper.write_state(sample.state)
            stepper.unwrapped.np_random = np.random.default_rng(10_000 + d)
            obs, reward, terminated, _ = stepper.step(sample.action)
            reference.append(np.concatenate([flat_values(obs), [reward, float(terminated)]]))
        states = stack([sample.state] * draws)  # the same state, a different seed per draw
        actions = np.stack([np.asarray(sample.action)] * draws)
        obs, _, reward, terminated = ctx.compared.step(seeds(int(index) * draws, draws), states, actions)
        backend = np.concatenate([np.asarray(leaf, dtype=np.float64).reshape(draws, -1) for leaf in jax.tree_util.tree_leaves(obs)]
                                 + [np.asarray(reward, dtype=np.float64).reshape(draws, 1),
                                    np.asarray(terminated, dtype=np.float64).reshape(draws, 1)], axis=1)
        reference = np.stack(reference)
        if backend.shape != reference.shape:
            report.add("next-step distribution", False, f"output sizes differ: {backend.shape} vs {reference.shape}")
            return
        for column in range(reference.shape[1]):
            p, test = same_distribution_p(backend[:, column], reference[:, column])
            if p < worst[0]:
                worst = (p, sample, column, histogram(backend[:, column]), histogram(reference[:, column]))
    threshold = 1e-3 / (len(picks) * (flat_values(rollout[0].obs).size + 2))
    ok = worst[0] >= threshold
    failure = None
    if not ok:
        sample, column = worst[1], worst[2]
        names = ["obs" + n for n in field_names(sample.obs)] + ["reward", "terminated"]
        failure = {"origin": sample.origin, "state": format_state(sample.state), "action": format_action(sample.action),
                   "field": names[column] if column < len(names) else column,
                   "backend outcomes": worst[3], "reference outcomes": worst[4]}
    report.add("next-step distribution", ok,
               f"{len(picks)} states x {draws} draws per side, lowest p={worst[0]:.3g} (threshold {threshold:.2g})", failure)
