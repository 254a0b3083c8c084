"""AUTORL_MAX_ENV_STEPS: a step budget beside the time budget, for comparisons at equal env steps
(verification's L4 trains a backend and the reference for the same steps). Each path stops at the
last iteration that fits in it, well inside a time budget it no longer needs, and anneals over it."""
from __future__ import annotations

import pytest

from tests.train_helpers import REPO, edited_copy, load_train, run_train, store_passing_verdicts, summary

TIME_BUDGET = 600  # seconds: never reached, the steps end every run here


@pytest.mark.parametrize("learner, verified, path, per_iteration", [
    ("torch", False, "host", 32 * 256),          # envpool, NUM_ENVS x NUM_STEPS
    ("auto", False, "jax-host", 32 * 4 * 256),   # envpool, NUM_ENVS x JAX_HOST_ENVS_FACTOR x NUM_STEPS
    ("auto", True, "jax-e2e", 32 * 64),          # the JAX translation, JAX_NUM_ENVS x JAX_NUM_STEPS
])
def test_training_stops_at_the_step_budget(tmp_path, learner, verified, path, per_iteration):
    max_steps = int(2.5 * per_iteration)  # two iterations fit, a third would not
    cache_dir = store_passing_verdicts(tmp_path / "cache") if verified else tmp_path / "empty-cache"
    root = edited_copy(tmp_path / "checkout", {'LEARNER = "auto"': f'LEARNER = "{learner}"'}) if learner != "auto" else REPO
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
    train = load_train("CartPole-v1", TIME_BUDGET, tmp_path)
    assert train.budget_progress(now=100.0, start=0.0, deadline=1000.0, env_steps=0) == pytest.approx(0.1)
    train.MAX_ENV_STEPS = 1000
    assert train.budget_progress(now=1.0, start=0.0, deadline=1000.0, env_steps=500) == pytest.approx(0.5)
    assert train.budget_progress(now=900.0, start=0.0, deadline=1000.0, env_steps=500) == pytest.approx(0.9)
    assert not train.steps_spent(500, 500) and train.steps_spent(501, 500)
