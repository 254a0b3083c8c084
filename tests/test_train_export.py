"""train.py's export: policy.pt applies exactly the preprocessing training applied, and export_check
(the artifact reloaded as the harness loads it, against the trained policy) fails the run, as its last
line, when the export acts otherwise."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import evaluate
from tests.train_helpers import edited_copy, run_train, summary


@pytest.mark.parametrize("env_id, wrong", [
    ("CartPole-v1", {"return torch.argmax(out, dim=-1)": "return torch.argmin(out, dim=-1)"}),
    ("Pendulum-v1", {"        return out\n\n\nclass Problem": "        return out + 0.01\n\n\nclass Problem"}),
])
def test_an_export_that_acts_otherwise_fails_the_run_with_its_last_line(tmp_path, env_id, wrong):
    root = edited_copy(tmp_path / "repo", wrong)  # an ExportedPolicy that is deliberately wrong
    proc, _ = run_train(env_id, 4, tmp_path / "out", tmp_path / "verdicts", root=root)
    assert proc.returncode != 0
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("export_check: FAILED (max |diff| ") and "policy.pt does not act as the trained policy" in last


def test_without_observation_normalisation_the_export_feeds_raw_observations(tmp_path):
    """Acrobot's angular velocities reach ~28: an export that clipped them to OBS_CLIP (10) as a
    normalising one does would act on other inputs than training used."""
    root = edited_copy(tmp_path / "repo", {"NORM_OBS = True  #": "NORM_OBS = False  #"})
    proc, _ = run_train("Acrobot-v1", 4, tmp_path / "out", tmp_path / "verdicts", root=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert summary(proc.stdout)["export_check"].startswith("ok")

    path = tmp_path / "out" / "policy.pt"
    space = evaluate.make_env("Acrobot-v1").observation_space
    obs = np.random.default_rng(0).uniform(space.low, space.high, (4000, 6)).astype(np.float32)
    actor = torch.jit.load(str(path)).actor  # the exported network itself
    with torch.no_grad():
        on_raw = actor(torch.from_numpy(obs)).argmax(-1).numpy()
        on_clipped = actor(torch.from_numpy(np.clip(obs, -10, 10))).argmax(-1).numpy()
    assert (on_raw != on_clipped).any()  # these observations tell a clipping export apart
    np.testing.assert_array_equal(evaluate.load_policy(path)(obs), on_raw)
