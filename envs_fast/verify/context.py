"""What every level reads, built once per `verify` call: the env, its reference, the backend, the
settings, and the sync status (computed lazily, once, the first time a level asks)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from envs_fast.backends import load as backends
from envs_fast.verify.probes import ReferenceStepper, Sample, collect_rollout_samples, field_names, flat_values
from envs_fast.protocol import BatchedBackend, check_env_id, resolve_spec
from envs_fast.verify.declarations import Declarations, declarations_of
from envs_fast.verify.formatting import format_state


@dataclass
class Settings:
    """How hard each level looks. Defaults suit the CLI; tests shrink the statistical ones."""
    seed: int = 0
    rtol: float = 1e-4  # float fields: |backend - reference| <= atol + rtol * |reference|
    atol: float = 1e-5
    reset_samples: int = 1000  # L1 resets per side (vector backends: min(this, vector_reset_samples))
    vector_reset_samples: int = 300
    state_reset_samples: int = 300  # L1 reset states per side (backends with state sync)
    l2_target: int = 3000  # L2 states from rollouts (boundary probes come on top)
    l2_policy_steps: int | None = None  # at most this many steps per episode of a declared policy (tests shrink it)
    rollout_steps: int = 300  # longest L2 episode / L3 trajectory
    l3_trajectories: int = 24
    sensitivity_factor: float = 125.0  # L2: allowance per unit of the reference's float32-rounding sensitivity
    chaos_factor: float = 100.0  # L3: allowance per unit of float32-rounding divergence of the reference
    episodes: int = 200  # statistical L3/L4 episodes per side
    horizon: int = 200  # statistical L3 return over at most this many steps
    margin_sd: float = 0.5  # TOST margin in pooled standard deviations
    # L3 of a chaotic scene, past the predictable horizon: episodes per side and policy (200: TOST at
    # margin_sd passes a correct port with probability 0.999 per statistic)
    statistics_episodes: int = 200
    l4_iterations: int = 8
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SyncStatus:
    """Whether the backend's state sync works and whether the reference's transitions are random.
    `broken` with `unsynced` (no state could be synced at all: the reason) or `problem` (a state
    did not round-trip: what the report shows)."""
    syncs: bool  # the backend declares state sync
    broken: bool = False
    unsynced: str = ""
    problem: dict | None = None
    stochastic: bool = False


# The note L2 and L3 carry for a backend that cannot sync state (third-party ones: gymnax, envpool):
# a translation always syncs (its loader refuses it otherwise), since return distributions alone let
# small physics errors through.
STATISTICAL_ONLY = ("statistical only, the weaker verification: this backend's state cannot be synced with the "
                    "reference, so L2 is not applicable and L3 compares return distributions under a fixed policy "
                    "(TOST); a translation must sync state")


# The short reference rollout the sync status comes from: a few episodes of a few steps.
SYNC_STEPS, SYNC_EPISODES, SYNC_SAMPLES = 20, 3, 40


def compute_sync_status(ctx: "Context") -> SyncStatus:
    if not (ctx.backend and ctx.backend.syncs_state):
        return SyncStatus(syncs=False)
    stepper = ReferenceStepper(ctx.env_id, ctx.backend)
    try:
        samples = collect_rollout_samples(stepper, ctx.action_space, SYNC_STEPS, SYNC_SAMPLES, ctx.settings.seed,
                                          max_episodes=SYNC_EPISODES)
        if not samples:
            return SyncStatus(syncs=True, broken=True, unsynced=stepper.last_error)
        problem = sync_problem(stepper, samples)
        if problem:
            return SyncStatus(syncs=True, broken=True, problem=problem)
        return SyncStatus(syncs=True, stochastic=detect_stochastic(stepper, samples[:SYNC_SAMPLES]))
    finally:
        stepper.close()


def sync_problem(stepper: ReferenceStepper, samples: list[Sample]) -> dict | None:
    """Whether state_to_reference really writes what state_from_reference reads: states from
    different moments written in turn must read back as written (up to float32 rounding). Fields the
    backend declares read-only (`read_only_fields`: what the reference derives itself, e.g. a physics
    engine's contacts) are not compared; both sides step from what the reference then holds."""
    picks = [samples[i].next_state for i in sorted(set(np.linspace(0, len(samples) - 1, 6).astype(int)))]
    read_only = set(getattr(stepper.backend, "read_only_fields", ()) or ())
    for state in picks + picks[::-1]:
        try:
            back = stepper.write_state(state)
        except Exception as exc:
            return {"detail": f"state_to_reference/state_from_reference raised {type(exc).__name__}: {exc}"}
        want, got, names = flat_values(state), flat_values(back), field_names(state)
        if read_only and want.shape == got.shape:
            writable = np.array([name.lstrip(".") not in read_only for name in names])
            want, got, names = want[writable], got[writable], [n for n, keep in zip(names, writable) if keep]
        if want.shape != got.shape or not np.allclose(got, want, rtol=1e-6, atol=1e-7):
            failure = {"detail": "a state written with state_to_reference does not read back with state_from_reference"}
            if want.shape == got.shape:  # the fields the sync lost, named first: the state follows whole
                differ = np.flatnonzero(~np.isclose(got, want, rtol=1e-6, atol=1e-7))
                failure["fields that did not read back (field: written -> read back)"] = ", ".join(
                    f"{names[i] or 'state'}: {want[i]:.9g} -> {got[i]:.9g}" for i in differ[:12]) + (
                    f" and {len(differ) - 12} more" if len(differ) > 12 else "")
            return {**failure, "written": format_state(state), "read back": format_state(back)}
    return None


def detect_stochastic(stepper: ReferenceStepper, samples: list[Sample]) -> bool:
    """Whether replaying a sample's step under other RNG seeds ever gives another outcome."""
    for sample in samples:
        for seed in range(3):
            stepper.write_state(sample.state)
            stepper.unwrapped.np_random = np.random.default_rng(1234 + seed)
            obs, reward, terminated, next_state = stepper.step(sample.action)
            if (not np.array_equal(flat_values(obs), flat_values(sample.obs)) or reward != sample.reward
                    or terminated != sample.terminated):
                return True
    return False


@dataclass
class Context:
    env_id: str
    spec: str  # resolved: a file path, "gymnax", "envpool" or "reference"
    settings: Settings
    root: str | Path | None
    reference: gym.Env
    backend: BatchedBackend | None  # None for the vector-only specs (envpool, reference)
    max_episode_steps: int | None
    declarations: Declarations = field(default_factory=Declarations)  # what the translation declares for its verification
    # A float32 backend's float64 twin (mjx; backend.load_float64_twin): L2 and L3 compare it with the
    # reference at their tolerances and report the backend's own departure from it as float32 rounding
    twin: BatchedBackend | None = None
    _sync: Any = field(default=None, repr=False)

    @classmethod
    def open(cls, env_id: str, spec: str, settings: Settings, root=None) -> "Context":
        """Raises BackendError for bad input, BuildError when a translation does not compile."""
        registered = check_env_id(env_id)
        spec = resolve_spec(spec, env_id, root)
        backend = backends.load_batched(spec, env_id, root)
        return cls(env_id, spec, settings, root, gym.make(env_id), backend, registered.max_episode_steps,
                   declarations_of(spec) if backend else Declarations(),
                   backends.load_float64_twin(spec, env_id, root) if backend else None)

    @property
    def compared(self) -> BatchedBackend | None:
        """What L2 and L3 hold to the reference's tolerances: the float64 twin when there is one."""
        return self.twin or self.backend

    @property
    def obs_space(self) -> gym.Space:
        return self.reference.observation_space

    @property
    def action_space(self) -> gym.Space:
        return self.reference.action_space

    @property
    def sync(self) -> SyncStatus:
        """Computed on first use and shared by every level after (an error too: each asking level
        fails with it, none recomputes)."""
        if self._sync is None:
            try:
                self._sync = compute_sync_status(self)
            except Exception as exc:
                self._sync = exc
        if isinstance(self._sync, Exception):
            raise self._sync
        return self._sync

    def make_vec(self, num_envs: int, seed: int):
        from envs_fast import make_vec_env

        return make_vec_env(self.spec, self.env_id, num_envs, seed, self.root, verified_only=False)  # what it verifies

    def close(self):
        self.reference.close()
