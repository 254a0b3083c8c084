"""envs_fast: fast vectorised backends of gymnasium environments, their verification and benchmark.

- `make_vec_env(spec, env_id, num_envs, seed)`: any backend as a `gymnasium.vector.VectorEnv`.
- `choose_backend(env_id, num_envs)`: the spec of the fastest verified backend (what "auto" uses).
- `training_refusal(spec, env_id)`: why a training run may not use a backend (None: it may). In a
  training run ($AUTORL_OUTPUT_DIR set) `make_vec_env` and `backend.load_functional` apply it
  themselves, so a backend named by hand trains only once verified.
- `python -m envs_fast.verify ...`, `python -m envs_fast.bench ...` (also via `python -m orchestrator`).
See README.md in this directory for the backend protocol.
"""
from __future__ import annotations

import sys
from pathlib import Path

from envs_fast.gate import in_training_run, training_refusal
from envs_fast.protocol import BackendError, slug, translation_path

__all__ = ["BackendError", "slug", "make_vec_env", "choose_backend", "translation_path", "training_refusal",
           "in_training_run"]

def _gate(verified_only: bool | None) -> bool:
    return in_training_run() if verified_only is None else verified_only


def make_vec_env(spec: str, env_id: str, num_envs: int, seed: int | None = None, root: str | Path | None = None,
                 verified_only: bool | None = None):
    """A `gymnasium.vector.VectorEnv` over the backend SPEC: a translation file path (JAX `.py` or
    Rust `.rs`), "jax"/"translation" (`envs_fast/translations/<slug>.py`), "rust" (`envs_fast/translations/<slug>.rs`),
    "mujoco_batch" (gymnasium's MuJoCo v5 envs on mujoco.batch), "mjx" (the same envs on MJX, functional
    JAX), "envpool", "gymnax" or "reference".

    verified_only (default: in a training run): a backend `training_refusal` refuses is replaced by
    the reference, with a line on stderr saying why."""
    from envs_fast.backends.load import load_functional
    from envs_fast.protocol import check_env_id, is_rust_spec, resolve_spec

    check_env_id(env_id)
    spec = resolve_spec(spec, env_id, root)
    refusal = training_refusal(spec, env_id, root) if _gate(verified_only) else None
    if refusal:
        print(f"envs_fast.make_vec_env: {refusal}; stepping the reference instead", file=sys.stderr, flush=True)
        spec = "reference"
    if spec == "mujoco_batch":
        from envs_fast.mujoco.batch import make_mujoco_batch_vec_env

        return make_mujoco_batch_vec_env(env_id, num_envs, seed)
    if is_rust_spec(spec):
        from envs_fast.rust.vector import make_rust_vec_env

        return make_rust_vec_env(spec, env_id, num_envs, seed)
    if spec == "envpool":
        from envs_fast.backends.envpool_backend import EnvpoolVectorEnv, envpool_supports

        if not envpool_supports(env_id):
            raise BackendError(f"envpool does not support {env_id!r}")
        return EnvpoolVectorEnv(env_id, num_envs, seed)
    if spec == "reference":
        import gymnasium as gym

        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync")
        if seed is not None:
            env.action_space.seed(seed)
        return env
    from envs_fast.backends.jax_vector import JaxVectorEnv

    return JaxVectorEnv(load_functional(spec, env_id, root, verified_only=False), num_envs, seed)


def choose_backend(env_id: str, num_envs: int, root: str | Path | None = None, environment: dict | None = None) -> str:
    """Which backend is fastest for `env_id` at `num_envs` envs among those that may train: the spec
    `make_vec_env(backend="auto")` uses (a translation file path, "gymnax", "envpool" or "reference").

    Candidates, in the default order:
      1. the translations `<root>/envs_fast/translations/<slug>.py` (JAX) and `<root>/envs_fast/translations/<slug>.rs` (Rust;
         root: this repository), each if its cached verdict for its current content passes;
      2. "mujoco_batch" (envs_fast/mujoco/batch.py: the MuJoCo env's Python over the reference's own
         engine, batched), if it covers the env and its cached verdict passes;
      3. "mjx" (envs_fast/mujoco/mjx.py: the same envs on MJX, MuJoCo's JAX port, for GPUs), if it
         covers the env and its cached verdict passes;
      4. "gymnax", if gymnax has the env and its cached verdict passes;
      5. "envpool", if envpool is installed and has the env: trusted without a verdict (as the
         default backend it has always been), unless a cached verdict says it fails.
    The candidate with the highest training throughput (`train_sps`) cached by `bench` at the num_envs nearest to
    `num_envs` wins; one never benchmarked counts as slower than any benchmarked one, and ties (or
    no figures at all) keep the default order. A third-party backend (gymnax, envpool), verified only
    statistically, must be STATISTICAL_MARGIN times as fast as the fastest translation (verified
    state by state) to win over it. No candidate: "reference" (gymnasium's vector env).

    Nothing is verified or measured here, only cached records are read: cheap enough to call when
    every training run starts. Unknown env ids are not checked here (they have no candidates).
    `environment`: choose as a process there would (the daemon for its Modal containers).
    """
    return _fastest(env_id, num_envs, [translation_path(env_id, root), translation_path(env_id, root, lang="rust")],
                    environment)


# gymnax and envpool cannot sync state with the reference, so only their return distributions are
# compared: within a quarter of a translation's speed (CartPole: gymnax 1.98M, the JAX translation
# 1.87M train sps, the same within the benchmark's noise) the translation, checked step by step, trains.
THIRD_PARTY = ("gymnax", "envpool")
STATISTICAL_MARGIN = 1.25


def _fastest(env_id: str, num_envs: int, translations: list[Path], environment: dict | None = None) -> str:
    from envs_fast import cache
    from envs_fast.backends.gymnax_backend import gymnax_supports
    from envs_fast.mujoco.locomotion import supports as mujoco_batch_supports

    def verdict(spec: str) -> bool | None:
        record = cache.cached_verdict(spec, env_id, environment)
        return None if record is None else bool(record.get("passed"))

    candidates = []  # in the default order
    candidates += [str(path) for path in translations if path.is_file() and verdict(str(path))]
    if mujoco_batch_supports(env_id) and verdict("mujoco_batch"):  # verified state by state, like a translation
        candidates.append("mujoco_batch")
    if mujoco_batch_supports(env_id) and verdict("mjx"):  # mjx covers the envs mujoco_batch covers
        candidates.append("mjx")
    if gymnax_supports(env_id) and verdict("gymnax"):
        candidates.append("gymnax")
    throughput = {spec: cache.cached_throughput(spec, env_id, num_envs, environment) or 0.0
                  for spec in candidates + ["envpool"]}
    if any(spec not in THIRD_PARTY for spec in candidates):  # the weaker verification has to pay for itself
        throughput.update({spec: throughput[spec] / STATISTICAL_MARGIN for spec in THIRD_PARTY if spec in throughput})
    # envpool, last in the order, wins only alone or faster than all the others: only then is it worth
    # asking whether it has the env (importing envpool takes seconds of a training run's budget)
    if (verdict("envpool") is not False and all(throughput["envpool"] > throughput[spec] for spec in candidates)
            and _envpool_supports(env_id)):
        candidates.append("envpool")
    if not candidates:
        return "reference"
    return min((-throughput[spec], order, spec) for order, spec in enumerate(candidates))[2]


def _envpool_supports(env_id: str) -> bool:
    try:
        from envs_fast.backends.envpool_backend import envpool_supports
    except ImportError:
        return False
    return envpool_supports(env_id)
