"""The translate phase: verification-gated keep, repair rounds, re-baseline, the schedule."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import git
import pytest

from tests.conftest import AUTORL_ROOT, FAST, read_results, run_daemon, tiny_train_py, write_replay


def summary_value(train_log: str, key: str) -> str:
    """A `key: value` line of train.py's closing summary (the last such line of the log)."""
    return re.findall(rf"^{key}: (.*)$", train_log, re.MULTILINE)[-1]

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


@pytest.mark.long
@pytest.mark.slow
def test_buggy_translation_is_repaired_kept_and_rebaselined(autorl_repo, tmp_path):
    repo = autorl_repo(train_py=small_real_train_py())
    slug_path = "envs_fast/translations/cliffwalking_v1.py"
    replay = write_replay(tmp_path / "replay", {
        1: {slug_path: buggy_cliffwalking(), "DESCRIPTION": "translate CliffWalking"},
    })
    write_replay(replay, {1: {}})
    (replay / "001.r1" / "envs_fast" / "translations").mkdir(parents=True)
    (replay / "001.r1" / slug_path).write_text((TRANSLATIONS / "cliffwalking_v1.py").read_text())
    (replay / "001.r1" / "DESCRIPTION").write_text("fix the cliff's last cell")

    proc = run_daemon(repo, "run", "--env", "CliffWalking-v1", "--tag", "t", "--agent", "replay",
                      "--replay-dir", str(replay), "--budget", "4", *FAST, "--grace", "30",
                      "--bench-seconds", "0.5", timeout=600)  # (a translation 8x as fast as envpool here)
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
    assert summary_value(rebaseline_log, "path") == "jax-e2e"
    assert summary_value(rebaseline_log, "backend").endswith(slug_path)


@pytest.mark.long
@pytest.mark.slow
def test_schedule_alternates_and_judges_translations(autorl_repo, tmp_path):
    # --no-setup-verify: nothing is verified when the run starts, so the incumbent backend is envpool
    repo = autorl_repo(train_py=tiny_train_py(BIAS=1.0))
    shipped = (AUTORL_ROOT / "envs_fast" / "translations" / "cartpole_v1.py").read_text()
    replay = write_replay(tmp_path / "replay", {
        # Correct (the shipped translation, edited) but slower than envpool at train.py's 8 envs.
        1: {"envs_fast/translations/cartpole_v1.py": shipped + "\n# a comment: the same dynamics\n", "DESCRIPTION": "jax cartpole"},
        2: {"candidate/train.py": tiny_train_py(BIAS=0.5), "DESCRIPTION": "bias 0.5"},
        3: {"candidate/train.py": tiny_train_py(BIAS=2.0), "DESCRIPTION": "bias 2.0"},
        # A translate proposal that also touches train.py: invalid, reverted.
        4: {"envs_fast/translations/cartpole_v1.py": shipped + "\n# v2\n", "candidate/train.py": tiny_train_py(BIAS=0.0),
            "DESCRIPTION": "translation plus a sneaky train.py change"},
        5: {"candidate/train.py": tiny_train_py(BIAS=0.0), "DESCRIPTION": "bias 0.0"},
    })
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "s", "--agent", "replay",
                      "--replay-dir", str(replay), "--budget", "2", "--phases", "translate,train",
                      "--schedule", "translate:1,train:2", "--no-setup-verify", *FAST, timeout=600)
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
    assert tip.tree["envs_fast/translations/cartpole_v1.py"].data_stream.read().decode() == shipped
    assert "# a comment" in repo_git.commit("refs/autorl/s/exp-0001").tree["envs_fast/translations/cartpole_v1.py"] \
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


RUST_CARTPOLE = AUTORL_ROOT / "envs_fast" / "translations" / "cartpole_v1.rs"


