"""AUTORL_MAX_ENV_STEPS: a step budget beside the time budget, for comparisons at equal env steps
(verification's L4 trains a backend and the reference for the same steps). Each path stops at the
last iteration that fits in it, well inside a time budget it no longer needs, and anneals over it."""
from __future__ import annotations

import pytest

from tests.train_helpers import REPO, edited_copy, run_train, store_passing_verdicts, summary

TIME_BUDGET = 600  # seconds: never reached, the steps end every run here


@pytest.mark.parametrize("end_to_end, verified, path, per_iteration", [
    (True, False, "jax-host", 32 * 4 * 256),   # envpool, NUM_ENVS x JAX_HOST_ENVS_FACTOR x NUM_STEPS
    (False, True, "jax-host", 32 * 4 * 256),   # the JAX translation's vector adapter, stepped from the host
    (True, True, "jax-e2e", 32 * 64),          # the JAX translation, JAX_NUM_ENVS x JAX_NUM_STEPS
])
def test_training_stops_at_the_step_budget(tmp_path, end_to_end, verified, path, per_iteration):
    max_steps = int(2.5 * per_iteration)  # two iterations fit, a third would not
    cache_dir = store_passing_verdicts(tmp_path / "cache") if verified else tmp_path / "empty-cache"
    root = REPO if end_to_end else edited_copy(tmp_path / "checkout", {"END_TO_END = True": "END_TO_END = False"})
    proc, wall_seconds = run_train("CartPole-v1", TIME_BUDGET, tmp_path / "out", cache_dir, root=root,
                                   extra_env={"AUTORL_MAX_ENV_STEPS": str(max_steps)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    stats = summary(proc.stdout)
    assert stats["path"] == path
    env_steps = int(stats["env_steps"])
    # every iteration that fits was trained, none past the budget; the time budget played no part
    assert max_steps - 2 * per_iteration < env_steps <= max_steps, env_steps
    assert wall_seconds < TIME_BUDGET / 4 and stats["export_check"].startswith("ok")


def test_with_a_step_budget_the_learning_rate_anneals_over_steps(tmp_path):
    """Two runs of the same steps anneal alike however fast each steps (what makes L4's comparison fair)."""
    import train_plumbing

    assert train_plumbing.budget_progress(now=100.0, start=0.0, deadline=1000.0, env_steps=0,
                                          max_env_steps=0) == pytest.approx(0.1)
    assert train_plumbing.budget_progress(now=1.0, start=0.0, deadline=1000.0, env_steps=500,
                                          max_env_steps=1000) == pytest.approx(0.5)
    assert train_plumbing.budget_progress(now=900.0, start=0.0, deadline=1000.0, env_steps=500,
                                          max_env_steps=1000) == pytest.approx(0.9)
    assert not train_plumbing.steps_spent(500, 500, max_env_steps=1000)
    assert train_plumbing.steps_spent(501, 500, max_env_steps=1000)
