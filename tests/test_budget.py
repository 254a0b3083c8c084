"""The budget is exact: a train.py that trains past its budget (here by stretching its own
TIME_BUDGET, the review's example) is killed at budget + the run's allowance and recorded
`invalid` with how long it trained; one that exports after budget + the export margin but before the
kill is `invalid` too, with when its artifact was complete; one that exported in time but did not exit
is a `timeout`; one that keeps to its budget is scored like any other."""
from __future__ import annotations

import json

import pytest

from tests.conftest import FAST, TINY_TRAIN_PY, read_results, run_daemon, write_replay

BUDGET, ALLOWANCE = 6, 4

# train.py's own clock starts with its process, as the shipped train.py's does
ON_BUDGET = TINY_TRAIN_PY.replace("import time\n", "import time\nT0 = time.time()\n", 1).replace(
    "time.sleep(SLEEP)", "time.sleep(max(0.0, float(os.environ['AUTORL_TIME_BUDGET']) - 1.5 - (time.time() - T0)))")
STRETCHED = ON_BUDGET.replace("float(os.environ['AUTORL_TIME_BUDGET']) - 1.5",
                              "float(os.environ['AUTORL_TIME_BUDGET']) * 2.5")
HANGS_AFTER_EXPORT = TINY_TRAIN_PY + "time.sleep(600)\n"
# the review's `TIME_BUDGET = evaluate.TIME_BUDGET + 9`: past the budget, inside the kill deadline
LATE = ON_BUDGET.replace("float(os.environ['AUTORL_TIME_BUDGET']) - 1.5", "float(os.environ['AUTORL_TIME_BUDGET']) + 5")


@pytest.mark.slow
def test_a_train_py_that_stretches_its_budget_is_invalid(autorl_repo, tmp_path):
    repo = autorl_repo(train_py=TINY_TRAIN_PY)
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": STRETCHED, "DESCRIPTION": "TIME_BUDGET = evaluate.TIME_BUDGET * 2.5"},
        2: {"candidate/train.py": HANGS_AFTER_EXPORT, "DESCRIPTION": "exports, then never exits"},
        3: {"candidate/train.py": ON_BUDGET, "DESCRIPTION": "trains for its budget"},
    })
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "budget", "--agent", "replay", "--replay-dir",
                      str(replay), "--budget", str(BUDGET), "--max-experiments", "3", "--no-setup-verify", *FAST,
                      "--grace", str(ALLOWANCE), "--export-margin", "3", timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_results(repo, "budget")
    stretched, hangs, on_budget = (rows[rows.exp == exp].iloc[-1] for exp in (1, 2, 3))
    limit = BUDGET + ALLOWANCE
    assert stretched["status"] == "invalid" and stretched["score"] != stretched["score"]  # no score
    assert f"[trained >= {limit} s of a {BUDGET} s budget, allowance {ALLOWANCE} s]" in stretched["description"]
    # killed at the allowance, not at budget + 30 s
    assert limit <= stretched["wall_s"] < limit + 8, stretched["wall_s"]
    failure = (repo / "results" / "budget" / "exp-0001" / "failure.txt").read_text()
    assert "must train within TIME_BUDGET" in failure and "was still running" in failure
    assert hangs["status"] == "timeout" and "the artifact was complete at" in hangs["description"]
    assert on_budget["status"] in ("keep", "discard") and on_budget["score"] == on_budget["score"]
    run = json.loads((repo / "results" / "budget" / "run.json").read_text())
    assert run["grace_s"] == ALLOWANCE and run["budget_s"] == BUDGET


def test_the_default_allowance_is_small():
    from orchestrator.config import budget_allowance

    assert budget_allowance(10) == 10.0 and budget_allowance(720) == 36.0   # (it was max(30 s, 10%): 72 s at 720)
    # the review's example: TIME_BUDGET * 2.5 at a 10 s budget trains 25 s, past 10 + 10
    assert 2.5 * 10 > 10 + budget_allowance(10)


@pytest.mark.slow
def test_an_artifact_completed_past_the_budget_is_invalid_before_the_kill(autorl_repo, tmp_path):
    from orchestrator.config import EXPORT_MARGIN_S

    repo = autorl_repo(train_py=TINY_TRAIN_PY)
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": LATE, "DESCRIPTION": "TIME_BUDGET = evaluate.TIME_BUDGET + 5"},
        2: {"candidate/train.py": ON_BUDGET, "DESCRIPTION": "trains for its budget"},
    })
    allowance = 12  # the kill deadline is far: only the exact budget can refuse the late artifact
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "late", "--agent", "replay", "--replay-dir",
                      str(replay), "--budget", str(BUDGET), "--max-experiments", "2", "--no-setup-verify", *FAST,
                      "--grace", str(allowance), "--export-margin", str(EXPORT_MARGIN_S), timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_results(repo, "late")
    late, on_budget = (rows[rows.exp == exp].iloc[-1] for exp in (1, 2))
    assert late["status"] == "invalid" and late["score"] != late["score"], late.to_dict()
    trained = float(late["description"].split("[trained ", 1)[1].split(" s of", 1)[0])
    assert BUDGET + EXPORT_MARGIN_S < trained < BUDGET + allowance, late["description"]
    assert f"s of a {BUDGET} s budget]" in late["description"]
    assert late["wall_s"] < BUDGET + allowance  # it exited by itself: refused, not killed
    failure = (repo / "results" / "late" / "exp-0001" / "failure.txt").read_text()
    assert "Its score was not taken" in failure
    assert on_budget["status"] in ("keep", "discard") and on_budget["score"] == on_budget["score"]

