"""Backends: what a `--backend SPEC` names, loaded into one functional shape (`FunctionalBackend`),
or, for the verifier, into a `BatchedBackend` (`load_batched`: JAX or Rust).

The protocol's names and types live in `protocol.py` (re-exported here for older importers);
this module loads a spec: a translation file, or gymnax through `gymnax_backend.py`.
"""
from __future__ import annotations

from pathlib import Path

from envs_fast.backends.gymnax_backend import load_gymnax
from envs_fast.protocol import (ENGINE_SPECS, PACKAGE_DIR, PROTOCOL_FUNCTIONS, TRANSLATION_ALIASES, VECTOR_SPECS,  # noqa: F401
                                BackendError, BatchedBackend, FunctionalBackend, check_env_id, file_hash, import_file,
                                is_file_spec, is_rust_spec, resolve_spec, slug, translation_path)


def load_translation(path: str | Path, env_id: str | None = None) -> FunctionalBackend:
    """Import a translation file under a fresh module name and check it follows the protocol."""
    path = Path(path)
    if not path.is_file():
        raise BackendError(f"translation file {str(path)!r} does not exist")
    module = import_file(path, "_envs_fast_translation")
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
        read_only_fields=tuple(getattr(module, "READ_ONLY_FIELDS", ())),
        unreadable_fields=tuple(getattr(module, "UNREADABLE_FIELDS", ())),
    )


def load_functional(spec: str, env_id: str, root: str | Path | None = None,
                    verified_only: bool | None = None) -> FunctionalBackend:
    """A functional backend for SPEC (a translation path, "jax"/"translation", "gymnax" or "mjx").

    verified_only (default: in a training run, see `envs_fast.gate.in_training_run`): refuse, with a
    BackendError saying why, a backend that `envs_fast.gate.training_refusal` refuses."""
    from envs_fast.gate import in_training_run, training_refusal

    check_env_id(env_id)
    spec = resolve_spec(spec, env_id, root)
    if in_training_run() if verified_only is None else verified_only:
        refusal = training_refusal(spec, env_id, root)
        if refusal:
            raise BackendError(f"not loaded for training: {refusal}")
    if spec == "gymnax":
        return load_gymnax(env_id)
    if spec == "mjx":  # the env's Python over MJX, MuJoCo's JAX port
        from envs_fast.mujoco.mjx import load_mjx

        return load_mjx(env_id)
    if spec in VECTOR_SPECS + ENGINE_SPECS:
        raise BackendError(f"{spec!r} is a vector backend, not a functional one")
    return load_translation(spec, env_id)


def load_batched(spec: str, env_id: str, root: str | Path | None = None) -> BatchedBackend | None:
    """The backend SPEC as the verifier drives it: None for the vector-only specs (envpool, reference),
    mujoco_batch's MujocoBatchBackend, mjx's functional backend under JaxBatched, a Rust translation for a `.rs` file (may raise BuildError), else a
    functional JAX backend."""
    check_env_id(env_id)
    spec = resolve_spec(spec, env_id, root)
    if spec in VECTOR_SPECS:
        return None
    if spec == "mjx":  # functional JAX over MJX: driven like a JAX translation
        from envs_fast.backends.jax_batched import JaxBatched
        from envs_fast.mujoco.mjx import load_mjx

        return JaxBatched(load_mjx(env_id))
    if spec in ENGINE_SPECS:  # the env's Python over its own engine, batched (mujoco_batch)
        from envs_fast.mujoco.batch import load_mujoco_batch

        return load_mujoco_batch(env_id)
    if is_rust_spec(spec):
        try:  # lazy: only Rust specs need the toolchain
            from envs_fast.rust.backend import load_rust
        except ModuleNotFoundError as exc:
            if exc.name != "envs_fast.rust.backend":
                raise
            raise BackendError(f"{spec}: this checkout has no Rust backend (envs_fast/rust/backend.py)") from None
        return load_rust(spec, env_id)
    from envs_fast.backends.jax_batched import JaxBatched

    return JaxBatched(load_functional(spec, env_id, root, verified_only=False))  # the verifier loads what it verifies


def load_float64_twin(spec: str, env_id: str, root: str | Path | None = None):
    """The float64 twin of a float32 backend whose reference computes in float64 (mjx over C MuJoCo):
    the verifier judges the algorithm on it and the float32 rounding apart. None for other backends,
    which are compared as they are (a translation of float64 Python states its rounding itself)."""
    if resolve_spec(spec, env_id, root) != "mjx":
        return None
    from envs_fast.mujoco import mjx as mjx_backend
    from envs_fast.backends.jax_batched import Float64Twin

    return Float64Twin(lambda: mjx_backend.load_mjx(env_id))  # looked up when called: a test may replace it
