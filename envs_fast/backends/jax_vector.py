"""A functional JAX backend as a `gymnasium.vector.VectorEnv` (so the torch PPO trains on it unchanged).

Semantics follow gymnasium's SyncVectorEnv in NEXT_STEP autoreset mode: the step after an episode
ends returns the reset observation with reward 0 and both flags False; episodes are truncated at the
registered spec's `max_episode_steps`.
"""
from __future__ import annotations

from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from envs_fast.vector_env import TranslationVectorEnv, max_episode_steps, reference_spaces  # noqa: F401 (importers use them from here)
from envs_fast.protocol import FunctionalBackend


def _select(mask, when_true, when_false):
    """Per-env choice between two batched pytrees (mask has shape [num_envs])."""

    def pick(a, b):
        m = mask.reshape(mask.shape + (1,) * (b.ndim - 1))
        return jnp.where(m, a.astype(b.dtype), b)  # keep the step output's dtype in every branch

    return jax.tree_util.tree_map(pick, when_true, when_false)


def mix32(x):
    """lowbias32 integer hash: a cheap bijective mixer of uint32 values."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def derive_keys(key, count: int):
    """`count` distinct raw PRNG keys from one, by hashing (key, index). Equivalent in use to
    jax.random.split, at a fraction of the cost: a threefry split per env costs more than a
    classic-control step, and keys are needed for every env at every step."""
    data = jnp.asarray(key, jnp.uint32).reshape(2)
    index = jnp.arange(count, dtype=jnp.uint32)
    first = mix32(data[0] ^ mix32(index * jnp.uint32(0x9E3779B1) + jnp.uint32(1)))
    second = mix32(data[1] ^ mix32(index * jnp.uint32(0x85EBCA77) + jnp.uint32(2)))
    return jnp.stack([first, second], axis=-1)


def make_batched_functions(backend: FunctionalBackend, time_limit: int | None):
    """Jittable batched reset and autoresetting step shared by the adapter and the benchmark."""
    limit = time_limit if time_limit is not None else np.iinfo(np.int32).max

    def batched_reset(keys):
        return jax.vmap(backend.reset)(keys)

    def merge_resets(key, needs_reset, obs, state):
        """Replace the outputs of the envs that need a reset by fresh resets. Usually only a few envs
        reset in a step, so only `few` resets are computed and scattered in (the random numbers of a
        reset cost more than a classic-control step); all of them when more are due; none when none."""
        num_envs = needs_reset.shape[0]
        few = min(num_envs, max(16, num_envs // 16))
        count = needs_reset.sum()

        def none_due(_):
            return obs, state

        def some_due(_):
            index = jnp.nonzero(needs_reset, size=few, fill_value=num_envs)[0]
            reset_obs, reset_state = batched_reset(derive_keys(key, few))
            scatter = lambda base, fresh: base.at[index].set(fresh.astype(base.dtype), mode="drop")
            return jax.tree_util.tree_map(scatter, obs, reset_obs), jax.tree_util.tree_map(scatter, state, reset_state)

        def all_due(_):
            reset_obs, reset_state = batched_reset(derive_keys(key, num_envs))
            return _select(needs_reset, reset_obs, obs), _select(needs_reset, reset_state, state)

        branch = jnp.where(count == 0, 0, jnp.where(count <= few, 1, 2))
        return jax.lax.switch(branch, (none_due, some_due, all_due), None)

    def batched_step(key, state, elapsed, needs_reset, actions):
        num_envs = needs_reset.shape[0]
        step_key, reset_key = jax.random.split(key)
        obs, new_state, reward, terminated = jax.vmap(backend.step)(
            derive_keys(step_key, num_envs), state, actions
        )
        obs, new_state = merge_resets(reset_key, needs_reset, obs, new_state)
        elapsed = elapsed + 1
        terminated = jnp.asarray(terminated, bool).reshape(num_envs)
        truncated = elapsed >= limit
        reward = jnp.where(needs_reset, 0.0, jnp.asarray(reward).reshape(num_envs))
        terminated = jnp.where(needs_reset, False, terminated)
        truncated = jnp.where(needs_reset, False, truncated)
        elapsed = jnp.where(needs_reset, 0, elapsed)
        return obs, new_state, reward, terminated, truncated, elapsed, terminated | truncated

    return batched_reset, batched_step


def _to_numpy(tree, space: gym.Space):
    """Backend output (a pytree of jax arrays) -> numpy in the batched space's structure and dtype."""
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_to_numpy(t, s) for t, s in zip(tree, space.spaces))
    if isinstance(space, gym.spaces.Dict):
        return {k: _to_numpy(tree[k], s) for k, s in space.spaces.items()}
    return np.asarray(tree).astype(space.dtype, copy=False).reshape(space.shape)


class JaxVectorEnv(TranslationVectorEnv):
    def __init__(self, backend: FunctionalBackend, num_envs: int, seed: int | None = None):
        super().__init__(backend, num_envs, seed)
        reset_fn, step_fn = make_batched_functions(backend, self.max_episode_steps)
        self._reset_fn = jax.jit(reset_fn)

        def step_with_key(key, *args):  # one dispatch per step: the key is split inside the jit
            key, sub = jax.random.split(key)
            return (key,) + step_fn(sub, *args)

        self._step_fn = jax.jit(step_with_key)
        self._key = jax.random.PRNGKey(0 if seed is None else seed)
        self._state = None

    def reset(self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None):
        self._refuse(options)
        if seed is not None:
            if isinstance(seed, (list, tuple)):
                if len(seed) != self.num_envs:
                    raise ValueError(f"expected {self.num_envs} seeds, got {len(seed)}")
                self._key = jax.random.PRNGKey(int(seed[0]))
                keys = jnp.stack([jax.random.PRNGKey(int(s)) for s in seed])
            else:
                self._key = jax.random.PRNGKey(int(seed))
                self._key, sub = jax.random.split(self._key)
                keys = jax.random.split(sub, self.num_envs)
        else:
            self._key, sub = jax.random.split(self._key)
            keys = jax.random.split(sub, self.num_envs)
        obs, self._state = self._reset_fn(keys)
        self._elapsed = jnp.zeros(self.num_envs, jnp.int32)
        self._needs_reset = jnp.zeros(self.num_envs, bool)
        return _to_numpy(obs, self.observation_space), {}

    def _actions_to_jax(self, actions):
        space = self.single_action_space
        if isinstance(space, gym.spaces.Discrete):
            actions = np.asarray(actions).reshape(self.num_envs)
            if not np.all((actions >= space.start) & (actions < space.start + space.n)):
                raise ValueError(f"actions {actions} outside {space}")
            return jnp.asarray(actions, jnp.int32)  # the same action values the reference receives
        if isinstance(space, gym.spaces.Box):
            return jnp.asarray(np.asarray(actions, dtype=space.dtype).reshape((self.num_envs,) + space.shape))
        return jax.tree_util.tree_map(jnp.asarray, actions)

    def step(self, actions):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        self._key, obs, self._state, reward, terminated, truncated, self._elapsed, self._needs_reset = self._step_fn(
            self._key, self._state, self._elapsed, self._needs_reset, self._actions_to_jax(actions)
        )
        obs, reward, terminated, truncated = jax.device_get((obs, reward, terminated, truncated))
        return (
            _to_numpy(obs, self.observation_space),
            np.asarray(reward, dtype=np.float64),
            np.asarray(terminated, dtype=bool),
            np.asarray(truncated, dtype=bool),
            {},
        )

    def close_extras(self, **kwargs):
        self._state = None
