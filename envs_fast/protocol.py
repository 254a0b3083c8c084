"""The backend protocol's vocabulary: names, paths and types that every other envs_fast module shares.

A functional backend is ONE environment as pure JAX functions (see README.md, "The protocol"):
`reset(key) -> (obs, state)`, `step(key, state, action) -> (obs, state, reward, terminated)`,
and `state_from_reference(env)` / `state_to_reference(state, env)` for step-by-step checks (required
of every translation, JAX or Rust; only third-party adapters such as gymnax lack them).
Vector backends (envpool, the gymnasium reference) are `gymnasium.vector.VectorEnv`s instead.

This module imports nothing else from envs_fast, so any module may import it (no import cycles):
loading a spec lives in `backends/load.py`, gymnax in `backends/gymnax_backend.py`, backend choice in `__init__.py`.
"""
from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

PACKAGE_DIR = Path(__file__).resolve().parent
PROTOCOL_FUNCTIONS = ("reset", "step", "state_from_reference", "state_to_reference")
VECTOR_SPECS = ("envpool", "reference")
# Backends on the reference's engine (its own, batched: envs_fast/mujoco/batch.py; or its JAX port MJX:
# envs_fast/mujoco/mjx.py), with the env's Python translated and state synced, so verified step by step
# like a translation though no file of the env's is theirs
ENGINE_SPECS = ("mujoco_batch", "mjx")
TRANSLATION_ALIASES = ("jax", "translation")
# where verdicts, throughput figures and built Rust libraries are kept (cache.py, rust/build.py)
CACHE_ENV_VAR = "AUTORL_VERIFY_CACHE"


def cache_dir() -> Path:
    """$AUTORL_VERIFY_CACHE, else the main checkout's .envs_fast_cache (shared by its worktrees)."""
    configured = os.environ.get(CACHE_ENV_VAR)
    return Path(configured) if configured else main_checkout(PACKAGE_DIR.parent) / ".envs_fast_cache"


def main_checkout(root: Path) -> Path:
    """The main checkout when `root` is a git worktree (runs/<tag>/), so a run's train process finds
    the verdicts the daemon stored; records are keyed by content, so sharing them is safe."""
    marker = root / ".git"
    if marker.is_file():
        text = marker.read_text().strip()
        if text.startswith("gitdir:"):
            gitdir = Path(text.split(":", 1)[1].strip())
            gitdir = gitdir if gitdir.is_absolute() else (root / gitdir).resolve()
            if gitdir.parent.name == "worktrees":
                return gitdir.parent.parent.parent
    return root


class BackendError(ValueError):
    """Bad input: unknown env id or spec, a file that does not import, a protocol function missing."""


class BuildError(BackendError):
    """A translation's source does not compile (Rust): the message is the compiler's. `verify` reports
    it as a failed verification (exit 1, the compiler's message in the report), not as bad input."""


def slug(env_id: str) -> str:
    """`CartPole-v1` -> `cartpole_v1`: lowercased, each non-alphanumeric run replaced by `_`."""
    return re.sub(r"[^0-9a-z]+", "_", env_id.lower())


TRANSLATION_SUFFIXES = {"jax": ".py", "rust": ".rs"}
TRANSLATIONS_DIR = "translations"   # envs_fast/translations/: one env's files together, apart from the machinery


def translation_path(env_id: str, root: str | Path | None = None, lang: str = "jax") -> Path:
    """Where the translation of `env_id` in `lang` ("jax" or "rust") lives: `<root>/envs_fast/translations/<slug>.py`
    or `.rs` (root: the repository)."""
    base = Path(root) / "envs_fast" if root is not None else PACKAGE_DIR
    return base / TRANSLATIONS_DIR / f"{slug(env_id)}{TRANSLATION_SUFFIXES[lang]}"


@dataclass
class FunctionalBackend:
    name: str  # what the reports call it: a file path, or "gymnax"
    env_id: str
    reset: Callable[[Any], tuple[Any, Any]]
    step: Callable[[Any, Any, Any], tuple[Any, Any, Any, Any]]
    state_from_reference: Callable[[Any], Any] | None = None
    state_to_reference: Callable[[Any, Any], None] | None = None
    source_hash: str = ""
    # State fields the reference derives itself (state_to_reference cannot write them: the sync round
    # trip skips them) and fields it does not expose (L2 does not compare them), named as
    # probes.field_names names the state's elements without the leading dot; as a Rust companion declares.
    read_only_fields: tuple = ()
    unreadable_fields: tuple = ()

    @property
    def syncs_state(self) -> bool:
        return self.state_from_reference is not None and self.state_to_reference is not None


def check_env_id(env_id: str):
    """The registered gymnasium spec of `env_id`, or a clear BackendError."""
    import gymnasium as gym

    try:
        return gym.spec(env_id)
    except Exception as exc:  # gymnasium raises several error types for unknown/deprecated ids
        raise BackendError(f"unknown environment id {env_id!r}: {exc}") from None


