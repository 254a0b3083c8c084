"""A scratch checkout of autorl for a daemon run that must not touch this one: the harness files,
envs_fast and program.md copied into a fresh git repository, the daemon run from this tree's
orchestrator package. Used by the tests and by bench scripts that build a night by hand
(bench/bipedal_translate_repair.py)."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import git

AUTORL_ROOT = Path(__file__).resolve().parents[2]
HARNESS_FILES = ("evaluate.py", "train_plumbing.py", "policy_export.py", "program.md", "envs_fast", "pyproject.toml",
                 "modal_app.py")


def make_checkout(root: Path, train_py: str | None = None, files: dict[str, str] | None = None) -> Path:
    """A committed checkout of autorl at `root` on branch main: the harness, envs_fast, program.md, the
    given train.py (the shipped one by default) and extra files {relative path: text}."""
    root.mkdir(parents=True)
    for item in HARNESS_FILES:
        _copy_if_present(item, root)
    (root / "candidate").mkdir()
    if train_py is None:
        shutil.copyfile(AUTORL_ROOT / "candidate" / "train.py", root / "candidate" / "train.py")
    else:
        (root / "candidate" / "train.py").write_text(train_py)
    (root / ".gitignore").write_text("__pycache__/\n*.pyc\nruns/\nresults/\nout/\n")
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "autorl-tests")
        config.set_value("user", "email", "tests@localhost")
    repo.git.add("-A")
    repo.index.commit("initial checkout")
    return root


def _copy_if_present(name: str, dest: Path) -> None:
    source = AUTORL_ROOT / name
    if source.is_dir():
        shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    elif source.is_file():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest / name)


def daemon_env(extra: dict | None = None) -> dict:
    """This environment for the daemon in a scratch checkout: the orchestrator package from this
    tree (the checkout has none), and no API key this shell may hold, so no run calls a remote model.
    Unlike rescoring.embedded_agent_env it keeps AUTORL_ settings: tests hand the daemon theirs
    (e.g. a private AUTORL_VERIFY_CACHE) through the environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "PYTHONPATH")}
    env["PYTHONPATH"] = str(AUTORL_ROOT)
    env.update(extra or {})
    return env


def daemon_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", *args]


def write_replay(root: Path, steps: dict[int, dict]) -> Path:
    """Replay folders: steps = {1: {"candidate/train.py": text, "DESCRIPTION": "..."}, ...}."""
    root.mkdir(parents=True, exist_ok=True)
    for exp, files in steps.items():
        for rel, text in files.items():
            path = root / f"{exp:03d}" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root


def read_results(repo: Path, tag: str):
    import pandas as pd

    return pd.read_csv(repo / "results" / tag / "results.tsv", sep="\t", dtype={"commit": str})
