"""Rust translations: ONE std-only source file `envs_fast/<slug>.rs` per environment, compiled with
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

State sync (required, like a JAX translation's): `envs_fast/<slug>_sync.py` next to the source defines
`state_from_reference(env)` (the state as numbers in the order of `autorl_state_fields`) and
`state_to_reference(state, env)` (state indexable in that order). Without it `load_rust` refuses the
translation ("protocol incomplete", the verifier's exit 2): only a synced state lets L2 compare single
steps, and return distributions alone let wrong physics through (TAU 0.021 for 0.02 passes their TOST).

`load_rust(path, env_id)` gives a `RustBackend` (the verifier's `protocol.BatchedBackend`);
`make_rust_vec_env(path, env_id, num_envs, seed)` the training adapter, a gymnasium VectorEnv with
the semantics of `vector.JaxVectorEnv` (NEXT_STEP autoreset, the registered time limit).
"""
from __future__ import annotations

import collections
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from envs_fast.cache import cache_dir
from envs_fast.adapter import TranslationVectorEnv
from envs_fast.protocol import (SIGNATURE_PROBLEM, BackendError, BuildError, check_env_id, file_hash, import_file, slug, space_leaves,
                                sync_companion)

ABI_VERSION = 1
# No -C target-cpu=native: a library cached (and shared between checkouts) must run on any host.
RUSTC_FLAGS = ("-O", "--edition", "2021", "--crate-type", "cdylib", "-C", "strip=debuginfo")
BUILD_TIMEOUT = 600  # seconds
ERROR_LINES = 60  # of rustc's stderr in a BuildError
NO_RUSTC = "rustc not found on PATH: Rust backends need the Rust toolchain (rustup.rs)"
# The compiler to use. The daemon sets it for the processes it walls in: their $HOME is empty, so
# rustup's proxy (~/.cargo/bin/rustc) is gone, but the toolchain's own binary still runs.
RUSTC_ENV = "AUTORL_RUSTC"

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


# ---------------------------------------------------------------- building

def rustc_path() -> str | None:
    """$AUTORL_RUSTC when it names a file, else the rustc on PATH, else None."""
    configured = os.environ.get(RUSTC_ENV)
    if configured and os.path.isfile(configured):
        return configured
    return shutil.which("rustc")


def rustc_available() -> bool:
    return rustc_path() is not None


def toolchain() -> tuple[Path, Path] | None:
    """(the toolchain's own rustc binary, its sysroot): what a walled-in process must be shown and
    told ($AUTORL_RUSTC) to build Rust backends. None without rustc."""
    rustc = rustc_path()
    if rustc is None:
        return None
    try:
        sysroot = Path(subprocess.run([rustc, "--print", "sysroot"], capture_output=True, text=True,
                                      check=True, timeout=60).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None
    binary = sysroot / "bin" / "rustc"
    return (binary if binary.is_file() else Path(rustc)), sysroot


def rustc_version() -> str:
    """`rustc --version` of the rustc in use, e.g. "rustc 1.95.0 (59807616e 2026-04-14)"."""
    rustc = rustc_path()
    if rustc is None:
        raise BackendError(NO_RUSTC)
    return _version_of(rustc)


@lru_cache(maxsize=None)
def _version_of(rustc: str) -> str:
    return subprocess.run([rustc, "--version"], capture_output=True, text=True, check=True).stdout.strip()


def library_path(path: str | Path) -> Path:
    """Where `build` puts the library of the source `path`: `cache_dir()/rust/<source hash>-<toolchain
    hash>/lib<slug>.so`. The toolchain hash covers `rustc --version` and the flags."""
    path = Path(path)
    source = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    toolchain = hashlib.sha256(" ".join((rustc_version(),) + RUSTC_FLAGS).encode()).hexdigest()[:8]
    return cache_dir() / "rust" / f"{source}-{toolchain}" / f"lib{slug(path.stem)}.so"


def build(path: str | Path) -> Path:
    """The compiled library of the Rust source `path`, from the cache when it was built before.
    BackendError without rustc or source; BuildError (rustc's message) when it does not compile."""
    path = Path(path)
    if not path.is_file():
        raise BackendError(f"Rust source {str(path)!r} does not exist")
    source = path.read_bytes()
    target = library_path(path)
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        writable = os.access(target.parent, os.W_OK)
    except OSError:
        writable = False
    if not writable:  # a training process reads the run's cache but may not write it: build privately
        target = Path(tempfile.gettempdir()) / "autorl-rust" / target.parent.name / target.name
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
    # Compile a copy of exactly the hashed bytes in a private directory, then move the library in
    # atomically: concurrent builders never see (or load) half a library.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as scratch:
        copy = Path(scratch) / path.name
        copy.write_bytes(source)
        output = Path(scratch) / target.name
        command = [rustc_path() or "rustc", *RUSTC_FLAGS, "--crate-name", f"autorl_{slug(path.stem)}",
                   "-o", str(output), str(copy)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise BuildError(f"{path}: rustc did not finish within {BUILD_TIMEOUT} s") from None
        if result.returncode != 0 or not output.is_file():
            message = compiler_message(result.stderr.replace(str(copy), str(path)))
            raise BuildError(f"{path} does not compile (rustc {' '.join(RUSTC_FLAGS)}):\n{message}")
        os.replace(output, target)
    return target


def compiler_message(stderr: str, max_lines: int = ERROR_LINES) -> str:
    """rustc's diagnostics with the errors first (warnings printed before them could push them out
    of view), cut to `max_lines` lines."""
    blocks: list[list[str]] = []
    for line in stderr.rstrip().splitlines():
        if not blocks or line.startswith(("error", "warning")):
            blocks.append([])
        blocks[-1].append(line)
    ordered = [b for b in blocks if b[0].startswith("error")] + [b for b in blocks if not b[0].startswith("error")]
    lines = [line for block in ordered for line in block]
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more lines)"]
    return "\n".join(lines)


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
                           "envs_fast/rust_backend.py; each needs #[no_mangle] pub extern \"C\")")
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


# ---------------------------------------------------------------- the training adapter

_STREAM_MULTIPLIER = 0x9E3779B97F4A7C15  # spreads the seed streams of different reset seeds apart


def _stream_start(seed: int) -> int:
    return (int(seed) * _STREAM_MULTIPLIER + 1) % 2**64


class RustVectorEnv(TranslationVectorEnv):
    """A Rust translation as a gymnasium VectorEnv, with the semantics of `vector.JaxVectorEnv`:
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
