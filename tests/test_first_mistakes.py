"""The commonest first mistakes: each costs one clear line on stderr, a non-zero exit, and no run.

Tested elsewhere: `--resume` with nothing to resume (test_loop_units.py,
test_cli_dispatch_and_argument_errors) and `--sandbox require` without bubblewrap (test_walls.py),
each with its one line; a tag whose daemon is running (test_loop_resume.py, beside a real running
daemon: the exit and the pid in the message).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from .conftest import FAST, run_daemon, tiny_train_py

TAG = "first"
NO_BUDGET = ("--tag", TAG, "--max-experiments", "0", "--no-setup-verify", *FAST)
QUICK = (*NO_BUDGET, "--budget", "2")


def one_line_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0, result.stdout[-2000:]
    assert len(lines) == 1, result.stderr
    return lines[0]


def no_run_started(repo: Path) -> bool:
    return not (repo / "results" / TAG / "run.json").exists() and not (repo / "runs" / TAG).exists()


@pytest.mark.parametrize("env_id", ["Pendulm-v1", "pendulum-v1"])
def test_a_misspelled_env_id_names_the_closest_ids(autorl_repo, env_id):
    repo = autorl_repo(tiny_train_py())
    line = one_line_error(run_daemon(repo, "run", "--env", env_id, *QUICK, timeout=120))
    assert f"unknown environment {env_id!r}" in line and "closest registered ids: Pendulum-v1" in line
    assert no_run_started(repo)


def test_the_anthropic_agent_without_a_key_says_how_to_run_offline(autorl_repo):
    repo = autorl_repo(tiny_train_py())
    line = one_line_error(run_daemon(repo, "run", "--env", "CartPole-v1", "--agent", "anthropic", *QUICK,
                                     timeout=120))
    assert "needs ANTHROPIC_API_KEY" in line and "--agent optuna" in line
    assert no_run_started(repo)


def test_uncommitted_edits_are_not_silently_left_out_of_the_run(autorl_repo):
    repo = autorl_repo(tiny_train_py())
    (repo / "candidate" / "train.py").write_text(tiny_train_py() + "# my edit, not committed\n")
    line = one_line_error(run_daemon(repo, "run", "--env", "CartPole-v1", *QUICK, timeout=120))
    assert "uncommitted changes (candidate/train.py)" in line and "--from HEAD" in line
    assert no_run_started(repo)
    assert "my edit" in (repo / "candidate" / "train.py").read_text()  # nothing of the user's is touched


def test_an_existing_tag_is_refused_without_resume(autorl_repo):
    repo = autorl_repo(tiny_train_py())
    # a wide allowance: on 2 loaded cores torch's import and exit alone outlasted 5 + 3 s (CI, stop 42),
    # and this test is about the tag, not the budget (tests/test_budget.py holds train.py to it)
    first = run_daemon(repo, "run", "--env", "CartPole-v1", *NO_BUDGET, "--budget", "5", "--grace", "60",
                       timeout=240)
    assert first.returncode == 0, first.stderr[-2000:]
    rows = (repo / "results" / TAG / "results.tsv").read_text()
    line = one_line_error(run_daemon(repo, "run", "--env", "CartPole-v1", *NO_BUDGET, "--budget", "5", timeout=120))
    assert f"run {TAG!r} already exists" in line and "--resume" in line
    assert (repo / "results" / TAG / "results.tsv").read_text() == rows  # the first run's rows are kept


@pytest.mark.parametrize("budget", ["0.5", "1"])
def test_a_budget_too_short_to_train_at_all(autorl_repo, budget):
    repo = autorl_repo(tiny_train_py())
    line = one_line_error(run_daemon(repo, "run", "--env", "CartPole-v1", *NO_BUDGET, "--budget", budget,
                                     timeout=120))
    assert f"{budget} s is too short to train at all" in line and "seconds" in line
    assert no_run_started(repo)


def test_an_unknown_option_value_names_the_closest_choice(autorl_repo):
    repo = autorl_repo(tiny_train_py())
    result = run_daemon(repo, "run", "--env", "CartPole-v1", "--agent", "optina", timeout=120)
    line = one_line_error(result)
    assert result.returncode == 2 and "invalid choice: 'optina'" in line and "did you mean 'optuna'?" in line
    assert one_line_error(run_daemon(repo, "rnu", timeout=120)).endswith("(`python -m orchestrator --help` lists the options)")
    assert no_run_started(repo)


def test_the_modal_runner_without_a_token_names_modal_token_new(autorl_repo, tmp_path):
    repo = autorl_repo(tiny_train_py())
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "MODAL_TOKEN_ID": "", "MODAL_TOKEN_SECRET": "", "MODAL_CONFIG_PATH": str(home / "none")}
    line = one_line_error(run_daemon(repo, "run", "--env", "CartPole-v1", "--runner", "modal", *QUICK, env=env,
                                     timeout=120))
    assert "modal token new" in line
    assert no_run_started(repo)


def test_a_results_folder_that_cannot_be_written(autorl_repo):
    repo = autorl_repo(tiny_train_py())
    (repo / "results").write_text("a file where the results folder belongs\n")  # fails for root too
    line = one_line_error(run_daemon(repo, "run", "--env", "CartPole-v1", *QUICK, timeout=120))
    assert "cannot write the run folder" in line and "must be a folder you can write" in line
    assert not (repo / "runs" / TAG).exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a folder's permissions")
def test_a_results_folder_without_write_permission(autorl_repo):
    repo = autorl_repo(tiny_train_py())
    (repo / "results").mkdir()
    (repo / "results").chmod(0o555)
    try:
        line = one_line_error(run_daemon(repo, "run", "--env", "CartPole-v1", *QUICK, timeout=120))
    finally:
        (repo / "results").chmod(0o755)
    assert "cannot write the run folder" in line and "Permission denied" in line