def import_file(path: str | Path, prefix: str):
    """Import the Python file `path` under a fresh module name starting with `prefix`, registered in
    sys.modules (dataclasses and NamedTuples look their module up there). BackendError when it
    cannot be imported, with the reason."""
    import importlib.util
    import sys
    import uuid

    path = Path(path)
    module_name = f"{prefix}_{slug(path.stem)}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise BackendError(f"{path}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise BackendError(f"{path}: import failed: {type(exc).__name__}: {exc}") from None
    return module


def file_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def resolve_spec(spec: str, env_id: str, root: str | Path | None = None) -> str:
    """Normalise a SPEC: "jax"/"translation" become the translation file's path, "rust" the Rust one's."""
    if spec in TRANSLATION_ALIASES:
        return str(translation_path(env_id, root))
    if spec == "rust":
        return str(translation_path(env_id, root, lang="rust"))
    return spec


def is_file_spec(spec: str) -> bool:
    return spec not in VECTOR_SPECS + ENGINE_SPECS + ("gymnax", "rust") + TRANSLATION_ALIASES


def space_leaves(space) -> list:
    """The leaf spaces of a (possibly nested Tuple/Dict) gymnasium space, Dict keys sorted."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Tuple):
        return [leaf for s in space.spaces for leaf in space_leaves(s)]
    if isinstance(space, gym.spaces.Dict):
        return [leaf for key in sorted(space.spaces) for leaf in space_leaves(space.spaces[key])]
    return [space]


def dtype_kind(dtype) -> str:
    """"bool", "integer" or "float" (else the dtype's name): what observations must agree on."""
    import numpy as np

    dtype = np.dtype(dtype)
    return "bool" if dtype == bool else "integer" if np.issubdtype(dtype, np.integer) else \
        "float" if np.issubdtype(dtype, np.floating) else str(dtype)


RUST_SUFFIX = ".rs"


def is_rust_spec(spec: str) -> bool:
    """A Rust translation: the spec is a `.rs` source file (see rust/backend.py)."""
    return str(spec).endswith(RUST_SUFFIX)


def sync_companion(rust_path: str | Path) -> Path:
    """The Python file next to a Rust translation that syncs its state with the reference (required:
    without it the translation is refused): `envs_fast/translations/<slug>.rs` -> `envs_fast/translations/<slug>_sync.py`."""
    path = Path(rust_path)
    return path.with_name(path.stem + "_sync.py")


def translation_files(spec: str) -> list[str]:
    """The files a translation spec runs: the translation and its `<slug>_sync.py` companion, which a
    Rust translation requires and a JAX one may import (the BipedalWalker JAX port shares its Rust
    twin's state layout). They travel together (setup's snapshot, a Modal container) and decide a
    verdict together; a JAX translation without a companion is the file alone."""
    return [str(spec), sync_companion(spec).as_posix()]


# A `protocol_problems` entry starting with this is reported as L1's "step signature" check (the
# prefix stripped); every other entry goes to "shapes and dtypes".
SIGNATURE_PROBLEM = "step signature: "


class BatchedBackend(Protocol):
    """What the verifier drives: a backend that steps batches of envs given as numpy arrays.

    Both backend kinds that can sync state with the reference implement it: a JAX translation
    (`jit(vmap(...))` over its functional protocol) and a Rust translation (one C call per batch).
    Batched pytrees have a leading axis of n envs; a single env's state (what
    `state_from_reference` returns) is the same pytree without that axis, with numpy leaves.
    Seeds are uint32 arrays of shape (n,): the same seed gives the same reset and the same step.
    No autoreset and no time limit here: that is the VectorEnv adapter's job.
    """
    name: str
    env_id: str
    source_hash: str
    state_from_reference: Callable[[Any], Any] | None
    state_to_reference: Callable[[Any, Any], None] | None

    @property
    def syncs_state(self) -> bool: ...

    def reset(self, seeds) -> tuple[Any, Any]:
        """(obs, state) for n envs, each reset from its seed."""

    def step(self, seeds, state, actions) -> tuple[Any, Any, Any, Any]:
        """(obs, next state, reward (n,) float, terminated (n,) bool) of one step of every env."""

    def rollout(self, seeds, state, actions) -> tuple[Any, Any, Any]:
        """T steps from `state` with actions of shape (n, T, ...): (flat float64 obs (n, T, d),
        reward (n, T), terminated (n, T)); steps after a termination are computed anyway."""

    def protocol_problems(self, obs_space, action_space) -> list[str]:
        """What in the backend's own declarations contradicts the reference spaces (L1 'shapes and
        dtypes'); empty when nothing does."""
