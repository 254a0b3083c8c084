"""Hierarchical verification of a fast backend against its gymnasium reference.

    python -m envs_fast.verify --env ENV_ID --backend SPEC [--levels 1,2,3,4] [--json FILE]

SPEC: a translation file path, "jax"/"translation" (envs_fast/<slug>.py), "envpool", "gymnax" or
"reference". Exit 0 when every requested level passes, 1 when one fails, 2 for bad input.

L1 properties (spaces, dtypes, shapes, bounds, reset distribution, determinism under a key/seed);
L2 interactions (one step from a synced state, compared field by field, over thousands of states
from real rollouts plus states found near every termination and clipping boundary);
L3 rollouts (whole action sequences from a synced start; without state sync, or for stochastic
envs, return distributions under a fixed policy compared by TOST);
L4 transfer (a linear policy trained by the cross-entropy method on the backend scores
equivalently on the reference, by TOST).
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from envs_fast import cache
from envs_fast.backend import load_functional
from envs_fast.protocol import BackendError, FunctionalBackend, check_env_id, resolve_spec
from envs_fast.probes import (ReferenceStepper, Sample, collect_boundary_samples, collect_rollout_samples,
                              field_names, flat_values, perturb_float32, probe_actions, scripted_plans)
from envs_fast.report import LevelReport, Report
from envs_fast.stats import same_distribution_p, tost


@dataclass
class Settings:
    """How hard each level looks. Defaults suit the CLI; tests shrink the statistical ones."""
    seed: int = 0
    rtol: float = 1e-4  # float fields: |backend - reference| <= atol + rtol * |reference|
    atol: float = 1e-5
    reset_samples: int = 1000  # L1 resets per side (vector backends: min(this, vector_reset_samples))
    vector_reset_samples: int = 300
    l2_target: int = 3000  # L2 states from rollouts (boundary probes come on top)
    rollout_steps: int = 300  # longest L2 episode / L3 trajectory
    l3_trajectories: int = 24
    sensitivity_factor: float = 125.0  # L2: allowance per unit of the reference's float32-rounding sensitivity
    chaos_factor: float = 100.0  # L3: allowance per unit of float32-rounding divergence of the reference
    episodes: int = 200  # statistical L3/L4 episodes per side
    horizon: int = 200  # statistical L3 return over at most this many steps
    margin_sd: float = 0.5  # TOST margin in pooled standard deviations
    l4_iterations: int = 8
    extra: dict = field(default_factory=dict)


def _tolerance_text(s: Settings) -> str:
    return f"|backend - reference| <= {s.atol:g} + {s.rtol:g} * |reference|"


# ---------------------------------------------------------------- helpers over spaces and outputs

def _space_leaves(space: gym.Space) -> list[gym.Space]:
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for s in space.spaces for leaf in _space_leaves(s)]
    if isinstance(space, gym.spaces.Dict):
        return [leaf for key in sorted(space.spaces) for leaf in _space_leaves(space.spaces[key])]
    return [space]


def _kind(dtype) -> str:
    dtype = np.dtype(dtype)
    return "bool" if dtype == bool else "integer" if np.issubdtype(dtype, np.integer) else \
        "float" if np.issubdtype(dtype, np.floating) else str(dtype)


def _batched_in_space(space: gym.Space, batch) -> np.ndarray:
    """Per-env membership of a batched observation in a single space."""
    if isinstance(space, gym.spaces.Box):
        values = np.asarray(batch, dtype=np.float64).reshape((-1,) + space.shape)
        axes = tuple(range(1, values.ndim))
        return np.all((values >= space.low) & (values <= space.high), axis=axes) & np.all(np.isfinite(values) | ~np.isfinite(space.low), axis=axes)
    from gymnasium.vector.utils import iterate

    return np.array([space.contains(item) for item in iterate(gym.vector.utils.batch_space(space, len(jax.tree_util.tree_leaves(batch)[0])), batch)])


def _format_state(state) -> str:
    names = field_names(state)
    values = flat_values(state)
    return ", ".join(f"{n or 'state'}={v:.9g}" for n, v in zip(names, values))


def _format_action(action) -> str:
    return np.array2string(np.asarray(action), precision=9) if np.ndim(action) else repr(np.asarray(action).item())


def _stack(trees):
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *trees)


def _policy(space_in: gym.Space, space_out: gym.Space, seed: int):
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


def _flatten_batch(space: gym.Space, batch) -> np.ndarray:
    if isinstance(space, gym.spaces.Box):
        return np.asarray(batch, dtype=np.float64).reshape(len(batch), -1)
    from gymnasium.vector.utils import batch_space, iterate

    n = len(jax.tree_util.tree_leaves(batch)[0])
    return np.stack([gym.spaces.flatten(space, item) for item in iterate(batch_space(space, n), batch)]).astype(np.float64)


# ------------------------------------------------------------------------------ the verifier

class Verifier:
    def __init__(self, env_id: str, spec: str, settings: Settings, root=None):
        self.env_id = env_id
        self.spec_env = check_env_id(env_id)
        self.spec = resolve_spec(spec, env_id, root)
        self.settings = settings
        self.root = root
        self.reference = gym.make(env_id)
        self.obs_space = self.reference.observation_space
        self.action_space = self.reference.action_space
        self.max_steps = self.spec_env.max_episode_steps
        self.functional: FunctionalBackend | None = None
        if self.spec not in ("envpool", "reference"):
            self.functional = load_functional(self.spec, env_id, root)
        self.stochastic = False
        self.sync_broken = False
        self.partial: LevelReport | None = None

    def _begin(self, level: int) -> LevelReport:
        """A level's report, kept so that a crash mid-level still reports the checks done so far."""
        self.partial = LevelReport(level)
        return self.partial

    def make_vec(self, num_envs: int, seed: int):
        from envs_fast import make_vec_env

        return make_vec_env(self.spec, self.env_id, num_envs, seed, self.root)

    # ------------------------------------------------------------------ L1
    def level1(self) -> LevelReport:
        report = self._begin(1)
        s = self.settings
        n = s.reset_samples if self.functional else min(s.reset_samples, s.vector_reset_samples)
        venv = self.make_vec(n, s.seed)
        try:
            same_spaces = (venv.single_observation_space == self.obs_space
                           and venv.single_action_space == self.action_space)
            report.add("spaces", same_spaces,
                       f"observation {_summary(self.obs_space)} and action {_summary(self.action_space)} equal the reference's"
                       if same_spaces else
                       f"observation {venv.single_observation_space} / action {venv.single_action_space} "
                       f"vs reference {self.obs_space} / {self.action_space}")
            if self.functional:
                self._functional_shapes(report)
            obs, _ = venv.reset(seed=s.seed)
            backend_resets = _flatten_batch(self.obs_space, obs)
            self._rollout_properties(report, venv, obs)
        finally:
            venv.close()
        reference_resets = np.stack([gym.spaces.flatten(self.obs_space, self.reference.reset(seed=10_000 + i)[0])
                                     for i in range(n)]).astype(np.float64)
        self._reset_distribution(report, backend_resets, reference_resets)
        self._determinism(report)
        return report

    def _functional_shapes(self, report: LevelReport):
        fb = self.functional
        key = jax.random.PRNGKey(self.settings.seed)
        try:
            obs, state = jax.jit(fb.reset)(key)
            action = self.action_space.sample()
            out = jax.jit(fb.step)(key, state, jnp.asarray(action))
        except Exception as exc:
            report.add("reset/step run", False, f"{type(exc).__name__}: {exc}")
            return
        if len(out) != 4:
            report.add("step signature", False, f"step returned {len(out)} values; the protocol is (obs, state, reward, terminated)")
            return
        problems = []
        for name, value in (("reset", obs), ("step", out[0])):
            leaves = jax.tree_util.tree_leaves(value)
            spaces_ = _space_leaves(self.obs_space)
            if len(leaves) != len(spaces_):
                problems.append(f"{name} observation has {len(leaves)} arrays, the space has {len(spaces_)}")
                continue
            for leaf, space in zip(leaves, spaces_):
                shape = getattr(space, "shape", ()) or ()
                if tuple(np.shape(leaf)) != tuple(shape):
                    problems.append(f"{name} observation shape {np.shape(leaf)} != space shape {shape}")
                if _kind(np.asarray(leaf).dtype) != _kind(space.dtype):
                    problems.append(f"{name} observation dtype {np.asarray(leaf).dtype} is not {_kind(space.dtype)} like the space's {space.dtype}")
        reward, terminated = out[2], out[3]
        if np.shape(reward) != () or _kind(np.asarray(reward).dtype) not in ("float", "integer"):
            problems.append(f"reward must be a numeric scalar, got shape {np.shape(reward)} dtype {np.asarray(reward).dtype}")
        if np.shape(terminated) != () or np.asarray(terminated).dtype != bool:
            problems.append(f"terminated must be a bool scalar, got shape {np.shape(terminated)} dtype {np.asarray(terminated).dtype}")
        state_struct = jax.tree_util.tree_structure(state)
        if jax.tree_util.tree_structure(out[1]) != state_struct:
            problems.append("step returned a state with a different structure than reset's")
        report.add("shapes and dtypes", not problems,
                   "; ".join(problems) or "observation, reward (float scalar) and terminated (bool scalar) match the protocol and the reference spaces")

    def _rollout_properties(self, report: LevelReport, venv, obs, steps: int = 200):
        outside, bad_reward, bad_flags = [], 0, []
        inside = _batched_in_space(self.obs_space, obs)
        if not inside.all():
            outside.append(("reset", int(np.argmin(inside)), jax.tree_util.tree_map(lambda x: x[int(np.argmin(inside))], obs)))
        venv.action_space.seed(self.settings.seed)
        episodes_ended = 0
        limit = min(steps, 64 if venv.num_envs > 256 else steps)
        for t in range(limit):
            obs, reward, terminated, truncated, _ = venv.step(venv.action_space.sample())
            inside = _batched_in_space(self.obs_space, obs)
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
                   if not outside else f"{len(outside)} observations outside {self.obs_space}",
                   None if not outside else {"where": outside[0][0], "env": outside[0][1],
                                             "observation": np.asarray(outside[0][2]).tolist()})
        report.add("rewards finite", bad_reward == 0, f"{bad_reward} non-finite rewards")
        report.add("flag dtypes", not bad_flags, "; ".join(sorted(set(bad_flags))) or
                   f"terminated/truncated are bool arrays of shape ({venv.num_envs},); {episodes_ended} episodes ended")

    def _reset_distribution(self, report: LevelReport, backend: np.ndarray, reference: np.ndarray):
        names = [f"obs{n}" for n in self._obs_names()]
        if backend.shape[1] != reference.shape[1]:
            report.add("reset distribution", False, f"flattened observation sizes differ: {backend.shape[1]} vs {reference.shape[1]}")
            return
        threshold = 1e-3 / max(1, backend.shape[1])
        worst = (1.0, "", "")
        for column in range(backend.shape[1]):
            p, test = same_distribution_p(backend[:, column], reference[:, column])
            if test == "constant" and not np.allclose(backend[0, column], reference[0, column], rtol=self.settings.rtol, atol=self.settings.atol):
                p = 0.0
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
                       "backend mean/sd/min/max": _describe(backend[:, column]),
                       "reference mean/sd/min/max": _describe(reference[:, column])}
        report.add("reset distribution", ok, detail, failure)

    def _obs_names(self) -> list[str]:
        sample = self.obs_space.sample()
        if isinstance(self.obs_space, (gym.spaces.Box, gym.spaces.Discrete)):
            return field_names(sample)
        return [f"[{i}]" for i in range(gym.spaces.flatdim(self.obs_space))]

    def _determinism(self, report: LevelReport):
        s = self.settings
        if self.functional:
            fb = self.functional
            keys = jax.random.split(jax.random.PRNGKey(s.seed + 1), 64)
            reset = jax.jit(jax.vmap(fb.reset))
            step = jax.jit(jax.vmap(fb.step))
            obs_a, state_a = reset(keys)
            obs_b, state_b = reset(keys)
            actions = jnp.asarray(np.stack([self.action_space.sample() for _ in range(64)]))
            out_a = step(keys, state_a, actions)
            out_b = step(keys, state_b, actions)
            same = all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True) for x, y in
                       zip(jax.tree_util.tree_leaves((obs_a, out_a)), jax.tree_util.tree_leaves((obs_b, out_b))))
            report.add("determinism under a key", same, "reset(key) and step(key, state, action) repeat exactly for the same key"
                       if same else "the same key gave different results")
            return
        runs = []
        for _ in range(2):
            venv = self.make_vec(4, s.seed)
            rng = np.random.default_rng(s.seed)
            venv.action_space.seed(s.seed)
            obs, _ = venv.reset(seed=s.seed)
            trace = [_flatten_batch(self.obs_space, obs)]
            for _t in range(30):
                obs, reward, *_ = venv.step(venv.action_space.sample())
                trace.append(_flatten_batch(self.obs_space, obs))
                trace.append(np.asarray(reward, dtype=np.float64)[:, None])
            venv.close()
            runs.append(trace)
            del rng
        same = all(np.array_equal(a, b) for a, b in zip(*runs))
        report.add("determinism under a seed", same, "two instances with the same seed and actions gave identical trajectories"
                   if same else "two instances with the same seed and actions diverged")

    # ------------------------------------------------------------------ L2
    def level2(self) -> LevelReport:
        report = self._begin(2)
        if not (self.functional and self.functional.syncs_state):
            report.status = "not applicable"
            report.note = "this backend cannot sync state with the reference; L3 compares it statistically"
            return report
        s = self.settings
        report.tolerances = {"observation, reward and state floats": _tolerance_text(s) + f" + {s.sensitivity_factor:g} * sensitivity",
                             "terminated, integer and bool fields": "exact, unless the reference itself flips under a float32 rounding of the state",
                             "sensitivity": "how far the reference's outputs move when every state component moves by 8 float32 roundings (2**-20 relative)"}
        stepper = ReferenceStepper(self.env_id, self.functional)
        rng = np.random.default_rng(s.seed)
        try:
            horizon = min(self.max_steps or s.rollout_steps, s.rollout_steps)
            rollout = collect_rollout_samples(stepper, self.action_space, horizon, s.l2_target, s.seed)
            if not rollout:
                self.sync_broken = True
                report.add("reference rollouts", False, "no state could be synced: state_to_reference/"
                           f"state_from_reference or the reference step failed: {stepper.last_error}")
                return report
            sync_problem = self._sync_problem(stepper, rollout)
            if sync_problem:
                self.sync_broken = True
                report.add("state sync round trip", False, sync_problem["detail"], sync_problem)
                return report
            report.add("state sync round trip", True, "states written with state_to_reference read back "
                       "unchanged with state_from_reference")
            self.stochastic = self._detect_stochastic(stepper, rollout[: 40])
            if self.stochastic:
                report.note = "the reference's transitions are stochastic: next-step distributions are compared"
                report.tolerances = {"next-step distribution": "per observation component, reward and terminated: "
                                     "chi-square (few discrete values) or Kolmogorov-Smirnov, p >= 0.001 Bonferroni-corrected"}
                self._level2_distributional(report, stepper, rollout, rng)
                return report
            states = [sample.state for sample in rollout]
            values = np.stack([flat_values(st) for st in states])
            spreads, limits = np.std(values, axis=0), np.max(np.abs(values), axis=0)
            picks = sorted(set(int(i) for i in np.linspace(0, len(states) - 1, 4)))
            boundary = collect_boundary_samples(stepper, [states[i] for i in picks], spreads, limits,
                                                probe_actions(self.action_space, rng))
        finally:
            stepper.close()
        self._compare_samples(report, "step from rollout states", rollout)
        self._compare_samples(report, "step from boundary states", boundary)
        return report

    def _sync_problem(self, stepper: ReferenceStepper, samples: list[Sample]) -> dict | None:
        """Whether state_to_reference really writes what state_from_reference reads: states from
        different moments written in turn must read back as written (up to float32 rounding)."""
        picks = [samples[i].next_state for i in sorted(set(np.linspace(0, len(samples) - 1, 6).astype(int)))]
        for state in picks + picks[::-1]:
            try:
                back = stepper.write_state(state)
            except Exception as exc:
                return {"detail": f"state_to_reference/state_from_reference raised {type(exc).__name__}: {exc}"}
            want, got = flat_values(state), flat_values(back)
            if want.shape != got.shape or not np.allclose(got, want, rtol=1e-6, atol=1e-7):
                return {"detail": "a state written with state_to_reference does not read back with state_from_reference",
                        "written": _format_state(state), "read back": _format_state(back)}
        return None

    def _detect_stochastic(self, stepper: ReferenceStepper, samples: list[Sample]) -> bool:
        for sample in samples:
            for seed in range(3):
                stepper.write_state(sample.state)
                stepper.unwrapped.np_random = np.random.default_rng(1234 + seed)
                obs, reward, terminated, next_state = stepper.step(sample.action)
                if (not np.array_equal(flat_values(obs), flat_values(sample.obs)) or reward != sample.reward
                        or terminated != sample.terminated):
                    return True
        return False

    def _run_backend(self, samples: list[Sample], chunk: int = 1024):
        """The backend's step on every sample's state and action, in fixed-size jitted chunks."""
        step = jax.jit(jax.vmap(self.functional.step))
        outputs = []
        for start in range(0, len(samples), chunk):
            part = samples[start:start + chunk]
            padded = part + [part[0]] * (chunk - len(part)) if len(samples) > chunk else part
            keys = jax.random.split(jax.random.PRNGKey(self.settings.seed + start), len(padded))
            states = _stack([p.state for p in padded])
            actions = np.stack([np.asarray(p.action) for p in padded])
            out = step(keys, jax.tree_util.tree_map(jnp.asarray, states), jnp.asarray(actions))
            outputs.append(jax.tree_util.tree_map(lambda x: np.asarray(x)[: len(part)], out))
        return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *outputs)

    def _columns(self, samples: list[Sample], out):
        """(name, reference matrix, backend matrix, exact?) for every compared field."""
        n = len(samples)
        b_obs, b_state, b_reward, b_term = out
        columns = []
        obs_names = ["obs" + name for name in field_names(samples[0].obs)]
        ref_obs = np.stack([flat_values(smp.obs) for smp in samples])
        back_obs = np.concatenate([np.asarray(leaf, dtype=np.float64).reshape(n, -1) for leaf in jax.tree_util.tree_leaves(b_obs)], axis=1)
        obs_exact = [_kind(space.dtype) != "float" for space in _space_leaves(self.obs_space)
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

    def _compare_samples(self, report: LevelReport, check: str, samples: list[Sample]):
        if not samples:
            report.add(check, True, "no states of this kind (the reference rejected every probe)")
            return
        try:
            out = self._run_backend(samples)
            columns = self._columns(samples, out)
        except Exception as exc:
            report.add(check, False, f"the backend failed on these states: {type(exc).__name__}: {exc}")
            return
        s = self.settings
        ratios = []
        sensitivity = np.stack([smp.sensitivity for smp in samples])
        for column, (name, ref, back, exact) in enumerate(columns):
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
        failure = None
        if count:
            i = int(np.argmax(failing))
            fields = [{"field": name, "reference": _num(ref[i]), "backend": _num(back[i]),
                       "diff": f"{abs(back[i] - ref[i]):.3g}",
                       "allowed": f"{(0 if exact else s.atol + s.rtol * abs(ref[i])) + s.sensitivity_factor * sensitivity[i, c]:.3g}"}
                      for c, ((name, ref, back, exact), ratio) in enumerate(zip(columns, ratios)) if ratio[i] > 1]
            failure = {"origin": samples[i].origin, "state": _format_state(samples[i].state),
                       "action": _format_action(samples[i].action), "fields": fields,
                       "failing steps": count}
            detail += f"; {count} differ, first in field(s) {', '.join(f['field'] for f in fields)}"
        report.add(check, count == 0, detail, failure)

    def _level2_distributional(self, report, stepper, rollout, rng, pairs: int = 30, draws: int = 64):
        picks = rng.choice(len(rollout), size=min(pairs, len(rollout)), replace=False)
        step = jax.jit(jax.vmap(self.functional.step, in_axes=(0, None, None)))
        worst = (1.0, None, None, None, None)
        for index in picks:
            sample = rollout[int(index)]
            reference = []
            for d in range(draws):
                stepper.write_state(sample.state)
                stepper.unwrapped.np_random = np.random.default_rng(10_000 + d)
                obs, reward, terminated, _ = stepper.step(sample.action)
                reference.append(np.concatenate([flat_values(obs), [reward, float(terminated)]]))
            keys = jax.random.split(jax.random.PRNGKey(int(index)), draws)
            obs, _, reward, terminated = step(keys, jax.tree_util.tree_map(jnp.asarray, sample.state), jnp.asarray(sample.action))
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
                    worst = (p, sample, column, _histogram(backend[:, column]), _histogram(reference[:, column]))
        threshold = 1e-3 / (len(picks) * (flat_values(rollout[0].obs).size + 2))
        ok = worst[0] >= threshold
        failure = None
        if not ok:
            sample, column = worst[1], worst[2]
            names = ["obs" + n for n in field_names(sample.obs)] + ["reward", "terminated"]
            failure = {"origin": sample.origin, "state": _format_state(sample.state), "action": _format_action(sample.action),
                       "field": names[column] if column < len(names) else column,
                       "backend outcomes": worst[3], "reference outcomes": worst[4]}
        report.add("next-step distribution", ok,
                   f"{len(picks)} states x {draws} draws per side, lowest p={worst[0]:.3g} (threshold {threshold:.2g})", failure)

    # ------------------------------------------------------------------ L3
    def level3(self) -> LevelReport:
        if self.sync_broken:
            report = self._begin(3)
            report.add("trajectories from synced starts", False,
                       "the backend's state sync does not round-trip, so trajectories cannot start in sync (see L2)")
            return report
        if self.functional and self.functional.syncs_state and not self.stochastic:
            return self._level3_synced()
        report = self._begin(3)
        report.note = ("the reference is stochastic" if self.stochastic else "no state sync") + \
            ": return distributions under a fixed policy, TOST"
        self._returns_equivalence(report)
        return report

    def _level3_synced(self) -> LevelReport:
        report = self._begin(3)
        s = self.settings
        report.tolerances = {"per step": _tolerance_text(s) + f" + {s.chaos_factor:g} * |shadow - reference|",
                             "shadow": "the reference itself with its state rounded to float32 after every step (and, in a second "
                                       "run, also moved by one float32 rounding); "
                                       "steps where it has diverged (>1% or a different termination) are past the "
                                       "predictable horizon and not compared"}
        horizon = min(self.max_steps or s.rollout_steps, s.rollout_steps)
        stepper = ReferenceStepper(self.env_id, self.functional)
        plans = scripted_plans(self.action_space)
        self.action_space.seed(s.seed + 7)
        trajectories = []
        try:
            for i in range(s.l3_trajectories):
                if i < len(plans):
                    name, plan = plans[i]
                    actions = [plan(t) for t in range(horizon)]
                else:
                    name, actions = "random actions", [self.action_space.sample() for _ in range(horizon)]
                trajectories.append(self._reference_trajectory(stepper, s.seed + 100 + i, actions, name))
        finally:
            stepper.close()
        start = jax.tree_util.tree_map(jnp.asarray, _stack([t["start"] for t in trajectories]))
        actions = jnp.asarray(np.stack([np.stack([np.asarray(a) for a in t["actions"]]) for t in trajectories]))
        try:
            out = self._backend_rollouts(start, actions)
        except Exception as exc:
            report.add("trajectories from synced starts", False, f"the backend failed: {type(exc).__name__}: {exc}")
            return report
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
                    fields = [{"field": traj["names"][j], "reference": _num(ref[j]), "backend": _num(back[j]),
                               "diff": f"{diff[j]:.3g}", "allowed": f"{allowed[j]:.3g}"} for j in np.flatnonzero(bad)]
                    if term_bad:
                        fields.append({"field": "terminated", "reference": traj["term"][t], "backend": bool(b_term[t]),
                                       "diff": "", "allowed": "exact"})
                    first = {"trajectory": f"{traj['name']}, reset seed {traj['seed']}", "step": t,
                             "state": _format_state(traj["states"][t]), "action": _format_action(traj["actions"][t]),
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
        return report

    def _reference_trajectory(self, stepper: ReferenceStepper, seed: int, actions: list, name: str) -> dict:
        start = stepper.write_state(stepper.reset(seed))
        obs_names = ["obs" + n for n in field_names(self.obs_space.sample())] \
            if isinstance(self.obs_space, (gym.spaces.Box, gym.spaces.Discrete)) else None
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

    def _backend_rollouts(self, start, actions):
        step = self.functional.step

        def one(state, acts, key):
            def body(carry, action):
                st, k = carry
                k, sub = jax.random.split(k)
                obs, st, reward, terminated = step(sub, st, action)
                flat = jnp.concatenate([jnp.ravel(x).astype(jnp.float32) for x in jax.tree_util.tree_leaves(obs)])
                return (st, k), (flat, reward, terminated)

            return jax.lax.scan(body, (state, key), acts)[1]

        keys = jax.random.split(jax.random.PRNGKey(self.settings.seed), actions.shape[0])
        out = jax.jit(jax.vmap(one))(start, actions, keys)
        return [np.asarray(x, dtype=np.float64) for x in out]

    def _episode_returns(self, run_backend: bool, policy_seed: int, episodes: int, horizon: int, policy=None) -> np.ndarray:
        policy = policy or _policy(self.obs_space, self.action_space, policy_seed)
        noise = np.random.default_rng(policy_seed + (1 if run_backend else 2))
        if run_backend:
            venv = self.make_vec(episodes, self.settings.seed + 1)
            obs, _ = venv.reset(seed=self.settings.seed + 1)
            returns = np.zeros(episodes)
            active = np.ones(episodes, bool)
            for _ in range(horizon):
                obs, reward, terminated, truncated, _ = venv.step(policy(_flatten_batch(self.obs_space, obs), noise))
                returns += np.where(active, reward, 0.0)
                active &= ~(terminated | truncated)
                if not active.any():
                    break
            venv.close()
            return returns
        returns = np.zeros(episodes)
        for episode in range(episodes):
            obs, _ = self.reference.reset(seed=20_000 + episode)
            for _ in range(horizon):
                action = policy(gym.spaces.flatten(self.obs_space, obs)[None].astype(np.float64), noise)[0]
                obs, reward, terminated, truncated, _ = self.reference.step(action)
                returns[episode] += reward
                if terminated or truncated:
                    break
        return returns

    def _returns_equivalence(self, report: LevelReport):
        s = self.settings
        horizon = min(self.max_steps or s.horizon, s.horizon)
        report.tolerances = {"TOST": f"equivalence margin {s.margin_sd} pooled sd (floor 1% of the reference mean), alpha 0.05"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            backend = self._episode_returns(True, s.seed + 3, s.episodes, horizon)
            reference = self._episode_returns(False, s.seed + 3, s.episodes, horizon)
        result = tost(backend, reference, margin_sd=s.margin_sd)
        report.largest_deviation = {"mean return difference": result.mean_a - result.mean_b, "margin": result.margin}
        report.add("return distribution (fixed policy, TOST)", result.equivalent,
                   f"return over at most {horizon} steps: backend {result.describe()}",
                   None if result.equivalent else {"policy": "75% fixed random linear map of the observation, 25% uniform random",
                                                   "backend returns": _describe(backend), "reference returns": _describe(reference)})

    # ------------------------------------------------------------------ L4
    def level4(self) -> LevelReport:
        report = self._begin(4)
        s = self.settings
        horizon = min(self.max_steps or s.horizon, s.horizon)
        report.tolerances = {"TOST": f"equivalence margin {s.margin_sd} pooled sd (floor 1% of the reference mean), alpha 0.05"}
        weights, history = self._train_cem(horizon)
        policy = _linear_policy(weights, self.obs_space, self.action_space)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            backend = self._episode_returns(True, s.seed + 5, s.episodes, horizon, policy)
            reference = self._episode_returns(False, s.seed + 5, s.episodes, horizon, policy)
        result = tost(backend, reference, margin_sd=s.margin_sd)
        report.largest_deviation = {"mean return difference": result.mean_a - result.mean_b, "margin": result.margin}
        report.add("trained policy transfers (TOST)", result.equivalent,
                   f"linear policy trained on the backend by the cross-entropy method ({s.l4_iterations} iterations, "
                   f"mean return {history[0]:.4g} -> {history[-1]:.4g}); scored over at most {horizon} steps: "
                   f"backend {result.describe()}",
                   None if result.equivalent else {"backend returns": _describe(backend), "reference returns": _describe(reference)})
        return report

    def _train_cem(self, horizon: int, population: int = 64, elite: int = 8):
        rng = np.random.default_rng(self.settings.seed)
        dim_in = gym.spaces.flatdim(self.obs_space)
        dim_out = self.action_space.n if isinstance(self.action_space, gym.spaces.Discrete) else int(np.prod(self.action_space.shape))
        mean, std = np.zeros((dim_in + 1, dim_out)), np.ones((dim_in + 1, dim_out))
        history = []
        venv = self.make_vec(population, self.settings.seed + 9)
        try:
            for iteration in range(self.settings.l4_iterations):
                candidates = mean + std * rng.normal(size=(population,) + mean.shape)
                obs, _ = venv.reset(seed=self.settings.seed + 9 + iteration)
                returns, active = np.zeros(population), np.ones(population, bool)
                for _ in range(horizon):
                    x = np.concatenate([np.clip(_flatten_batch(self.obs_space, obs), -10, 10), np.ones((population, 1))], axis=1)
                    scores = np.einsum("pi,pio->po", x, candidates)
                    obs, reward, terminated, truncated, _ = venv.step(_scores_to_actions(scores, self.action_space))
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


def _linear_policy(weights: np.ndarray, obs_space: gym.Space, action_space: gym.Space):
    def act(flat_obs: np.ndarray, _noise) -> np.ndarray:
        x = np.concatenate([np.clip(flat_obs, -10, 10), np.ones((len(flat_obs), 1))], axis=1)
        return _scores_to_actions(x @ weights, action_space)

    return act


def _histogram(values: np.ndarray) -> str:
    """Counts of each value for a few discrete values, else mean/sd/min/max."""
    unique, counts = np.unique(values, return_counts=True)
    if len(unique) <= 10:
        return ", ".join(f"{u:g}: {c}" for u, c in zip(unique, counts))
    return "mean/sd/min/max " + _describe(values)


def _summary(space: gym.Space) -> str:
    if isinstance(space, gym.spaces.Box):
        return f"Box(shape {space.shape}, {space.dtype}, bounds included)"
    return str(space)


def _describe(values: np.ndarray) -> str:
    values = np.asarray(values, dtype=np.float64)
    return f"{values.mean():.4g}/{values.std():.3g}/{values.min():.4g}/{values.max():.4g}"


def _num(value) -> str:
    return f"{float(value):.9g}"


# ------------------------------------------------------------------------------ entry points

def verify(env_id: str, spec: str, levels=(1, 2, 3), settings: Settings | None = None, root=None,
           use_cache: bool = True) -> Report:
    """Verify backend SPEC for `env_id` at the given levels and return the report.

    Raises BackendError for bad input (unknown env id, file that does not import, protocol function
    missing). A passing verdict over at least L1-L3 is cached for `envs_fast.choose_backend`.
    """
    settings = settings or Settings()
    levels = sorted(set(int(level) for level in levels))
    unknown = [level for level in levels if level not in (1, 2, 3, 4)]
    if unknown or not levels:
        raise BackendError(f"levels must be among 1,2,3,4; got {levels}")
    started = time.perf_counter()
    verifier = Verifier(env_id, spec, settings, root)
    report = Report(env_id, verifier.spec)
    runners = {1: verifier.level1, 2: verifier.level2, 3: verifier.level3, 4: verifier.level4}
    if 3 in levels and 2 not in levels and verifier.functional and verifier.functional.syncs_state:
        stepper = ReferenceStepper(env_id, verifier.functional)
        try:  # L3 needs to know whether trajectories can be compared step by step
            sample = collect_rollout_samples(stepper, verifier.action_space, 20, 20, settings.seed, max_episodes=3)
            verifier.sync_broken = bool(not sample or verifier._sync_problem(stepper, sample))
            if not verifier.sync_broken:
                verifier.stochastic = verifier._detect_stochastic(stepper, sample[:20])
        finally:
            stepper.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for level in levels:
            try:
                report.levels.append(runners[level]())
            except BackendError:
                raise
            except Exception as exc:  # a backend that crashes fails the level, with the reason
                failed = verifier.partial if verifier.partial and verifier.partial.level == level else LevelReport(level)
                failed.add("runs", False, f"{type(exc).__name__}: {exc}")
                report.levels.append(failed)
    verifier.reference.close()
    report.seconds = time.perf_counter() - started
    if use_cache and {1, 2, 3} <= set(levels):
        cache.store_verdict(verifier.spec, env_id, levels, report.passed, report.to_text().splitlines()[0])
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verify", description="Verify a fast backend against its gymnasium reference.")
    parser.add_argument("--env", required=True, help="gymnasium env id, e.g. CartPole-v1")
    parser.add_argument("--backend", required=True,
                        help="translation file path, jax/translation (envs_fast/<slug>.py), envpool, gymnax or reference")
    parser.add_argument("--levels", default="1,2,3", help="comma-separated levels among 1,2,3,4 (default 1,2,3)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=Settings.episodes, help="episodes per side for statistical checks")
    parser.add_argument("--horizon", type=int, default=Settings.horizon, help="steps per episode for statistical checks")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    try:
        levels = [int(part) for part in args.levels.split(",") if part.strip()]
    except ValueError:
        print(f"error: --levels must be comma-separated integers, got {args.levels!r}", file=sys.stderr)
        return 2
    settings = Settings(seed=args.seed, episodes=args.episodes, horizon=args.horizon)
    try:
        report = verify(args.env, args.backend, levels, settings)
    except BackendError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(report.to_text(), flush=True)
    except BrokenPipeError:  # e.g. piped into `head`; the exit code still tells the verdict
        sys.stdout = None
    if args.json:
        Path(args.json).write_text(report.to_json())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
