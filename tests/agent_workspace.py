"""A small real git worktree and AgentContext for the agent tests."""
from __future__ import annotations

from pathlib import Path

import git

from orchestrator.agents.base import AgentContext

TRAIN_PY = """\
import os
# >>> hyperparameters
LEARNING_RATE = 3e-4  # Adam
NUM_ENVS = 8  # parallel environments
# <<< hyperparameters
print("---")
print("env_steps: 0")
"""
PROGRAM_MD = "# program\nMake CartPole learn faster. PROGRAM-MARKER\n"
EVALUATE_PY = "TIME_BUDGET = 720  # the fixed harness\n"


def make_worktree(root: Path) -> Path:
    worktree = root / "worktree"
    (worktree / "candidate").mkdir(parents=True)
    (worktree / "candidate" / "train.py").write_text(TRAIN_PY)
    (worktree / "evaluate.py").write_text(EVALUATE_PY)
    (worktree / "program.md").write_text(PROGRAM_MD)
    (worktree / ".gitignore").write_text("__pycache__/\n")
    repo = git.Repo.init(worktree)
    with repo.config_writer() as config:
        config.set_value("user", "name", "test")
        config.set_value("user", "email", "test@example.com")
    repo.index.add(["candidate/train.py", "evaluate.py", "program.md", ".gitignore"])
    repo.index.commit("start")
    return worktree


def make_context(root: Path, exp: int = 1, worktree: Path | None = None, **overrides) -> AgentContext:
    worktree = worktree or make_worktree(root)
    run_dir = root / "results" / "test-run"
    exp_dir = run_dir / f"exp-{exp:04d}"
    exp_dir.mkdir(parents=True, exist_ok=True)
    fields = dict(
        phase="train", exp=exp, env_id="CartPole-v1", worktree=worktree, run_dir=run_dir,
        exp_dir=exp_dir, program=PROGRAM_MD, allowed_paths=["candidate/train.py"],
        results_table="exp status score\n0 baseline 21.5  RESULTS-MARKER",
        last_failure="Traceback: FAILURE-MARKER", notes_path=run_dir / "notes.md",
    )
    fields.update(overrides)
    return AgentContext(**fields)