@pytest.mark.long
@pytest.mark.skipif(shutil.which("rustc") is None, reason="rustc not found on PATH")
@pytest.mark.slow
def test_buggy_rust_translation_is_repaired_kept_and_rebaselined(autorl_repo, tmp_path):
    repo = autorl_repo(train_py=small_real_train_py())
    # a checkout without the shipped Rust CartPole: the agent writes it; --no-setup-verify: the
    # incumbent is envpool (with the shipped JAX CartPole verified at setup, training end to end on it
    # is faster than any host backend, and the Rust translation would rightly be discarded)
    checkout = git.Repo(repo)
    checkout.index.remove(["envs_fast/translations/cartpole_v1.rs", "envs_fast/translations/cartpole_v1_sync.py"], working_tree=True)
    checkout.index.commit("no Rust CartPole yet")
    correct = RUST_CARTPOLE.read_text()
    buggy = correct.replace("const X_THRESHOLD: f64 = 2.4;", "const X_THRESHOLD: f64 = 2.5;")  # a boundary
    assert buggy != correct
    rust_path, sync_path = "envs_fast/translations/cartpole_v1.rs", "envs_fast/translations/cartpole_v1_sync.py"
    sync = (AUTORL_ROOT / sync_path).read_text()
    # the next translate experiment (exp 3; exp 2 is the re-baseline): the same port, correct but slower
    # (a busy loop in every step); --target-speedup: past the kept port's 100x translating goes on
    step = "fn step_env(_rng: &mut Rng, state: &mut [f64], action: &[f64], obs: &mut [f32]) -> (f64, bool) {\n"
    assert step in correct
    slower = correct.replace(step, step + "    for i in 0..50_000u32 { std::hint::black_box(i); }\n")
    replay = write_replay(tmp_path / "replay", {1: {rust_path: buggy, sync_path: sync, "DESCRIPTION": "CartPole in Rust"},
                                                3: {rust_path: slower, "DESCRIPTION": "a port that spins"}})
    write_replay(replay, {1: {}})
    (replay / "001.r1" / "envs_fast" / "translations").mkdir(parents=True)
    (replay / "001.r1" / rust_path).write_text(correct)
    (replay / "001.r1" / "DESCRIPTION").write_text("the cart's bound is 2.4")

    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "r", "--agent", "replay", "--replay-dir",
                      str(replay), "--budget", "4", "--translate-lang", "rust", "--phases", "translate",
                      "--target-speedup", "1e9", "--no-setup-verify", *FAST, "--grace", "30", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_results(repo, "r")
    assert list(rows.status) == ["baseline", "baseline", "keep", "baseline", "discard"], rows
    assert list(rows.phase) == ["train", "train", "translate", "train", "translate"]
    assert "after 1 repair round" in rows.iloc[2].description
    # The slower port is measured side by side with the kept one, which its snapshot holds beside it.
    run_dir = repo / "results" / "r"
    assert "not faster than the current backend" in rows.iloc[4].description
    assert "the kept Rust translation" in rows.iloc[4].description and "side by side" in rows.iloc[4].description
    pair = json.loads((run_dir / "exp-0003" / "bench-pair.json").read_text())["side_by_side"]
    assert pair[0]["backend"].endswith(rust_path) and pair[1]["backend"].endswith("incumbent/" + rust_path)
    assert len(pair[0]["round_train_sps"]) == len(pair[1]["round_train_sps"]) == 8
    slower_record = json.loads((run_dir / "exp-0003" / "translate.json").read_text())
    assert slower_record["speedup"] < 1 and slower_record["rounds"] == 8

    first = (run_dir / "exp-0001" / "verify.r0.log").read_text()
    assert "L2 interactions: FAIL" in first and "terminated" in first.split("differing fields", 1)[1]
    assert "L2 interactions: PASS" in (run_dir / "exp-0001" / "verify.r1.log").read_text()
    record = json.loads((run_dir / "exp-0001" / "translate.json").read_text())
    assert record["spec"] == rust_path and record["speedup_lower_bound"] > 1 and record["incumbent"] == "envpool"
    branch = git.Repo(repo).commit("autorl/r")
    assert branch.tree[rust_path].data_stream.read().decode() == correct
    # The re-baseline trained on the Rust backend, stepped from train.py's jax-host loop.
    rebaseline_log = (run_dir / "exp-0002" / "train.log").read_text()
    assert summary_value(rebaseline_log, "path") == "jax-host"
    assert summary_value(rebaseline_log, "backend").endswith("cartpole_v1.rs")


def test_a_translation_is_faster_only_beyond_its_side_by_side_benchmarks_noise():
    from orchestrator.phases import speedup_evidence

    def figures(rounds: list[float]) -> dict:
        return {"round_train_sps": rounds, "train_sps": sum(rounds) / len(rounds)}

    incumbent = figures([100.0] * 8)
    # two copies of one port, side by side on a loaded machine: round ratios scatter around 1
    scatter = [112.0, 91.0, 92.0, 105.0, 98.0, 101.0, 95.0, 104.0]
    speedup, lower, rounds = speedup_evidence(figures(scatter), incumbent)
    assert rounds == 8 and 0.95 < speedup < 1.05 and lower < 1.0   # a tie is not kept
    # 20% faster through the same scatter: kept
    speedup, lower, _ = speedup_evidence(figures([1.2 * x for x in scatter]), incumbent)
    assert 1.15 < speedup < 1.25 and lower > 1.0
    # 3% faster but inside the scatter: not shown
    assert speedup_evidence(figures([1.03 * x for x in scatter]), incumbent)[1] < 1.0
    # paired by round: a load that halves both figures in some rounds does not blur a steady 10%
    loaded = [1.0, 0.5, 1.0, 0.5, 0.6, 1.0, 0.7, 1.0]
    _, lower, _ = speedup_evidence(figures([110.0 * f for f in loaded]), figures([100.0 * f for f in loaded]))
    assert lower == pytest.approx(1.1)


