"""train.py's export: policy.pt computes the trained actor with exactly the preprocessing training
applied, and export_check (the artifact reloaded as the harness loads it, against training's own actor)
fails the run, as its last line, when the export acts otherwise."""
from __future__ import annotations

import numpy as np
import pytest

import evaluate
from tests.train_helpers import edited_copy, run_train, summary

DETERMINISTIC_ACTION = "        return jnp.argmax(out, -1) if p.discrete else out\n"


@pytest.mark.parametrize("env_id, wrong", [
    ("CartPole-v1", "        return jnp.argmin(out, -1) if p.discrete else out\n"),
    ("Pendulum-v1", "        return jnp.argmax(out, -1) if p.discrete else out + 0.01\n"),
])
def test_an_export_that_acts_otherwise_fails_the_run_with_its_last_line(tmp_path, env_id, wrong):
    root = edited_copy(tmp_path / "repo", {DETERMINISTIC_ACTION: wrong})  # an exported policy deliberately wrong
    proc, _ = run_train(env_id, 6, tmp_path / "out", tmp_path / "verdicts", root=root)
    assert proc.returncode != 0
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("export_check: FAILED (max |diff| ") and "policy.pt does not act as the trained policy" in last


def test_without_observation_normalisation_the_export_feeds_raw_observations(tmp_path):
    """Acrobot's angular velocities reach ~28: an export that clipped them to OBS_CLIP (10) as a
    normalising one does would act on other inputs than training used. The learning rates are 0 so
    the policy is its seeded initial network, whatever the budget bought: a trained one may saturate
    its first layer at both 10 and 28, and act alike on both whether clipped or not."""
    root = edited_copy(tmp_path / "repo", {"NORM_OBS = True  #": "NORM_OBS = False  #",
                                           "LEARNING_RATE = 3e-4  #": "LEARNING_RATE = 0.0  #",
                                           "JAX_LEARNING_RATE = 2e-3  #": "JAX_LEARNING_RATE = 0.0  #"})
    proc, _ = run_train("Acrobot-v1", 10, tmp_path / "out", tmp_path / "verdicts", root=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert summary(proc.stdout)["export_check"].startswith("ok")

    policy = evaluate.load_policy(tmp_path / "out" / "policy.pt")
    space = evaluate.make_env("Acrobot-v1").observation_space
    obs = np.random.default_rng(0).uniform(space.low, space.high, (4000, 6)).astype(np.float32)
    assert (np.abs(obs) > 10).any(axis=1).mean() > 0.5
    # a clipping export would act alike on both; this one sees the velocities training saw
    assert (np.asarray(policy(obs)) != np.asarray(policy(np.clip(obs, -10, 10)))).any()


def test_export_check_weighs_the_policys_own_float32_sensitivity(tmp_path):
    """XLA and TorchScript round differently. A policy that normalises an input by a near-zero spread
    (Pendulum's cos when it holds the pole up) turns that into action differences a fixed 1e-4 bound
    failed an honest export on (a night's kept Pendulum policy: 2.7e-4 on 1 of 1024 observations).
    export_check allows ROUNDING_FACTOR x the policy's own movement under a few-ulp nudge of its
    inputs: the honest export passes, and one that acts otherwise by far less than its actions'
    spread still fails."""
    import jax
    import jax.numpy as jnp

    import train_plumbing
    from policy_export import export_policy

    rng = np.random.default_rng(0)
    mean, spread = np.array([0.999, 0.0, 0.0], np.float32), np.array([1e-3, 0.5, 2.0], np.float32)
    w1, b1 = rng.normal(0, 1, (3, 64)).astype(np.float32), rng.normal(0, 1, 64).astype(np.float32)
    w2, w3 = (rng.normal(0, 1, (64, 64)) / 4).astype(np.float32), rng.normal(0, 1, (64, 1)).astype(np.float32)

    def act(obs):
        return jnp.tanh(jnp.tanh(jnp.clip((obs - mean) / spread, -10, 10) @ w1 + b1) @ w2) @ w3

    theta = rng.uniform(-0.3, 0.3, 1024)
    obs = np.stack([np.cos(theta), np.sin(theta), rng.normal(0, 1, 1024)], 1).astype(np.float32)
    outputs = jax.jit(act)
    expected = np.asarray(outputs(obs), np.float64)
    sensitivity = train_plumbing.rounding_sensitivity(outputs, obs, expected)
    assert np.median(sensitivity) > 1e-7   # the normalisation amplifies an ulp of cos

    export_policy(act, obs[:2], tmp_path / "policy.pt")
    ok, line = train_plumbing.check_export(tmp_path / "policy.pt", False, 1, obs, outputs)
    assert ok, line

    offset = 0.01 * float(np.std(expected))
    export_policy(lambda o: act(o) + offset, obs[:2], tmp_path / "wrong.pt")
    ok, line = train_plumbing.check_export(tmp_path / "wrong.pt", False, 1, obs, outputs)
    assert not ok and "does not act as the trained policy" in line
