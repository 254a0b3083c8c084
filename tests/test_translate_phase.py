"""The translate phase: verification-gated keep, repair rounds, re-baseline, the schedule."""
from __future__ import annotations

import json
import re
from pathlib import Path

import git

from tests.conftest import AUTORL_ROOT, FAST, read_results, run_daemon, tiny_train_py, write_replay

TRANSLATIONS = Path(__file__).resolve().parent / "translations"


def small_real_train_py() -> str:
    """The real train.py with a rollout small enough for a few seconds of budget."""
    text = (AUTORL_ROOT / "candidate" / "train.py").read_text()
    for name, value in (("NUM_ENVS", 256), ("NUM_STEPS", 16), ("UPDATE_EPOCHS", 2), ("NUM_MINIBATCHES", 4)):
        text, count = re.subn(rf"^{name} = \S+", f"{name} = {value}", text, flags=re.MULTILINE)
        assert count == 1
    return text


def buggy_cliffwalking() -> str:
    """The correct translation with a seeded bug: the cliff ends one cell early."""
    correct = (TRANSLATIONS / "cliffwalking_v1.py").read_text()
    buggy = correct.replace("(col <= COLS - 2)", "(col <= COLS - 3)")
    assert buggy != correct
    return buggy


def test_buggy_translation_is_repaired_kept_and_rebaselined(autorl_repo, tmp_path):
    repo = autorl_repo(train_py=small_real_train_py())
    slug_path = "envs_fast/cliffwalking_v1.py"
    replay = write_replay(tmp_path / "replay", {
        1: {slug_path: buggy_cliffwalking(), "DESCRIPTION": "translate CliffWalking"},
    })
    write_replay(replay, {1: {}})
    (replay / "001.r1" / "envs_fast").mkdir(parents=True)
    (replay / "001.r1" / slug_path).write_text((TRANSLATIONS / "cliffwalking_v1.py").read_text())
    (replay / "001.r1" / "DESCRIPTION").write_text("fix the cliff's last cell")

    proc = run_daemon(repo, "run", "--env", "CliffWalking-v1", "--tag", "t", "--agent", "replay",
                      "--replay-dir", str(replay), "--budget", "4", *FAST, "--grace", "30", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_results(repo, "t")
    assert list(rows.status) == ["baseline", "baseline", "keep", "baseline"]
    assert list(rows.phase) == ["train", "train", "translate", "train"]
    assert list(rows.exp) == [0, 0, 1, 2]
    translate, rebaseline = rows.iloc[2], rows.iloc[3]
    assert "after 1 repair round" in translate.description and "x the reference env" in translate.description
    assert translate.sps > 0
    assert "re-baseline" in rebaseline.description
    assert rebaseline.best == rebaseline.score  # later experiments compare with the new backend's score

    run_dir = repo / "results" / "t"
    first_log = (run_dir / "exp-0001" / "verify.r0.log").read_text()
    assert "L2 interactions: FAIL" in first_log and "differing fields" in first_log
    assert json.loads((run_dir / "exp-0001" / "verify.r0.json").read_text())["passed"] is False
    assert "L2 interactions: PASS" in (run_dir / "exp-0001" / "verify.r1.log").read_text()
    assert json.loads((run_dir / "exp-0001" / "verify.json").read_text())["passed"] is True  # the last round
    record = json.loads((run_dir / "exp-0001" / "translate.json").read_text())
    # The incumbent is what the baseline trained on (envpool has CliffWalking), measured side by side.
    baseline_backend = "envpool" if "backend: envpool" in (run_dir / "exp-0000" / "train.log").read_text() \
        else "gymnasium vector env"
    assert record["incumbent"] == baseline_backend and record["speedup"] > 1

    # The branch tip holds the repaired translation; each repair round was a commit.
    branch = git.Repo(repo).commit("autorl/t")
    assert branch.tree[slug_path].data_stream.read().decode() == (TRANSLATIONS / "cliffwalking_v1.py").read_text()
    assert "repair round 1" in branch.message
    assert branch.parents[0].tree[slug_path].data_stream.read().decode() == buggy_cliffwalking()
    # The re-baseline trained on the verified JAX backend, end to end, not on gymnasium.
    rebaseline_log = (run_dir / "exp-0002" / "train.log").read_text()
    assert "path: jax-e2e" in rebaseline_log and f"{slug_path}\n" in rebaseline_log.split("backend: ")[-1]


def test_schedule_alternates_and_judges_translations(autorl_repo, tmp_path):
    repo = autorl_repo(train_py=tiny_train_py(BIAS=1.0))
    shipped = (AUTORL_ROOT / "envs_fast" / "cartpole_v1.py").read_text()
    replay = write_replay(tmp_path / "replay", {
        # Correct (the shipped translation, edited) but slower than envpool at train.py's 8 envs.
        1: {"envs_fast/cartpole_v1.py": shipped + "\n# a comment: the same dynamics\n", "DESCRIPTION": "jax cartpole"},
        2: {"candidate/train.py": tiny_train_py(BIAS=0.5), "DESCRIPTION": "bias 0.5"},
        3: {"candidate/train.py": tiny_train_py(BIAS=2.0), "DESCRIPTION": "bias 2.0"},
        # A translate proposal that also touches train.py: invalid, reverted.
        4: {"envs_fast/cartpole_v1.py": shipped + "\n# v2\n", "candidate/train.py": tiny_train_py(BIAS=0.0),
            "DESCRIPTION": "translation plus a sneaky train.py change"},
        5: {"candidate/train.py": tiny_train_py(BIAS=0.0), "DESCRIPTION": "bias 0.0"},
    })
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "s", "--agent", "replay",
                      "--replay-dir", str(replay), "--budget", "2", "--phases", "translate,train",
                      "--schedule", "translate:1,train:2", *FAST, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_results(repo, "s")
    experiments = rows[rows.exp > 0]
    assert list(experiments.phase) == ["translate", "train", "train", "translate", "train"]
    assert list(experiments.status) == ["discard", "keep", "discard", "invalid", "keep"]
    slower = experiments.iloc[0]
    assert "not faster than the current backend" in slower.description and "envpool" in slower.description
    assert "verified L1-L3" in slower.description
    invalid = experiments.iloc[3]
    assert "candidate/train.py" in invalid.description
    # Neither translation reached the branch; both stay reachable under their refs.
    repo_git = git.Repo(repo)
    tip = repo_git.commit("autorl/s")
    assert tip.tree["envs_fast/cartpole_v1.py"].data_stream.read().decode() == shipped
    assert "# a comment" in repo_git.commit("refs/autorl/s/exp-0001").tree["envs_fast/cartpole_v1.py"] \
        .data_stream.read().decode()
    assert repo_git.commit("refs/autorl/s/exp-0004")


def test_default_phases_follow_the_agent():
    from orchestrator.config import Options
    from orchestrator.setup import schedule_for as _schedule

    assert _schedule(Options(), "anthropic") == ["translate", "train", "train", "train", "train"]
    assert _schedule(Options(), "command") == ["translate", "train", "train", "train", "train"]
    assert _schedule(Options(), "optuna") == ["train"]
    assert _schedule(Options(phases="train"), "anthropic") == ["train"]
    assert _schedule(Options(phases="translate,train", schedule="translate:2,train:1"), "optuna") == \
        ["translate", "translate", "train"]
