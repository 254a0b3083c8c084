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
    normalising one does would act on other inputs than training used."""
    root = edited_copy(tmp_path / "repo", {"NORM_OBS = True  #": "NORM_OBS = False  #"})
    proc, _ = run_train("Acrobot-v1", 10, tmp_path / "out", tmp_path / "verdicts", root=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert summary(proc.stdout)["export_check"].startswith("ok")

    policy = evaluate.load_policy(tmp_path / "out" / "policy.pt")
    space = evaluate.make_env("Acrobot-v1").observation_space
    obs = np.random.default_rng(0).uniform(space.low, space.high, (4000, 6)).astype(np.float32)
    assert (np.abs(obs) > 10).any(axis=1).mean() > 0.5
    # a clipping export would act alike on both; this one sees the velocities training saw
    assert (np.asarray(policy(obs)) != np.asarray(policy(np.clip(obs, -10, 10)))).any()
