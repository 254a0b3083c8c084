"""Backends: what a `--backend SPEC` names, loaded into one functional shape.

A functional backend is ONE environment as pure JAX functions (see README.md, "The protocol"):
`reset(key) -> (obs, state)`, `step(key, state, action) -> (obs, state, reward, terminated)`,
optionally `state_from_reference(env)` / `state_to_reference(state, env)` for step-by-step checks.
Vector backends (envpool, the gymnasium reference) are `gymnasium.vector.VectorEnv`s instead.
"""
from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

PACKAGE_DIR = Path(__file__).resolve().parent
PROTOCOL_FUNCTIONS = ("reset", "step", "state_from_reference", "state_to_reference")
VECTOR_SPECS = ("envpool", "reference")
TRANSLATION_ALIASES = ("jax", "translation")


class BackendError(ValueError):
    """Bad input: unknown env id or spec, a file that does not import, a protocol function missing."""


def slug(env_id: str) -> str:
    """`CartPole-v1` -> `cartpole_v1`: lowercased, each non-alphanumeric run replaced by `_`."""
    return re.sub(r"[^0-9a-z]+", "_", env_id.lower())


def translation_path(env_id: str, root: str | Path | None = None) -> Path:
    """Where the translation of `env_id` lives: `<root>/envs_fast/<slug>.py` (root: the repository)."""
    base = Path(root) / "envs_fast" if root is not None else PACKAGE_DIR
    return base / f"{slug(env_id)}.py"


@dataclass
class FunctionalBackend:
    name: str  # what the reports call it: a file path, or "gymnax"
    env_id: str
    reset: Callable[[Any], tuple[Any, Any]]
    step: Callable[[Any, Any, Any], tuple[Any, Any, Any, Any]]
    state_from_reference: Callable[[Any], Any] | None = None
    state_to_reference: Callable[[Any, Any], None] | None = None
    source_hash: str = ""

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


def file_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load_translation(path: str | Path, env_id: str | None = None) -> FunctionalBackend:
    """Import a translation file under a fresh module name and check it follows the protocol."""
    path = Path(path)
    if not path.is_file():
        raise BackendError(f"translation file {str(path)!r} does not exist")
    module_name = f"_envs_fast_translation_{slug(path.stem)}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise BackendError(f"{path}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses/NamedTuples look their module up here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise BackendError(f"{path}: import failed: {type(exc).__name__}: {exc}") from None
    missing = [name for name in ("ENV_ID",) + PROTOCOL_FUNCTIONS if not hasattr(module, name)]
    if missing:
        raise BackendError(f"{path}: protocol incomplete, missing {', '.join(missing)}")
    not_callable = [name for name in PROTOCOL_FUNCTIONS if not callable(getattr(module, name))]
    if not_callable:
        raise BackendError(f"{path}: not callable: {', '.join(not_callable)}")
    if env_id is not None and module.ENV_ID != env_id:
        raise BackendError(f"{path}: ENV_ID is {module.ENV_ID!r}, expected {env_id!r}")
    return FunctionalBackend(
        name=str(path),
        env_id=module.ENV_ID,
        reset=module.reset,
        step=module.step,
        state_from_reference=module.state_from_reference,
        state_to_reference=module.state_to_reference,
        source_hash=file_hash(path),
    )


def resolve_spec(spec: str, env_id: str, root: str | Path | None = None) -> str:
    """Normalise a SPEC: "jax"/"translation" become the translation file's path."""
    if spec in TRANSLATION_ALIASES:
        return str(translation_path(env_id, root))
    return spec


def is_file_spec(spec: str) -> bool:
    return spec not in VECTOR_SPECS + ("gymnax",) + TRANSLATION_ALIASES


def load_functional(spec: str, env_id: str, root: str | Path | None = None) -> FunctionalBackend:
    """A functional backend for SPEC (a translation path, "jax"/"translation", or "gymnax")."""
    check_env_id(env_id)
    spec = resolve_spec(spec, env_id, root)
    if spec == "gymnax":
        from envs_fast.gymnax_backend import load_gymnax

        return load_gymnax(env_id)
    if spec in VECTOR_SPECS:
        raise BackendError(f"{spec!r} is a vector backend, not a functional one")
    return load_translation(spec, env_id)
