"""`transfer`: the run's starting and best train.py trained on other envs through the run's runner,
transfer.tsv/png written, the report shows them, and a second call trains nothing. Before an env's
cells train, transfer verifies and benchmarks its backends as setup does, so they train on the
fastest verified one (a MuJoCo env: mujoco_batch)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from envs_fast import STATISTICAL_MARGIN
from orchestrator.transfer_table import COLUMNS, read_rows
from tests.conftest import FAST, TINY_TRAIN_PY, run_daemon, tiny_train_py, write_replay
from tests.test_setup_verify import train_summary, verdicts


@pytest.mark.long
@pytest.mark.slow
def test_transfer_to_two_envs_and_resume(autorl_repo, tmp_path):
    # The tiny controller reads obs[:, :4] and answers 0/1: a valid policy on CartPole and Acrobot.
    repo = autorl_repo(TINY_TRAIN_PY)
    replay = write_replay(tmp_path / "replay", {1: {"candidate/train.py": tiny_train_py(BIAS=0.0),
                                                    "DESCRIPTION": "no bias"}})
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "t", "--agent", "replay", "--replay-dir",
                      str(replay), "--budget", "2", *FAST, "--grace", "30")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = repo / "results" / "t"

    first = run_daemon(repo, "transfer", "--tag", "t", "--envs", "CartPole-v1,Acrobot-v1", "--budget", "10",
                       "--seeds", "1", timeout=600)  # Acrobot's backends are verified first (~100 s on 2 cores)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "trained 4, already done 0" in first.stdout
    rows = pd.read_csv(run_dir / "transfer.tsv", sep="\t", dtype={"commit": str})
    assert list(rows.columns) == list(COLUMNS)
    assert len(rows) == 4
    assert sorted(zip(rows.env, rows.which)) == [("Acrobot-v1", "baseline"), ("Acrobot-v1", "best"),
                                                 ("CartPole-v1", "baseline"), ("CartPole-v1", "best")]
    assert (rows.status == "ok").all() and (rows.seed == 1).all() and (rows.budget_s == 10).all()
    cartpole = rows[rows.env == "CartPole-v1"].set_index("which")
    assert cartpole.loc["best", "score"] == 500.0 > cartpole.loc["baseline", "score"]
    assert rows[rows.env == "Acrobot-v1"].score.between(-500, 0).all()
    assert rows.se.notna().all() and (rows.env_steps == 1000).all()
    # Trained through the runner: each cell has its own train log and harness evaluation.
    for env in ("CartPole-v1", "Acrobot-v1"):
        for which in ("baseline", "best"):
            cell = run_dir / "transfer" / env / f"{which}-seed1"
            assert (cell / "train.log").exists() and (cell / "eval.json").exists()
    assert (run_dir / "transfer.png").read_bytes().startswith(b"\x89PNG")
    page = (run_dir / "report.html").read_text()
    assert "Transfer to other environments" in page and "Acrobot-v1" in page
    assert "CartPole-v1" in first.stdout and "Acrobot-v1" in first.stdout  # the summary table

    logs = sorted((run_dir / "transfer").rglob("train.log"))
    stamps = [p.stat().st_mtime_ns for p in logs]
    second = run_daemon(repo, "transfer", "--tag", "t", "--envs", "CartPole-v1,Acrobot-v1", "--budget", "10",
                        "--seeds", "1", timeout=120)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "4 already done, 0 to train" in second.stdout and "trained 0, already done 4" in second.stdout
    assert len(read_rows(run_dir / "transfer.tsv")) == 4
    assert [p.stat().st_mtime_ns for p in logs] == stamps  # nothing retrained


def test_transfer_refuses_bad_envs_and_missing_runs(autorl_repo):
    repo = autorl_repo(TINY_TRAIN_PY)
    proc = run_daemon(repo, "transfer", "--tag", "nope", "--envs", "CartPole-v1")
    assert proc.returncode == 1 and "no run 'nope'" in proc.stderr


@pytest.mark.long
@pytest.mark.slow
def test_transfer_verifies_a_mujoco_envs_backend_and_trains_on_it(autorl_repo, tmp_path):
    """Hopper-v5 is not the run's env: transfer verifies mujoco_batch for it (for real, L1-L3: 20-40 s
    on 2 cores), benchmarks it beside envpool, and the cell trains on the faster by choose_backend's rule
    (the real train.py's BACKEND = "auto"). A second call with one more seed trains only that seed, on the choice it made."""
    pytest.importorskip("mujoco.batch", reason="mujoco >= 4.0 (mujoco.batch) is not installed")
    repo = autorl_repo()  # the real train.py: its summary says what it trained on
    user_cache = {"AUTORL_USER_CACHE": str(tmp_path / "fresh-user-cache")}  # nothing verified yet
    # LunarLander ships no backend to verify: the run's own setup costs nothing.
    proc = run_daemon(repo, "run", "--env", "LunarLander-v3", "--tag", "t", "--budget", "2", "--max-experiments", "0",
                      *FAST, "--grace", "60", env=user_cache, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = repo / "results" / "t"
    assert "mujoco_batch" not in verdicts(run_dir)

    first = run_daemon(repo, "transfer", "--tag", "t", "--envs", "Hopper-v5", "--budget", "20", "--seeds", "1",
                       env=user_cache, timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    home = run_dir / "transfer" / "Hopper-v5"
    # Verified by the runner, for Hopper, into the run's verdict cache (and kept in the user cache).
    assert "PASS" in (home / "setup" / "mujoco_batch" / "verify.r0.log").read_text()
    assert verdicts(run_dir)["mujoco_batch"] is True
    assert list((tmp_path / "fresh-user-cache").glob("verdict-*.json"))
    # Benchmarked side by side with envpool, its unverified rival.
    side = json.loads((home / "setup" / "bench.json").read_text())["side_by_side"]
    assert [r["backend"] for r in side] == ["mujoco_batch", "envpool"] and all(r["train_sps"] > 0 for r in side)
    # The fastest by choose_backend's rule: envpool, verified only statistically, must be 1.25x as fast
    # (on a quiet 2-core machine with AVX-512 it is: 22k against 16k train sps; on a busy one it is not).
    speed = {r["backend"]: r["train_sps"] for r in side}
    chosen = "envpool" if speed["envpool"] > STATISTICAL_MARGIN * speed["mujoco_batch"] else "mujoco_batch"
    choice = json.loads((home / "backend.json").read_text())
    assert choice["backend"] == chosen, choice
    how = "verified L1-L3 by transfer, " if chosen == "mujoco_batch" else "trusted without a verdict, "
    assert choice["why"].startswith(how) and "train sps vs" in choice["why"]
    said = next(line for line in first.stdout.splitlines() if line.startswith("Hopper-v5: training backend: "))
    assert said.startswith(f"Hopper-v5: training backend: {chosen} ({how}"), said
    # The cell trained on it.
    cell = home / "baseline-seed1"
    summary = train_summary(cell / "train.log")
    assert summary["backend"] == chosen and int(summary["env_steps"]) > 0, summary
    assert "Hopper-v5 baseline seed 1: score" in first.stdout and f", trained on {chosen}" in first.stdout
    rows = pd.read_csv(run_dir / "transfer.tsv", sep="\t", dtype={"commit": str})
    assert list(rows.status) == ["ok", "ok"] and list(rows.which) == ["baseline", "best"]
    assert "INFO transfer Hopper-v5: mujoco_batch verified L1-L3 by transfer" in \
        (run_dir / "transfer" / "transfer.log").read_text()

    # Resumed with one more seed: nothing verified or benchmarked again, seed 1 not retrained.
    reports = [home / "setup" / "mujoco_batch" / "verify.r0.log", home / "setup" / "bench.json", cell / "train.log"]
    stamps = [p.stat().st_mtime_ns for p in reports]
    second = run_daemon(repo, "transfer", "--tag", "t", "--envs", "Hopper-v5", "--budget", "20", "--seeds", "2",
                        env=user_cache, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "2 already done, 2 to train" in second.stdout and "trained 1, already done 2" in second.stdout
    assert f"Hopper-v5: training backend: {chosen} ({how}" in second.stdout
    assert "(chosen by an earlier transfer)" in second.stdout and "verifying" not in second.stdout
    assert [p.stat().st_mtime_ns for p in reports] == stamps
    assert train_summary(home / "baseline-seed2" / "train.log")["backend"] == chosen
