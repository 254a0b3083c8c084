"""Rust translations: ONE std-only source file `envs_fast/translations/<slug>.rs` per environment, compiled with
rustc into a shared library and stepped through ctypes, a whole batch of envs per C call.

The C ABI, version 1 (the worked examples `cartpole_v1.rs` and `acrobot_v1.rs` follow it exactly):

    autorl_abi_version() -> u32                    // 1
    autorl_env_id() -> *const c_char               // NUL-terminated static, e.g. b"CartPole-v1\\0"
    autorl_state_fields() -> *const c_char         // comma-separated names of the per-env state,
                                                   //   e.g. "x,x_dot,theta,theta_dot"
    autorl_state_size() -> usize                   // f64 per env state
    autorl_obs_size() -> usize                     // f32 per env observation, flattened (a Discrete
                                                   //   leaf counts 1: its value, not a one-hot)
    autorl_action_size() -> usize                  // f64 per env action (1 for Discrete)
    autorl_reset(n: usize, seeds: *const u64, state: *mut f64, obs: *mut f32)
    autorl_step(n: usize, seeds: *const u64, resets: *const u8, state: *mut f64, actions: *const f64,
                obs: *mut f32, reward: *mut f64, terminated: *mut u8)
      // env i: if resets[i] != 0, reset it from seeds[i] (reward 0, terminated 0: gymnasium's
      // NEXT_STEP autoreset step); else step it with actions[i*action_size..] (seeds[i] feeds any
      // randomness of the step). state is read and written in place; terminated is 0 or 1.

Arrays are C-contiguous, env-major (env i's state is state[i*state_size .. (i+1)*state_size]).
The state is float64 like the reference (gymnasium's classic control computes in float64), so a
synced state steps to within ~1e-12 of the reference. Large batches may be stepped on several
threads (`std::thread::scope`); results must not depend on the split.

State sync (required, like a JAX translation's): `envs_fast/translations/<slug>_sync.py` next to the source defines
`state_from_reference(env)` (the state as numbers in the order of `autorl_state_fields`) and
`state_to_reference(state, env)` (state indexable in that order). Without it `load_rust` refuses the
translation ("protocol incomplete", the verifier's exit 2): only a synced state lets L2 compare single
steps, and return distributions alone let wrong physics through (TAU 0.021 for 0.02 passes their TOST).

`load_rust(path, env_id)` gives a `RustBackend` (the verifier's `protocol.BatchedBackend`). Building
the library is build.py's; the training adapter, a gymnasium VectorEnv with the semantics of
`backends.jax_vector.JaxVectorEnv` (NEXT_STEP autoreset, the registered time limit), is vector.py's
`make_rust_vec_env(path, env_id, num_envs, seed)`.
"""
from __future__ import annotations

import collections
import ctypes
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from envs_fast.protocol import (SIGNATURE_PROBLEM, BackendError, check_env_id, file_hash, import_file, slug, space_leaves,
                                sync_companion)
from envs_fast.rust.build import build

ABI_VERSION = 1

_p = ctypes.c_void_p
_ABI_SIGNATURES = {  # name: (restype, argtypes)
    "autorl_abi_version": (ctypes.c_uint32, []),
    "autorl_env_id": (ctypes.c_char_p, []),
    "autorl_state_fields": (ctypes.c_char_p, []),
    "autorl_state_size": (ctypes.c_size_t, []),
    "autorl_obs_size": (ctypes.c_size_t, []),
    "autorl_action_size": (ctypes.c_size_t, []),
    "autorl_reset": (None, [ctypes.c_size_t, _p, _p, _p]),
    "autorl_step": (None, [ctypes.c_size_t, _p, _p, _p, _p, _p, _p, _p]),
}


# ---------------------------------------------------------------- loading

