"""L4 for a translation that declares TRANSFER_PPO (a physics scene): train.py's PPO trained on the
backend for the declared env steps must score on the reference env within the margin of PPO trained on
the reference for as many. Here on CartPole's Rust translation, in a copy of the checkout whose
companion declares a small TRANSFER_PPO: the shipped one transfers, one whose push is mirrored (action 1
pushes left) trains a policy that drops the pole on the real env at once."""
from __future__ import annotations

import json

import pytest

from envs_fast import cache
from envs_fast.rust.build import rustc_available
from envs_fast.verify import Settings, verify
from tests.train_helpers import edited_copy

needs_rustc = pytest.mark.skipif(not rustc_available(), reason="rustc not found on PATH")

# 60k env steps of train.py's PPO at 32 envs balance CartPole (500) on the reference: the two sides agree
# within 50; the mirrored port's policy scores about 10 there. The jax-host path's larger batch of long
# budgets (one update in 60k steps) is declared away, as BipedalWalker's declaration does.
DECLARATION = ('\nTRANSFER_PPO = {"env_steps": 60_000, "seeds": 1, "margin": 50.0, "min_score": 300.0,'
               ' "train_py": {"JAX_HOST_ENVS_FACTOR": 1}}\n')
MIRRORED = ("let force = if action[0] == 1.0 { FORCE_MAG } else { -FORCE_MAG };",
            "let force = if action[0] == 1.0 { -FORCE_MAG } else { FORCE_MAG };")


def checkout_declaring_transfer(root, mirrored=False):
    edited_copy(root, {})
    companion = root / "envs_fast" / "translations" / "cartpole_v1_sync.py"
    companion.write_text(companion.read_text() + DECLARATION)
    port = root / "envs_fast" / "translations" / "cartpole_v1.rs"
    if mirrored:
        source = port.read_text()
        assert MIRRORED[0] in source
        port.write_text(source.replace(*MIRRORED))
    return root, port


@pytest.fixture
def verdicts(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_ENV_VAR, str(tmp_path / "verdicts"))


def l4(root, port, kept=None, jobs=None):
    report = verify("CartPole-v1", str(port), levels=[4], settings=Settings(extra={"l4_dir": kept, "l4_jobs": jobs}),
                    root=root)
    (level,) = report.levels
    return level, {check.name: check for check in level.checks}


@needs_rustc
@pytest.mark.slow
def test_ppo_trained_on_a_faithful_port_scores_as_ppo_trained_on_the_reference(tmp_path, verdicts, monkeypatch):
    root, port = checkout_declaring_transfer(tmp_path / "checkout")
    cache.store_verdict(str(port), "CartPole-v1", [1, 2, 3], True, "L1-L3 passed (test verdict)")
    kept = tmp_path / "l4"
    monkeypatch.chdir(root)  # the spec as a user types it: relative to where verify runs
    level, checks = l4(root, port.relative_to(root), kept, jobs=2)
    assert level.passed, level.checks
    # --l4-jobs 2: the backend's run and the reference's trained side by side, each with its own JAX cache
    backend, reference = (json.loads((kept / f"{side}-seed1" / "run.json").read_text())["run"]
                          for side in ("backend", "reference"))
    assert backend["started_at"] < reference["ended_at"] and reference["started_at"] < backend["ended_at"]
    assert all((kept / f"{side}-seed1" / "jax-cache").is_dir() for side in ("backend", "reference"))
    transfer = checks["PPO trained on the backend transfers (score within the margin)"]
    assert "60,000 env steps per run" in transfer.detail and "train.py's jax-host path" in transfer.detail
    assert level.largest_deviation["margin"] == 50.0 and abs(level.largest_deviation["mean score difference"]) <= 50
    for side in ("backend", "reference"):  # both sides trained with the declared constants
        assert "\nJAX_HOST_ENVS_FACTOR = 1\n" in (kept / f"{side}-seed1" / "candidate" / "train.py").read_text()
    # a second check over the kept runs trains nothing again and judges the same figures
    logs = {path: path.stat().st_mtime_ns for path in kept.glob("*/train.log")}
    assert len(logs) == 2
    again, again_checks = l4(root, port, kept)
    assert again_checks[transfer.name].detail == transfer.detail
    assert {path: path.stat().st_mtime_ns for path in kept.glob("*/train.log")} == logs
    # a changed port (one more translate experiment) trains its own side again; the reference's runs,
    # which it does not decide, are reused (hours each on a physics scene)
    port.write_text(port.read_text() + "\n// one more change\n")
    cache.store_verdict(str(port), "CartPole-v1", [1, 2, 3], True, "L1-L3 passed (test verdict)")
    changed, changed_checks = l4(root, port, kept)
    assert changed.passed, changed.checks
    retrained = {path.parent.name for path in kept.glob("*/train.log") if path.stat().st_mtime_ns != logs[path]}
    assert retrained == {"backend-seed1"}


@needs_rustc
def test_ppo_trained_on_a_mirrored_port_fails_transfer_with_its_scores(tmp_path, verdicts):
    root, port = checkout_declaring_transfer(tmp_path / "checkout", mirrored=True)
    cache.store_verdict(str(port), "CartPole-v1", [1, 2, 3], True, "a port that slipped through (test verdict)")
    level, checks = l4(root, port)
    assert not level.passed
    assert checks["the reference's PPO learnt"].passed  # the comparison is meaningful
    transfer = checks["PPO trained on the backend transfers (score within the margin)"]
    assert not transfer.passed
    assert level.largest_deviation["mean score difference"] < -200, transfer.detail
    assert "seed 1:" in transfer.detail and "margin +-50" in transfer.detail


