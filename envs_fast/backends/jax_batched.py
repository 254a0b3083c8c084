"""A functional JAX backend (a translation, gymnax) behind the numpy `BatchedBackend` interface the
verifier drives: every call is a jitted, vmapped call over the batch, run at one batch size."""
from __future__ import annotations

from contextlib import contextmanager

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from envs_fast.protocol import SIGNATURE_PROBLEM, FunctionalBackend, dtype_kind, space_leaves


# Every reset and step runs at this batch size (a smaller batch padded with copies of its last row,
# a larger one in chunks, the results cut back): one compiled program each, where the verifier's
# batches of 64, 446 and 1024 compiled three (a second or more apiece).
BATCH = 1024


def _pad(tree, rows: int):
    return jax.tree_util.tree_map(
        lambda x: np.concatenate([x, np.repeat(x[-1:], BATCH - rows, axis=0)]) if rows < BATCH else x, tree)


def _keys(seeds):
    return jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds, jnp.uint32))


def _to_numpy(tree):
    return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))


def _to_jax(tree):
    return jax.tree_util.tree_map(jnp.asarray, tree)


class JaxBatched:
    """`BatchedBackend` over a `FunctionalBackend`. The jitted functions live on the instance, so
    repeated calls with the same batch shapes reuse one compilation."""

    def __init__(self, functional: FunctionalBackend):
        self.functional = functional
        self.name = functional.name
        self.env_id = functional.env_id
        self.source_hash = functional.source_hash
        self.state_from_reference = functional.state_from_reference
        self.state_to_reference = functional.state_to_reference
        self.read_only_fields = functional.read_only_fields
        self.unreadable_fields = functional.unreadable_fields
        fb = functional
        self._reset = jax.jit(lambda seeds: jax.vmap(fb.reset)(_keys(seeds)))
        self._step = jax.jit(lambda seeds, state, actions: jax.vmap(fb.step)(_keys(seeds), state, actions))
        self._rollout = jax.jit(jax.vmap(self._one_rollout))
        self._single_reset = jax.jit(fb.reset)
        self._single_step = jax.jit(fb.step)

    @property
    def syncs_state(self) -> bool:
        return self.functional.syncs_state

    def reset(self, seeds):
        return self._at_batch_size(self._reset, seeds)

    def step(self, seeds, state, actions):
        return self._at_batch_size(self._step, seeds, state, actions)

    @staticmethod
    def _at_batch_size(function, seeds, *batched):
        """`function(seeds, *batched)` over chunks of BATCH rows, each padded to BATCH."""
        seeds = np.asarray(seeds, np.uint32)
        batched = jax.tree_util.tree_map(np.asarray, batched)
        if not len(seeds):
            return _to_numpy(function(seeds, *batched))
        outputs = []
        for start in range(0, len(seeds), BATCH):
            rows = min(BATCH, len(seeds) - start)
            part = jax.tree_util.tree_map(lambda x: x[start:start + rows], (seeds, *batched))
            out = _to_numpy(function(*_pad(part, rows)))
            outputs.append(jax.tree_util.tree_map(lambda x: x[:rows], out))
        return outputs[0] if len(outputs) == 1 else jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *outputs)

    def _one_rollout(self, seed, state, actions):
        step = self.functional.step

        def body(carry, action):
            st, key = carry
            key, sub = jax.random.split(key)
            obs, st, reward, terminated = step(sub, st, action)
            # float32, or float64 for a float64 twin (whose L3 comparison must not round its observations)
            flat = jnp.concatenate([jnp.ravel(x).astype(jax.dtypes.canonicalize_dtype(jnp.float64))
                                    for x in jax.tree_util.tree_leaves(obs)])
            return (st, key), (flat, reward, terminated)

        return jax.lax.scan(body, (state, jax.random.PRNGKey(seed)), actions)[1]

    def rollout(self, seeds, state, actions):
        obs, reward, terminated = self._rollout(jnp.asarray(seeds, jnp.uint32), _to_jax(state), jnp.asarray(actions))
        return (np.asarray(obs, dtype=np.float64), np.asarray(reward, dtype=np.float64),
                np.asarray(terminated, dtype=bool))

    def protocol_problems(self, obs_space: gym.Space, action_space: gym.Space) -> list[str]:
        """Runs reset and one step on a single key and checks what they return against the protocol
        and the reference spaces. An exception from the backend propagates (L1 reports it)."""
        key = jax.random.PRNGKey(0)
        obs, state = self._single_reset(key)
        out = self._single_step(key, state, jnp.asarray(action_space.sample()))
        if len(out) != 4:
            return [f"{SIGNATURE_PROBLEM}step returned {len(out)} values; the protocol is (obs, state, reward, terminated)"]
        problems = []
        for name, value in (("reset", obs), ("step", out[0])):
            leaves = jax.tree_util.tree_leaves(value)
            spaces_ = space_leaves(obs_space)
            if len(leaves) != len(spaces_):
                problems.append(f"{name} observation has {len(leaves)} arrays, the space has {len(spaces_)}")
                continue
            for leaf, space in zip(leaves, spaces_):
                shape = getattr(space, "shape", ()) or ()
                if tuple(np.shape(leaf)) != tuple(shape):
                    problems.append(f"{name} observation shape {np.shape(leaf)} != space shape {shape}")
                if dtype_kind(np.asarray(leaf).dtype) != dtype_kind(space.dtype):
                    problems.append(f"{name} observation dtype {np.asarray(leaf).dtype} is not {dtype_kind(space.dtype)} like the space's {space.dtype}")
        reward, terminated = out[2], out[3]
        if np.shape(reward) != () or dtype_kind(np.asarray(reward).dtype) not in ("float", "integer"):
            problems.append(f"reward must be a numeric scalar, got shape {np.shape(reward)} dtype {np.asarray(reward).dtype}")
        if np.shape(terminated) != () or np.asarray(terminated).dtype != bool:
            problems.append(f"terminated must be a bool scalar, got shape {np.shape(terminated)} dtype {np.asarray(terminated).dtype}")
        if jax.tree_util.tree_structure(out[1]) != jax.tree_util.tree_structure(state):
            problems.append("step returned a state with a different structure than reset's")
        return problems