def load_rust(path: str | Path, env_id: str | None = None) -> "RustBackend":
    """Build (or reuse) and load the Rust translation `path`, check its ABI, and load its state-sync
    companion `<stem>_sync.py`. BackendError on a mismatch or a missing companion, BuildError if it
    does not compile."""
    path = Path(path)
    if not path.is_file():
        raise BackendError(f"Rust source {str(path)!r} does not exist")
    companion = _load_companion(path)  # before building: an incomplete protocol is bad input, whatever rustc says
    library = ctypes.CDLL(str(build(path)))
    missing = [name for name in _ABI_SIGNATURES if not hasattr(library, name)]
    if missing:
        raise BackendError(f"{path}: the library does not export {', '.join(missing)} (the C ABI is in "
                           "envs_fast/rust/backend.py; each needs #[no_mangle] pub extern \"C\")")
    for name, (restype, argtypes) in _ABI_SIGNATURES.items():
        function = getattr(library, name)
        function.restype, function.argtypes = restype, argtypes
    version = library.autorl_abi_version()
    if version != ABI_VERSION:
        raise BackendError(f"{path}: autorl_abi_version() is {version}, expected {ABI_VERSION}")
    own_id = (library.autorl_env_id() or b"").decode()
    if env_id is not None and own_id != env_id:
        raise BackendError(f"{path}: ENV_ID is {own_id!r}, expected {env_id!r}")
    check_env_id(own_id)
    return RustBackend(path, library, companion)


SYNC_FUNCTIONS = ("state_from_reference(env)", "state_to_reference(state, env)")


def _load_companion(path: Path):
    """The `<stem>_sync.py` module next to `path`, imported under a fresh name. BackendError
    ("protocol incomplete", worded like a JAX translation's) when it or one of its functions is missing."""
    companion = sync_companion(path)
    if not companion.is_file():
        raise BackendError(f"{path}: protocol incomplete, missing its state-sync companion {companion}, which must "
                           f"define {' and '.join(SYNC_FUNCTIONS)} over the state in the order of autorl_state_fields")
    module = import_file(companion, "_envs_fast_rust_sync")
    missing = [name for name in SYNC_FUNCTIONS if not callable(getattr(module, name.split("(")[0], None))]
    if missing:
        raise BackendError(f"{companion}: protocol incomplete, missing {', '.join(missing)} (the state sync of {path.name})")
    return module


# ---------------------------------------------------------------- spaces <-> flat buffers