@needs_rustc
def test_without_a_passing_verdict_the_port_is_not_trained_on(tmp_path, verdicts):
    root, port = checkout_declaring_transfer(tmp_path / "checkout")
    level, checks = l4(root, port)
    assert not level.passed
    assert "no passing verdict" in checks["trained on the backend (PPO)"].detail


# A stand-in train.py: what a run started in its folder finds there, then its summary.
FOLDER_PROBE = '''import os, sys
from pathlib import Path
folder = Path(os.environ["AUTORL_OUTPUT_DIR"])
checkpoint = Path(os.environ["AUTORL_CHECKPOINT_DIR"])
print("checkpoint kept:", (checkpoint / "training.pkl").exists(), "inside the run's folder:", checkpoint.parent == folder)
print("---")
print("backend: reference")
print("env_steps: 10")
'''


def test_a_stopped_training_run_keeps_its_checkpoint_unless_it_is_outdated(tmp_path):
    """A run's folder outlives a stopped L4 (hours of training on a slow port): started again under the same
    identity, train.py finds its checkpoint; under another (the port or train.py changed) it starts afresh."""
    from envs_fast.verify import ppo_transfer

    folder = tmp_path / "backend-seed1"
    identity = {"backend": "port-sha-1", "seed": 1}
    first = ppo_transfer.train(tmp_path, folder, FOLDER_PROBE, "CartPole-v1", 10, 1, identity)
    assert first["env_steps"] == 10 and first["backend"] == "reference"
    assert "checkpoint kept: False inside the run's folder: True" in (folder / "train.log").read_text()

    (folder / "checkpoint").mkdir()
    (folder / "checkpoint" / "training.pkl").write_bytes(b"saved training")  # what train.py left when stopped
    ppo_transfer.train(tmp_path, folder, FOLDER_PROBE, "CartPole-v1", 10, 1, identity)
    assert "checkpoint kept: True" in (folder / "train.log").read_text().splitlines()[-4]

    ppo_transfer.train(tmp_path, folder, FOLDER_PROBE, "CartPole-v1", 10, 1,
                       dict(identity, backend="port-sha-2"))
    log = (folder / "train.log").read_text()
    assert "checkpoint kept: False" in log and "checkpoint kept: True" not in log  # a fresh folder, a fresh log


def test_the_progress_of_a_long_l4_reads_from_its_run_folders(tmp_path):
    """bench/l4_progress.py: a finished run's score, a stopped one's last checkpoint (what a measurement over
    several sittings commits as it goes)."""
    import json
    import subprocess
    import sys

    import numpy as np

    from tests.train_helpers import REPO

    finished, stopped = tmp_path / "reference-seed1", tmp_path / "backend-seed1"
    finished.mkdir()
    (finished / "run.json").write_text(json.dumps({
        "identity": {"backend": "reference:1.2.2", "env_steps": 3_000_000},
        "run": {"env_steps": 2_995_216, "seconds": 1220.0, "path": "jax-host", "score": {"mean": 297.3, "std": 39.7}}}))
    stopped.mkdir()
    (stopped / "identity.json").write_text(json.dumps({"backend": "file:0123456789abcdef", "env_steps": 3_000_000}))
    import train_plumbing

    train_plumbing.Checkpoint(stopped / "checkpoint").save(
        {"params": np.zeros(8, np.float32)}, (812_345, 99, [(-100.0, 1), (20.0, 1)]))
    proc = subprocess.run([sys.executable, "-m", "bench.l4_progress", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("backend-seed1 (trains on file:0123456789ab, 3,000,000 env steps): training; checkpoint")
    assert "812,345 env steps, 99 updates, return of its last 20 episodes -40.0" in lines[1]
    assert lines[2] == ("reference-seed1 (trains on reference:1.2.2, 3,000,000 env steps): FINISHED 2,995,216 env steps "
                        "in 1220 s on path 'jax-host'; score 297.3 (sd 39.7) on the reference env")


# A stand-in train.py: seed 2 fails at once, seed 1 would train for ten minutes.
FAILS_OR_TRAINS_LONG = '''import os, sys, time
from pathlib import Path
BACKEND = "reference"
END_TO_END = True
(Path(os.environ["AUTORL_OUTPUT_DIR"]) / "pid").write_text(str(os.getpid()))
if os.environ["AUTORL_SEED"] == "2":
    time.sleep(2)
    sys.exit("seed 2 cannot train")
time.sleep(600)
'''


def test_a_failing_l4_run_stops_its_siblings_and_reports_its_own_error(tmp_path, verdicts):
    """With --l4-jobs 2, a run that fails ends the check at once: the sibling still training (hours on a
    physics port) is terminated instead of waited for, and the report shows the failing run's error."""
    import os
    import time

    from tests.train_helpers import REPO

    root = tmp_path / "checkout"
    (root / "candidate").mkdir(parents=True)
    (root / "candidate" / "train.py").write_text(FAILS_OR_TRAINS_LONG)
    port = root / "cartpole_v1.py"
    port.write_text((REPO / "envs_fast" / "translations" / "cartpole_v1.py").read_text()
                    + '\nTRANSFER_PPO = {"env_steps": 10_000, "seeds": 2, "margin": 50.0}\n')
    cache.store_verdict(str(port), "CartPole-v1", [1, 2, 3], True, "L1-L3 passed (test verdict)")
    kept = tmp_path / "l4"
    started = time.monotonic()
    level, checks = l4(root, port, kept, jobs=2)
    assert time.monotonic() - started < 120  # not the sibling's ten minutes
    assert not level.passed
    assert "seed 2 cannot train" in checks["PPO trains on the backend"].detail
    sibling = int((kept / "backend-seed1" / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(sibling, 0)