@contextmanager
def _float64():
    """JAX's 64-bit floats for the block. jax 0.10.2 keeps nested jits (jnp.tril's, inside MJX's RK4)
    cached across the switch and then fails to lower them in the other mode, so the in-memory caches
    are cleared at both ends (the persistent compilation cache keeps the compiled programs)."""
    jax.clear_caches()
    try:
        with jax.enable_x64(True):
            yield
    finally:
        jax.clear_caches()


class Float64Twin:
    """A float32 JAX backend's twin: the same program built and run under JAX's 64-bit floats. Its
    reference computes in float64 (C MuJoCo for mjx), so the verifier can judge the algorithm on the
    twin at the strict tolerances and measure the float32 backend's departure from it as rounding.
    Every call switches JAX's mode and retraces: call it with whole batches."""

    def __init__(self, load):
        """`load()`: the backend's FunctionalBackend, built here under x64 (its constants and
        templates take float64)."""
        with _float64():
            self._inner = JaxBatched(load())
        self.name = self._inner.name + " (float64 twin)"

    def __getattr__(self, name):  # sync functions, field declarations, source hash: the backend's own
        return getattr(self._inner, name)

    def reset(self, seeds):
        with _float64():
            return self._inner.reset(seeds)

    def step(self, seeds, state, actions):
        with _float64():
            return self._inner.step(seeds, state, actions)

    def rollout(self, seeds, state, actions):
        with _float64():
            return self._inner.rollout(seeds, state, actions)

    def protocol_problems(self, obs_space: gym.Space, action_space: gym.Space) -> list[str]:
        with _float64():
            return self._inner.protocol_problems(obs_space, action_space)
