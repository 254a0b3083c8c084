"""The morning's figure is out of sample: at the end of a night the start and the best are trained
again on fresh seeds no run of the night used, and the summary, report.html and the log lead with
that gain and its interval; the night's own gain is labelled in-sample. `report --rescore K` does the
same for a finished run."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import FAST, PYTHON, TINY_TRAIN_PY, daemon_env, read_results, run_daemon, write_replay

BETTER = TINY_TRAIN_PY.replace("BIAS = 1.0", "BIAS = 0.0")  # balances 500 steps where the start falls in ~145


def night(autorl_repo, tmp_path, tag: str, *extra: str):
    repo = autorl_repo(train_py=TINY_TRAIN_PY)
    replay = write_replay(tmp_path / "replay", {1: {"candidate/train.py": BETTER, "DESCRIPTION": "no bias"}})
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", tag, "--agent", "replay", "--replay-dir",
                      str(replay), "--budget", "10", "--max-experiments", "1", "--no-setup-verify", *FAST,
                      "--grace", "10", *extra, timeout=400)  # (torch's import on a loaded machine)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_results(repo, tag).iloc[-1]["status"] == "keep"
    return repo


@pytest.mark.slow
def test_a_night_ends_with_the_start_and_the_best_on_fresh_seeds(autorl_repo, tmp_path):
    repo = night(autorl_repo, tmp_path, "oos", "--rescore", "2")  # (FAST turns it off; 2 is the default)
    run_dir = repo / "results" / "oos"
    rescored = json.loads((run_dir / "rescore.json").read_text())
    config = json.loads((run_dir / "run.json").read_text())
    night_seeds = set(config["train_seeds"]) | {config["confirm_seed"]}
    assert len(rescored["seeds"]) == 2 and not set(rescored["seeds"]) & night_seeds
    assert min(rescored["seeds"]) > max(night_seeds) + 1000  # beyond any confirmation of the night
    assert rescored["start_commit"] == config["base_commit"] and rescored["best_commit"] != config["base_commit"]
    assert all(s > 400 for s in rescored["best_scores"]) and all(s < 300 for s in rescored["start_scores"])
    assert rescored["gain"] > 200 and rescored["interval"][0] <= rescored["gain"] <= rescored["interval"][1]
    for label in ("start", "best"):  # trained and scored like any run, each in a folder of its own
        for seed in rescored["seeds"]:
            assert (run_dir / "rescore" / f"{label}-seed-{seed}" / "eval.json").exists()
    assert "out of sample: best - start" in (run_dir / "daemon.log").read_text()
    report = subprocess.run([PYTHON, "-m", "orchestrator", "report", "--tag", "oos"], cwd=repo, env=daemon_env(),
                            capture_output=True, text=True, timeout=300)
    summary = report.stdout.splitlines()
    assert summary[1].startswith("  out of sample: best - start +"), report.stdout  # the lead, first after the title
    assert any("(in-sample:" in line for line in summary), report.stdout
    assert "out of sample: best - start on 2 fresh seeds" in (run_dir / "report.html").read_text()


@pytest.mark.slow
def test_report_rescore_rescores_a_finished_run(autorl_repo, tmp_path):
    repo = night(autorl_repo, tmp_path, "later", "--rescore", "0")
    run_dir = repo / "results" / "later"
    assert not (run_dir / "rescore.json").exists()
    report = subprocess.run([PYTHON, "-m", "orchestrator", "report", "--tag", "later", "--rescore", "2"], cwd=repo,
                            env=daemon_env(), capture_output=True, text=True, timeout=400)
    assert report.returncode == 0, report.stdout + report.stderr
    assert json.loads((run_dir / "rescore.json").read_text())["gain"] > 200
    lines = report.stdout.splitlines()  # the rescoring's log lines, then the summary
    title = next(i for i, line in enumerate(lines) if line.startswith("later: CartPole-v1"))
    assert lines[title + 1].startswith("  out of sample: best - start +"), report.stdout