def test_translate_lang_rust_without_rustc_is_refused_in_one_line(autorl_repo, tmp_path):
    repo = autorl_repo(train_py=tiny_train_py())
    bin_dir = tmp_path / "bin"  # PATH with python and git but no rustc
    bin_dir.mkdir()
    for tool in ("git",):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "n", "--agent", "replay", "--replay-dir",
                      str(tmp_path), "--translate-lang", "rust", *FAST, env={"PATH": str(bin_dir), "AUTORL_RUSTC": ""})
    assert proc.returncode != 0
    assert "rustc is not on PATH" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (repo / "results" / "n").exists()


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(shutil.which("rustc") is None, reason="rustc not found on PATH")
def test_a_bipedalwalker_port_with_a_physics_bug_fails_l2_then_its_repair_is_kept_and_trains_faster(
        autorl_repo, tmp_path):
    """The headline env's translate experiment end to end (issue 59; bench/bipedal_translate_repair.py
    runs it at a 60 s budget): the replay agent writes the Rust port with the terrain's friction
    wrong, the verifier at the daemon's own settings fails L2 naming the fields and the state, the
    repair (the shipped port) passes L1-L3 and is kept, and the next train experiment steps it."""
    rust_path, sync_path = "envs_fast/translations/bipedalwalker_v3.rs", "envs_fast/translations/bipedalwalker_v3_sync.py"
    repo = autorl_repo()
    checkout = git.Repo(repo)   # no BipedalWalker port yet: the incumbent is envpool
    checkout.index.remove([rust_path, sync_path, "envs_fast/translations/bipedalwalker_v3.py"], working_tree=True)
    checkout.index.commit("no BipedalWalker port yet")
    correct, sync = (AUTORL_ROOT / rust_path).read_text(), (AUTORL_ROOT / sync_path).read_text()
    buggy = correct.replace("const FRICTION: f64 = 2.5;", "const FRICTION: f64 = 2.0;")
    assert buggy != correct
    replay = write_replay(tmp_path / "replay", {1: {rust_path: buggy, sync_path: sync,
                                                    "DESCRIPTION": "BipedalWalker in Rust"}})
    write_replay(replay, {1: {}})
    (replay / "001.r1" / "envs_fast" / "translations").mkdir(parents=True)
    (replay / "001.r1" / rust_path).write_text(correct)
    (replay / "001.r1" / "DESCRIPTION").write_text("the terrain's friction is 2.5")

    proc = run_daemon(repo, "run", "--env", "BipedalWalker-v3", "--tag", "bw", "--agent", "replay",
                      "--replay-dir", str(replay), "--budget", "12", "--translate-lang", "rust",
                      "--phases", "translate,train", "--schedule", "translate:1,train:1", "--max-experiments", "2",
                      "--no-setup-verify", *FAST, "--grace", "30", timeout=1700)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_results(repo, "bw")
    assert list(rows.status) == ["baseline", "baseline", "keep", "baseline"], rows
    assert list(rows.phase) == ["train", "train", "translate", "train"]
    assert "after 1 repair round" in rows.iloc[2].description
    run_dir = repo / "results" / "bw"
    first = (run_dir / "exp-0001" / "verify.r0.log").read_text()
    assert "L2 interactions: FAIL" in first
    differing = first.split("differing fields", 1)[1]
    assert re.search(r"obs\[\d+\]: \S+ -> \S+", differing)      # the fields, reference -> port
    assert "state: " in differing and ".hull_angle=" in differing   # and the state they differ from
    repaired = (run_dir / "exp-0001" / "verify.r1.log").read_text()
    assert all(f"{level}: PASS" in repaired for level in ("L1 properties", "L2 interactions", "L3 rollouts"))
    record = json.loads((run_dir / "exp-0001" / "translate.json").read_text())
    assert record["incumbent"] == "envpool" and record["speedup_lower_bound"] > 1
    assert git.Repo(repo).commit("autorl/bw").tree[rust_path].data_stream.read().decode() == correct
    # the next train experiment steps the kept port from train.py's jax-host loop, faster than envpool
    rebaseline_log = (run_dir / "exp-0002" / "train.log").read_text()
    assert summary_value(rebaseline_log, "path") == "jax-host"
    assert summary_value(rebaseline_log, "backend").endswith("bipedalwalker_v3.rs")
    assert rows.iloc[3].sps > rows.iloc[:2].sps.mean(), rows
