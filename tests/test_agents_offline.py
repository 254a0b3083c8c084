"""The offline agents: optuna (edits only the hyperparameter block, its study survives a resume)
and replay (snapshots in order, then the end of the run)."""
from __future__ import annotations

import json
import re
from argparse import Namespace

import git
import optuna
import pytest
from optuna.trial import TrialState

from orchestrator.agents import make_agent
from orchestrator.agents.base import AgentContext, NoMoreProposals, Outcome
from orchestrator.agents.hyperparameter_block import NoHyperparameterBlock, read_block, write_block
from orchestrator.agents.search_space import search_space
from orchestrator.agents.optuna_agent import OptunaAgent
from orchestrator.agents.replay import ReplayAgent
from orchestrator.config import default_tag
from tests.conftest import TINY_TRAIN_PY, FAST, read_results, run_daemon, write_replay

TUNED = ("LEARNING_RATE", "GAMMA", "ENT_COEF")


def _block_lines(diff: str) -> list[str]:
    return [line[1:] for line in diff.splitlines()
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


@pytest.mark.long
@pytest.mark.slow
def test_default_offline_run_with_the_real_train_py_and_study_resume(autorl_repo):
    """The README's first command, shortened: no API key -> optuna; then --resume continues the study."""
    repo = autorl_repo()  # the real candidate/train.py
    # 16 s: the budget counts train.py's whole process (start-up included): 3 s left nothing to train, and
    # 8 s and 12 s nothing either while other tests load the machine (torch's and envpool's imports took
    # the whole 12 s once); --no-setup-verify: envpool from the host (the jax-host path)
    args = ("run", "--env", "CartPole-v1", "--budget", "16", "--optuna-params", ",".join(TUNED), "--no-setup-verify",
            *FAST, "--grace", "20")
    first = run_daemon(repo, *args, "--max-experiments", "1", timeout=240)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "agent: optuna (ANTHROPIC_API_KEY is not set" in first.stdout
    tag = default_tag("CartPole-v1")
    rows = read_results(repo, tag)
    assert rows["exp"].tolist() == [0, 0, 1]
    assert set(rows["status"][2:]) <= {"keep", "discard"}
    assert rows["score"].notna().all() and (rows["env_steps"] > 0).all()

    resumed = run_daemon(repo, "run", "--env", "CartPole-v1", "--resume", "--max-experiments", "2", timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = read_results(repo, tag)
    assert rows["exp"].tolist() == [0, 0, 1, 2]

    # Each experiment's commit changes only tuned constants of the hyperparameter block.
    main = git.Repo(repo)
    for commit in rows["commit"][2:]:
        changed = _block_lines(main.git.diff(f"{commit}~1", commit))
        assert changed, commit
        assert all(re.match(rf"({'|'.join(TUNED)}) = [-0-9.e]+  # ", line) for line in changed), changed
    assert main.git.diff("main", f"autorl/{tag}", "--name-only") in ("", "candidate/train.py")

    # The study: the baseline as a known trial, then one trial per experiment, told its score.
    study = optuna.load_study(study_name="autorl", storage=f"sqlite:///{repo / 'results' / tag / 'optuna.db'}")
    trials = study.get_trials()
    assert [t.user_attrs.get("exp") for t in trials] == [0, 1, 2]
    assert trials[0].value == pytest.approx(rows["score"][:2].mean(), abs=1e-3)
    for trial, (_, row) in zip(trials[1:], rows[2:].iterrows()):
        assert trial.state == TrialState.COMPLETE and trial.value == pytest.approx(row["score"], abs=1e-3)
        assert trial.user_attrs["status"] == row["status"]
        assert set(trial.params) == set(TUNED)

    # The morning's learning curves: in report.html, and one TensorBoard event file per train run
    # (both baseline runs, each experiment) that tensorboard's own reader loads.
    run_dir = repo / "results" / tag
    page = (run_dir / "report.html").read_text()
    assert 'alt="learning curves"' in page and "data:image/png;base64," in page
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scores = {"exp-0000-run-1": json.loads((run_dir / "exp-0000" / "eval.json").read_text())["mean"],
              "exp-0000-run-2": json.loads((run_dir / "exp-0000" / "run-2" / "eval.json").read_text())["mean"],
              "exp-0001": rows["score"][2], "exp-0002": rows["score"][3]}
    folders = sorted(p.name for p in (run_dir / "tensorboard").iterdir())
    assert folders == ["exp-0000-run-1", "exp-0000-run-2", "exp-0001", "exp-0002"]
    for name in folders:
        assert len(list((run_dir / "tensorboard" / name).glob("events.out.tfevents.*"))) == 1
        events = EventAccumulator(str(run_dir / "tensorboard" / name))
        events.Reload()
        returns = events.Scalars("return")
        assert returns and returns[-1].step > 0 and returns == sorted(returns, key=lambda e: e.step)
        assert [e.value for e in events.Scalars("score")] == pytest.approx([scores[name]], abs=1e-3)


def _context(worktree, run_dir, exp):
    exp_dir = run_dir / f"exp-{exp:04d}"
    exp_dir.mkdir(parents=True, exist_ok=True)
    return AgentContext(phase="train", exp=exp, env_id="CartPole-v1", worktree=worktree, run_dir=run_dir,
                        exp_dir=exp_dir, program="", allowed_paths=["candidate/train.py"])


def test_optuna_agent_edits_the_block_and_fails_unfinished_trials(tmp_path):
    worktree = tmp_path / "wt"
    (worktree / "candidate").mkdir(parents=True)
    train_py = worktree / "candidate" / "train.py"
    train_py.write_text(TINY_TRAIN_PY)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    agent = OptunaAgent(run_dir, seed=0)
    proposal = agent.propose(_context(worktree, run_dir, 1))
    assert proposal.description.startswith("optuna trial 0: ")
    new = read_block(train_py.read_text())
    old = read_block(TINY_TRAIN_PY)
    assert [c.name for c in new] == [c.name for c in old]
    assert next(c for c in new if c.name == "BACKEND").value == "auto"  # strings are never tuned
    assert next(c for c in new if c.name == "NUM_ENVS").value in (2, 4, 8, 16, 32)
    # Lines outside the block are untouched; comments kept.
    outside = [line for line in train_py.read_text().splitlines() if "=" in line and "#" not in line]
    assert outside == [line for line in TINY_TRAIN_PY.splitlines() if "=" in line and "#" not in line]
    assert "# 0.0 balances the pole" in train_py.read_text()
    agent.tell(_context(worktree, run_dir, 1), Outcome("crash", None, 10.0))
    agent.propose(_context(worktree, run_dir, 2))  # the daemon dies before telling this one
    reborn = OptunaAgent(run_dir, seed=0)
    states = [t.state for t in reborn.study.get_trials()]
    assert states == [TrialState.FAIL, TrialState.FAIL]


def test_hyperparameter_block_parsing_and_rewriting():
    text = "x = 1\n# >>> hyperparameters\nLR = 3e-4  # rate\nFLAG = True\nNAME = 'a'\n# <<< hyperparameters\n"
    assert {c.name: c.value for c in read_block(text)} == {"LR": 3e-4, "FLAG": True, "NAME": "a"}
    assert write_block(text, {"LR": 0.00123456, "FLAG": False}) == text.replace("3e-4", "0.001235").replace(
        "True", "False")
    assert set(search_space(read_block(text))) == {"LR", "FLAG"}
    with pytest.raises(NoHyperparameterBlock, match="# >>> hyperparameters"):
        read_block("LR = 1\n")


def test_replay_agent_applies_snapshots_in_order_then_ends(tmp_path):
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": "one\n", "DESCRIPTION": "first step\nignored", "COST_USD": "0.25"},
        2: {"candidate/new_module.py": "two\n"},
    })
    worktree = tmp_path / "wt"
    worktree.mkdir()
    agent = make_agent(Namespace(agent="replay", replay_dir=str(replay)), tmp_path)
    assert isinstance(agent, ReplayAgent)
    first = agent.propose(_context(worktree, tmp_path / "run", 1))
    assert (first.description, first.cost_usd) == ("first step", 0.25)
    assert (worktree / "candidate" / "train.py").read_text() == "one\n"
    assert not (worktree / "DESCRIPTION").exists() and not (worktree / "COST_USD").exists()
    second = agent.propose(_context(worktree, tmp_path / "run", 2))
    assert second.description == "replay 002" and (worktree / "candidate" / "new_module.py").exists()
    with pytest.raises(NoMoreProposals):
        agent.propose(_context(worktree, tmp_path / "run", 3))
    with pytest.raises(ValueError, match="--replay-dir"):
        make_agent(Namespace(agent="replay", replay_dir=None), tmp_path)


def test_replay_without_dir_is_a_clear_error_before_anything_starts(autorl_repo):
    repo = autorl_repo(TINY_TRAIN_PY)
    result = run_daemon(repo, "run", "--env", "CartPole-v1", "--agent", "replay", timeout=60)
    assert result.returncode == 1 and "--replay-dir" in result.stderr
    assert not (repo / "runs").exists() and list((repo / "results").glob("*")) == []  # nothing half-made
    bad_env = run_daemon(repo, "run", "--env", "NoSuchEnv-v9", timeout=60)
    assert bad_env.returncode == 1 and "NoSuchEnv-v9" in bad_env.stderr
