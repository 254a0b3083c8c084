"""--screen F: candidates train first at F x the budget against the best commit's own screen; only
promising ones train at the full budget, and only full-budget runs are kept. results.tsv says at
which budget each score was measured."""
import json

import pytest

from orchestrator.ledger import Ledger
from orchestrator.results import HEADER, ResultsFile
from tests.conftest import FAST, read_results, run_daemon, tiny_train_py, write_replay


def said_budget(bias: float) -> str:
    """The tiny train.py, printing the budget it was given."""
    return tiny_train_py(BIAS=bias).replace(
        'print("---")', 'print("given budget:", os.environ["AUTORL_TIME_BUDGET"])\nprint("---")')


@pytest.mark.long
@pytest.mark.slow
def test_a_worse_candidate_stops_at_its_screen_and_a_better_one_is_kept_on_full_budget_runs(autorl_repo, tmp_path):
    repo = autorl_repo(train_py=said_budget(1.0))  # the pole for ~145 steps
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": said_budget(5.0), "DESCRIPTION": "always left"},   # ~9
        2: {"candidate/train.py": said_budget(0.0), "DESCRIPTION": "no bias"},       # 500
    })
    done = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "sc", "--agent", "replay", "--replay-dir",
                      str(replay), "--phases", "train", "--budget", "4", "--screen", "0.25", "--max-experiments", "2",
                      "--no-setup-verify", *FAST, "--grace", "10", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = read_results(repo, "sc")
    assert rows["status"].tolist() == ["baseline", "baseline", "screened", "keep"]
    assert rows["budget_s"].tolist() == [4, 4, 1, 4]
    screened, kept = rows.iloc[2], rows.iloc[3]
    assert screened["score"] < rows.iloc[0]["score"] and "screen" in screened["description"]
    assert kept["score"] == 500 and kept["best"] == 500

    run_dir = repo / "results" / "sc"
    first, second = run_dir / "exp-0001", run_dir / "exp-0002"
    assert "given budget: 1" in (first / "screen" / "train.log").read_text()
    assert not (first / "train.log").exists()            # never trained at the full budget
    assert "given budget: 1" in (second / "screen" / "train.log").read_text()
    assert "given budget: 4" in (second / "train.log").read_text()
    # the best commit was screened once, at the same fraction and seed, and reused by exp 2
    incumbent = list((run_dir / "screen").iterdir())
    assert len(incumbent) == 1 and "given budget: 1" in (incumbent[0] / "train.log").read_text()
    assert json.loads((incumbent[0] / "screen.json").read_text())["seed"] == 1
    log = (run_dir / "daemon.log").read_text()
    assert log.count("screen: training the best commit") == 1
    report = run_daemon(repo, "report", "--tag", "sc")
    assert "screened 1" in report.stdout, report.stdout


def test_screen_must_be_a_fraction_of_the_budget(autorl_repo):
    repo = autorl_repo(train_py=tiny_train_py())
    done = run_daemon(repo, "run", "--env", "CartPole-v1", "--screen", "1.5", timeout=60)
    assert done.returncode == 2 and "--screen" in done.stderr and "below 1" in done.stderr


def test_a_results_file_from_before_budget_s_is_upgraded_with_its_rows(tmp_path):
    old_header = HEADER.replace("\tbudget_s", "")
    path = tmp_path / "results.tsv"
    path.write_text(old_header + "0\t2026-11-20T00:00:00Z\ttrain\tabc1234\tbaseline\t100.000\t100.000\t1000\t500"
                    "\t3.0\t0.0000\tbaseline seed 1\n")
    ledger = Ledger(ResultsFile(path))
    assert path.read_text().startswith(HEADER)
    (row,) = ledger.rows
    assert (row.status, row.score, row.budget_s, row.description) == ("baseline", 100.0, None, "baseline seed 1")