def value_count(space: gym.Space) -> int | None:
    """How many numbers one value of `space` is in the ABI's flat buffers (a Discrete is 1 number,
    not gymnasium's one-hot flatdim); None for spaces the ABI cannot express."""
    total = 0
    for leaf in space_leaves(space):
        if isinstance(leaf, gym.spaces.Discrete):
            total += 1
        elif isinstance(leaf, (gym.spaces.Box, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
            total += int(np.prod(leaf.shape))
        else:
            return None
    return total


def _unflatten(space: gym.Space, flat: np.ndarray, offset: int = 0) -> tuple[Any, int]:
    """A batch of values of `space` from the columns of `flat` (n, d) starting at `offset`."""
    if isinstance(space, gym.spaces.Tuple):
        values = []
        for sub in space.spaces:
            value, offset = _unflatten(sub, flat, offset)
            values.append(value)
        return tuple(values), offset
    if isinstance(space, gym.spaces.Dict):
        values = {}
        for key in sorted(space.spaces):  # the order of protocol.space_leaves
            values[key], offset = _unflatten(space.spaces[key], flat, offset)
        return values, offset
    size = value_count(space)
    part = flat[:, offset:offset + size]
    if np.issubdtype(space.dtype, np.integer) or space.dtype == bool:
        part = np.rint(part)
    return part.reshape((flat.shape[0],) + space.shape).astype(space.dtype), offset + size


def _flatten(space: gym.Space, batch, n: int) -> list[np.ndarray]:
    """A batch of values of `space` as (n, k) float64 blocks in the order of protocol.space_leaves."""
    if isinstance(space, gym.spaces.Tuple):
        return [block for sub, value in zip(space.spaces, batch) for block in _flatten(sub, value, n)]
    if isinstance(space, gym.spaces.Dict):
        return [block for key in sorted(space.spaces) for block in _flatten(space.spaces[key], batch[key], n)]
    return [np.asarray(batch, dtype=np.float64).reshape(n, -1)]


def _state_type(env_id: str, names: list[str], size: int):
    """The NamedTuple of one env's state, fields named by autorl_state_fields. Names that cannot be
    fields (protocol_problems reports them) fall back to s0, s1, ..."""
    usable = (len(names) == size and len(set(names)) == size
              and all(name.isidentifier() and not name.startswith("_") for name in names))
    fields = names if usable else [f"s{i}" for i in range(size)]
    return collections.namedtuple(f"{slug(env_id).title().replace('_', '')}State", fields)


class RustBackend:
    """A compiled Rust translation as a `protocol.BatchedBackend`: every call is one C call over the
    batch (rollout: one per step). States are NamedTuples of float64 fields (batched: (n,) arrays)."""

    def __init__(self, path: Path, library: ctypes.CDLL, sync_module):
        self.name = str(path)
        self.library = library
        self.env_id = library.autorl_env_id().decode()
        self.source_hash = file_hash(path)
        self.state_size = int(library.autorl_state_size())
        self.obs_size = int(library.autorl_obs_size())
        self.action_size = int(library.autorl_action_size())
        self.state_fields = [name.strip() for name in (library.autorl_state_fields() or b"").decode().split(",")]
        self.State = _state_type(self.env_id, self.state_fields, self.state_size)
        reference = gym.make(self.env_id)
        self.observation_space, self.action_space = reference.observation_space, reference.action_space
        reference.close()
        self._sync = sync_module  # the `<stem>_sync.py` module (load_rust requires it)
        # State fields the reference derives itself and state_to_reference cannot write (a physics
        # engine's contacts, solver impulses, broad-phase): the sync round trip does not compare them.
        self.read_only_fields = tuple(getattr(sync_module, "READ_ONLY_FIELDS", ()))
        # State fields the reference does not expose at all (the sync reads a constant): L2 does not
        # compare them after a step.
        self.unreadable_fields = tuple(getattr(sync_module, "UNREADABLE_FIELDS", ()))
        self.state_from_reference = self._state_from_reference
        self.state_to_reference = self._state_to_reference

    @property
    def syncs_state(self) -> bool:
        return True

    # -- state sync (single env: NamedTuple of np.float64 scalars)
    def _state_from_reference(self, env):
        values = [np.float64(v) for v in self._sync.state_from_reference(env)]
        if len(values) != self.state_size:
            raise ValueError(f"state_from_reference returned {len(values)} numbers; autorl_state_size() is {self.state_size}")
        return self.State(*values)

    def _state_to_reference(self, state, env) -> None:
        self._sync.state_to_reference(state, env)

    # -- batches
    def _state_array(self, state, n: int) -> np.ndarray:
        """(n, state_size) float64, a fresh C-contiguous array (the C call writes it in place)."""
        columns = [np.asarray(v, dtype=np.float64).reshape(-1) for v in state]
        if len(columns) != self.state_size or any(len(c) != n for c in columns):
            raise ValueError(f"expected a state of {self.state_size} fields of {n} values each")
        return np.stack(columns, axis=1)

    def _batched_state(self, array: np.ndarray):
        return self.State(*np.ascontiguousarray(array.T))

    def _action_array(self, actions, n: int) -> np.ndarray:
        blocks = _flatten(self.action_space, actions, n)
        array = np.ascontiguousarray(blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=1))
        if array.shape != (n, self.action_size):
            raise ValueError(f"actions give {array.shape[1]} numbers per env; autorl_action_size() is {self.action_size}")
        return array

    def observations(self, flat: np.ndarray):
        """Flat (n, obs_size) float32 observations in the reference space's structure and dtypes."""
        if flat.shape[1] != value_count(self.observation_space):
            raise ValueError(f"autorl_obs_size() is {flat.shape[1]}, the observation space "
                             f"{self.observation_space} has {value_count(self.observation_space)} numbers")
        return _unflatten(self.observation_space, flat)[0]

    def _seeds(self, seeds) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(seeds).reshape(-1).astype(np.uint64))

    def _call_step(self, seeds64, resets, state, actions):
        n = len(seeds64)
        obs = np.empty((n, self.obs_size), np.float32)
        reward = np.empty(n, np.float64)
        terminated = np.empty(n, np.uint8)
        self.library.autorl_step(n, seeds64.ctypes.data, resets.ctypes.data, state.ctypes.data,
                                 actions.ctypes.data, obs.ctypes.data, reward.ctypes.data, terminated.ctypes.data)
        return obs, reward, terminated != 0

    def reset(self, seeds):
        seeds64 = self._seeds(seeds)
        n = len(seeds64)
        state = np.empty((n, self.state_size), np.float64)
        obs = np.empty((n, self.obs_size), np.float32)
        self.library.autorl_reset(n, seeds64.ctypes.data, state.ctypes.data, obs.ctypes.data)
        return self.observations(obs), self._batched_state(state)

    def step(self, seeds, state, actions):
        seeds64 = self._seeds(seeds)
        n = len(seeds64)
        array = self._state_array(state, n)
        obs, reward, terminated = self._call_step(seeds64, np.zeros(n, np.uint8), array, self._action_array(actions, n))
        return self.observations(obs), self._batched_state(array), reward, terminated

    def rollout(self, seeds, state, actions):
        """T steps (actions: (n, T, ...)); step t's seeds are (seed << 32) | (t + 1), so they never
        coincide with the reset seeds of the same batch."""
        seeds64 = self._seeds(seeds)
        n = len(seeds64)
        actions = np.asarray(actions)
        steps = actions.shape[1]
        array = self._state_array(state, n)
        no_resets = np.zeros(n, np.uint8)
        obs = np.empty((n, steps, self.obs_size), np.float64)
        reward = np.empty((n, steps), np.float64)
        terminated = np.empty((n, steps), bool)
        for t in range(steps):
            step_seeds = (seeds64 << np.uint64(32)) | np.uint64(t + 1)
            obs[:, t], reward[:, t], terminated[:, t] = self._call_step(
                step_seeds, no_resets, array, self._action_array(actions[:, t], n))
        return obs, reward, terminated

    def protocol_problems(self, obs_space: gym.Space, action_space: gym.Space) -> list[str]:
        problems = []
        obs_count, action_count = value_count(obs_space), value_count(action_space)
        if obs_count is None:
            problems.append(f"the observation space {obs_space} has parts the Rust ABI cannot express "
                            "(Box, Discrete, MultiDiscrete, MultiBinary and Tuple/Dict of them only)")
        elif self.obs_size != obs_count:
            problems.append(f"autorl_obs_size() is {self.obs_size}, but an observation of {obs_space} is "
                            f"{obs_count} numbers (flattened; a Discrete counts 1)")
        if action_count is None:
            problems.append(f"{SIGNATURE_PROBLEM}the action space {action_space} has parts the Rust ABI cannot express")
        elif self.action_size != action_count:
            problems.append(f"{SIGNATURE_PROBLEM}autorl_action_size() is {self.action_size}, but an action of "
                            f"{action_space} is {action_count} numbers (a Discrete counts 1)")
        names = self.state_fields
        if len(names) != self.state_size:
            problems.append(f"{SIGNATURE_PROBLEM}autorl_state_fields() names {len(names)} fields "
                            f"({','.join(names)}), but autorl_state_size() is {self.state_size}")
        if any(not name for name in names):
            problems.append(f"{SIGNATURE_PROBLEM}autorl_state_fields() has an empty name: {','.join(names)!r}")
        duplicates = sorted({name for name in names if name and names.count(name) > 1})
        if duplicates:
            problems.append(f"{SIGNATURE_PROBLEM}autorl_state_fields() repeats {', '.join(duplicates)}")
        odd = [name for name in names if name and (not name.isidentifier() or name.startswith("_"))]
        if odd:
            problems.append(f"{SIGNATURE_PROBLEM}state field names must be identifiers not starting with '_': {', '.join(odd)}")
        return problems
