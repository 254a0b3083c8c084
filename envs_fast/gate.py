"""The training gate: which backends a training run may use. A run trains only on code it has
verified (a passing verdict in its verdict cache), envpool unless a verdict says it fails, or the
reference; `make_vec_env` and `backend.load_functional` apply it themselves in a training run."""
from __future__ import annotations

import os
from pathlib import Path

# Set for every training run (orchestrator.artifacts.train_env, the agents' trial runs), never for
# verify or bench, which must load backends that are not verified yet.
TRAINING_RUN_VARIABLE = "AUTORL_OUTPUT_DIR"
TRUSTED_SPECS = ("reference", "gymnasium")  # the reference itself needs no verdict


def in_training_run() -> bool:
    return bool(os.environ.get(TRAINING_RUN_VARIABLE))


def training_refusal(spec: str, env_id: str, root: str | Path | None = None) -> str | None:
    """Why training may not use backend SPEC for `env_id` in this run, or None when it may: a
    translation (JAX or Rust) or gymnax needs a passing verdict in the run's verdict cache (the one
    `cache.cached_verdict` reads: $AUTORL_VERIFY_CACHE under the daemon); envpool is trusted unless
    a cached verdict fails (the rule `choose_backend` applies); the reference always may."""
    from envs_fast.cache import cache_dir, cached_verdict   # looked up per call: a test may replace them
    from envs_fast.protocol import resolve_spec

    spec = resolve_spec(spec, env_id, root)
    if spec in TRUSTED_SPECS:
        return None
    record = cached_verdict(spec, env_id)
    if record is not None and not record.get("passed"):
        return f"{spec} failed verification for {env_id}: {record.get('summary', '')}".rstrip(": ")
    if record is None and spec != "envpool":
        return f"{spec} has no verdict for {env_id} in this run's verdict cache ({cache_dir()})"
    return None
