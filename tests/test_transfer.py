"""`transfer`: the run's starting and best train.py trained on other envs through the run's runner,
transfer.tsv/png written, the report shows them, and a second call trains nothing."""
from __future__ import annotations

import pandas as pd
import pytest

from orchestrator.transfer_table import COLUMNS, read_rows
from tests.conftest import FAST, TINY_TRAIN_PY, run_daemon, tiny_train_py, write_replay


@pytest.mark.long
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
                       "--seeds", "1", timeout=300)
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
