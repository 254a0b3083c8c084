"""The training adapter of a Rust translation: a gymnasium VectorEnv over a `RustBackend` (see
backend.py for the C ABI), with the semantics of `backends.jax_vector.JaxVectorEnv`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from envs_fast.vector_env import TranslationVectorEnv
from envs_fast.rust.backend import RustBackend, load_rust

_STREAM_MULTIPLIER = 0x9E3779B97F4A7C15  # spreads the seed streams of different reset seeds apart


def _stream_start(seed: int) -> int:
    return (int(seed) * _STREAM_MULTIPLIER + 1) % 2**64


class RustVectorEnv(TranslationVectorEnv):
    """A Rust translation as a gymnasium VectorEnv, with the semantics of `backends.jax_vector.JaxVectorEnv`:
    NEXT_STEP autoreset (the step after an episode ends returns the reset observation, reward 0,
    both flags False), truncation at the registered spec's max_episode_steps, the reference's spaces.

    Built for the host training loop at a few dozen envs, where the per-step Python overhead is
    the cost: buffers are preallocated, their addresses passed as cached ints, and a step is one C
    call plus a few in-place numpy ops. Returned arrays are fresh (never overwritten later)."""

    def __init__(self, backend: RustBackend, num_envs: int, seed: int | None = None):
        super().__init__(backend, num_envs, seed)
        n = num_envs
        self._limit = self.max_episode_steps if self.max_episode_steps is not None else np.iinfo(np.int64).max
        self._seeds = np.zeros(n, np.uint64)  # per-env seeds of the next C call: a stream advanced by n per call
        self._seed_stride = np.uint64(n)
        self._stream_offsets = np.arange(n, dtype=np.uint64)
        self._resets = np.zeros(n, bool)  # envs whose episode ended last step (bool is one byte 0/1: the ABI's u8)
        self._state = np.zeros((n, backend.state_size), np.float64)
        self._actions = np.zeros((n, backend.action_size), np.float64)
        self._obs = np.zeros((n, backend.obs_size), np.float32)
        self._reward = np.zeros(n, np.float64)
        self._terminated = np.zeros(n, np.uint8)
        self._elapsed = np.zeros(n, np.int64)
        pointer = lambda array: array.ctypes.data  # noqa: E731
        self._step_args = (n, pointer(self._seeds), pointer(self._resets), pointer(self._state), pointer(self._actions),
                           pointer(self._obs), pointer(self._reward), pointer(self._terminated))
        self._step_fn = backend.library.autorl_step
        self._reset_fn = backend.library.autorl_reset
        space = self.single_action_space
        self._discrete = isinstance(space, gym.spaces.Discrete)
        self._action_low, self._action_high = (int(space.start), int(space.start + space.n - 1)) if self._discrete else (None, None)
        # where np.copyto writes the caller's actions (one cast, no allocation)
        self._action_target = (self._actions.reshape(n) if self._discrete else
                               self._actions.reshape((n,) + space.shape) if isinstance(space, gym.spaces.Box) else None)
        obs_space = self.single_observation_space
        self._obs_is_float32_box = isinstance(obs_space, gym.spaces.Box) and obs_space.dtype == np.float32
        self._obs_view = self._obs.reshape((n,) + obs_space.shape) if self._obs_is_float32_box else self._obs
        self._started = False
        self._seeds[:] = self._stream_offsets + np.uint64(_stream_start(0 if seed is None else seed))

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None):
        self._refuse(options)
        reset_seeds = self._seeds
        if seed is not None:
            if isinstance(seed, (list, tuple, np.ndarray)):
                if len(seed) != self.num_envs:
                    raise ValueError(f"expected {self.num_envs} seeds, got {len(seed)}")
                reset_seeds = np.ascontiguousarray(np.asarray(seed).astype(np.uint64))  # env i from seed[i] exactly
                start = _stream_start(int(seed[0]))
            else:
                start = _stream_start(int(seed))
            np.add(self._stream_offsets, np.uint64(start), out=self._seeds)
        else:
            np.add(self._seeds, self._seed_stride, out=self._seeds)
        self._reset_fn(self.num_envs, reset_seeds.ctypes.data, self._step_args[3], self._step_args[5])
        self._resets[:] = False
        self._elapsed[:] = 0
        self._started = True
        return self._observations(), {}

    def _observations(self):
        if self._obs_is_float32_box:
            return self._obs_view.copy()
        return self.backend.observations(self._obs)

    def step(self, actions):
        if not self._started:
            raise RuntimeError("call reset() before step()")
        if self._action_target is not None:
            np.copyto(self._action_target, actions, casting="unsafe")
        else:
            self._actions[:] = self.backend._action_array(actions, self.num_envs)
        if self._discrete:
            low, high = self._actions.min(), self._actions.max()
            if low < self._action_low or high > self._action_high:
                raise ValueError(f"actions {actions} outside {self.single_action_space}")
        np.add(self._seeds, self._seed_stride, out=self._seeds)
        self._step_fn(*self._step_args)
        # The time limit: episodes that were reset in this call start counting again.
        np.add(self._elapsed, 1, out=self._elapsed)
        np.copyto(self._elapsed, 0, where=self._resets)
        terminated = self._terminated != 0
        truncated = self._elapsed >= self._limit
        np.logical_or(terminated, truncated, out=self._resets)
        return self._observations(), self._reward.copy(), terminated, truncated, {}

    def close_extras(self, **kwargs):
        self._started = False


def make_rust_vec_env(path: str | Path, env_id: str, num_envs: int, seed: int | None = None) -> RustVectorEnv:
    return RustVectorEnv(load_rust(path, env_id), num_envs, seed)
