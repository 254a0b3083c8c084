"""envs_fast: fast vectorised backends of gymnasium environments, their verification and benchmark.

- `make_vec_env(spec, env_id, num_envs, seed)`: any backend as a `gymnasium.vector.VectorEnv`.
- `best_verified_vec_env(env_id, num_envs, seed)`: the fastest backend with a cached passing verdict.
- `python -m envs_fast.verify ...`, `python -m envs_fast.bench ...` (also via `python -m orchestrator`).
See README.md in this directory for the backend protocol.
"""
from __future__ import annotations

from pathlib import Path

from envs_fast.backend import BackendError, slug, translation_path

__all__ = ["BackendError", "slug", "make_vec_env", "best_verified_vec_env", "translation_path", "supported_specs"]


def make_vec_env(spec: str, env_id: str, num_envs: int, seed: int | None = None, root: str | Path | None = None):
    """A `gymnasium.vector.VectorEnv` over the backend SPEC: a translation file path, "jax" or
    "translation" (meaning `envs_fast/<slug>.py`), "envpool", "gymnax" or "reference"."""
    from envs_fast.backend import check_env_id, load_functional

    check_env_id(env_id)
    if spec == "envpool":
        from envs_fast.envpool_backend import EnvpoolVectorEnv, envpool_supports

        if not envpool_supports(env_id):
            raise BackendError(f"envpool does not support {env_id!r}")
        return EnvpoolVectorEnv(env_id, num_envs, seed)
    if spec == "reference":
        import gymnasium as gym

        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
        if seed is not None:
            env.action_space.seed(seed)
        return env
    from envs_fast.vector import JaxVectorEnv

    return JaxVectorEnv(load_functional(spec, env_id, root), num_envs, seed)


def supported_specs(env_id: str, root: str | Path | None = None) -> list[str]:
    """Backends that exist for `env_id`, fastest kind first: the translation, gymnax, envpool."""
    from envs_fast.gymnax_backend import gymnax_supports

    specs = []
    path = translation_path(env_id, root)
    if path.is_file():
        specs.append(str(path))
    if gymnax_supports(env_id):
        specs.append("gymnax")
    try:
        from envs_fast.envpool_backend import envpool_supports

        if envpool_supports(env_id):
            specs.append("envpool")
    except ImportError:
        pass
    return specs


def best_verified_vec_env(env_id: str, num_envs: int, seed: int | None = None, root: str | Path | None = None):
    """The fastest backend whose passing verdict is cached for its current content, or None.

    Speed is the adapter SPS cached by `bench` at the nearest num_envs; backends never benchmarked
    keep the default order (translation, gymnax, envpool). Nothing is verified here: only cached
    verdicts count, so this is cheap enough to call when every training run starts.
    """
    from envs_fast import cache

    verified = []
    for order, spec in enumerate(supported_specs(env_id, root)):
        verdict = cache.cached_verdict(spec, env_id)
        if verdict and verdict.get("passed"):
            sps = cache.cached_throughput(spec, env_id, num_envs)
            verified.append((-(sps or 0.0), order, spec))
    if not verified:
        return None
    _, _, spec = min(verified)
    return make_vec_env(spec, env_id, num_envs, seed, root)
