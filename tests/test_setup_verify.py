"""Setup verifies what a checkout ships: before the baseline, a new run verifies (L1-L3) and benchmarks
the env's shipped translations (and gymnax) into its cache, so the baseline trains on the fastest
verified backend; a second run takes the records from the user-level cache instead."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import git
import pytest

from orchestrator.usercache import USER_CACHE_ENV, user_cache_dir
from tests.conftest import FAST, read_results, run_daemon

SHIPPED = ["envs_fast/translations/cartpole_v1.py"] + (["envs_fast/translations/cartpole_v1.rs"] if shutil.which("rustc") else []) + ["gymnax"]
# The real train.py, trained briefly: the baseline only has to show which path it took.
QUICK = ("--budget", "3", "--max-experiments", "0", *FAST, "--grace", "60")


def setup_run(repo, tag: str, user_cache, *extra: str, baseline_fails: bool = False):
    """A run on CartPole with the user-level cache `user_cache`; its folder, daemon.log and backend.json.
    `baseline_fails`: the commit's train.py exits at once (the run ends after its setup)."""
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", tag, *QUICK, *extra,
                      env={"AUTORL_USER_CACHE": str(user_cache)}, timeout=600)
    if baseline_fails:
        assert proc.returncode == 1 and "failed its baseline run" in proc.stderr, proc.stdout + proc.stderr
    else:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = repo / "results" / tag
    return run_dir, (run_dir / "daemon.log").read_text(), json.loads((run_dir / "backend.json").read_text())


def commit_file(repo, rel: str, text: str, message: str) -> None:
    (repo / rel).write_text(text)
    git.Repo(repo).git.commit("-am", message)


def verdicts(run_dir) -> dict[str, bool]:
    """The run cache's verdicts, by spec (a translation by its file name)."""
    found = {}
    for path in (run_dir / "verify-cache").glob("verdict-*.json"):
        record = json.loads(path.read_text())
        found[record["spec"].split("/")[-1]] = record["passed"]
    return found


def train_summary(train_log) -> dict:
    """The `key: value` lines train.py prints after its `---`."""
    tail = train_log.read_text().split("\n---\n")[-1]
    return dict(line.split(": ", 1) for line in tail.splitlines() if ": " in line)


@pytest.mark.long
@pytest.mark.slow
def test_setup_verifies_what_ships_reuses_it_next_time_and_falls_back_from_a_broken_translation(
        autorl_repo, tmp_path):
    repo, user_cache = autorl_repo(), tmp_path / "fresh-user-cache"  # nothing verified yet
    train_py, jax_cartpole = (repo / "candidate" / "train.py").read_text(), (repo / SHIPPED[0]).read_text()
    run_dir, log, choice = setup_run(repo, "first", user_cache)

    # Every shipped backend was verified by the runner (its report is kept) into the run's cache.
    assert verdicts(run_dir) == {spec.split("/")[-1]: True for spec in SHIPPED}
    for spec in SHIPPED:
        assert "PASS" in (run_dir / "setup" / spec.split("/")[-1] / "verify.r0.log").read_text()
        assert f"setup: {spec} verified L1-L3" in log
    # each level's line reached the daemon's log as it ended, with its time and figures (under nohup the
    # log is all a user sees of a setup's minutes)
    for level in (1, 2, 3):
        assert re.search(rf"INFO setup .*: verify L{level} [^\n]*: pass in \d+ s \(\d+/\d+ checks", log), log
    assert choice["backend"] in SHIPPED and choice["path"] == "jax-e2e"
    assert "verified L1-L3" in choice["why"] and "at setup" in choice["why"] and "train sps" in choice["why"]
    assert f"training backend: {choice['backend']} (verified L1-L3" in log
    # They were benchmarked side by side: one process, one reference figure for all.
    side = json.loads((run_dir / "setup" / "bench.json").read_text())["side_by_side"]
    assert [r["backend"].split("/")[-1] for r in side] == [spec.split("/")[-1] for spec in SHIPPED]
    assert len({r["reference_sps"] for r in side}) == 1 and all(r["train_sps"] > 0 for r in side), side
    # Both baseline runs trained on it, end to end.
    for train_log in (run_dir / "exp-0000" / "train.log", run_dir / "exp-0000" / "run-2" / "train.log"):
        summary = train_summary(train_log)
        assert summary["path"] == "jax-e2e" and summary["backend"].endswith(choice["backend"]), summary
    status = run_daemon(repo, "status", "--tag", "first")
    assert f"training backend: {choice['backend']}" in status.stdout
    # A resumed run does not set up again: it reads the choice it made.
    resumed = run_daemon(repo, "run", "--tag", "first", "--resume", "--max-experiments", "0",
                         env={"AUTORL_USER_CACHE": str(user_cache)})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    after = (run_dir / "daemon.log").read_text().split("resuming run first")[1]
    assert "(chosen at setup)" in after and "setup: " not in after

    # A night --from an earlier commit, by a daemon whose checkout has moved on since (a module of
    # envs_fast edited, as after a pull): records are named by the envs_fast the run's processes
    # import, not the daemon's, so the first run's verdicts apply and it trains on what they verified.
    first_commit = git.Repo(repo).head.commit.hexsha
    report_py = (repo / "envs_fast" / "verify" / "report.py").read_text()
    commit_file(repo, "envs_fast/verify/report.py", report_py + "\n# edited after the first run\n", "edit envs_fast")
    older_dir, older_log, older = setup_run(repo, "older", user_cache, "--from", first_commit)
    for spec in SHIPPED:
        assert re.search(rf"INFO setup: {re.escape(spec)}: verified L1-L3.* by an earlier run \(user cache\)",
                         older_log), older_log
    assert "verifying" not in older_log, older_log
    assert older["backend"] == choice["backend"], older
    assert train_summary(older_dir / "exp-0000" / "train.log")["path"] == "jax-e2e"
    commit_file(repo, "envs_fast/verify/report.py", report_py, "undo the edit")

    # The next run on the same content takes every record from the user cache: nothing is verified or
    # benchmarked. (Its train.py has the same hyperparameters but stops at once: only setup matters here.)
    commit_file(repo, "candidate/train.py", "raise SystemExit('stop after setup')\n" + train_py, "stop at once")
    again_dir, again_log, again = setup_run(repo, "again", user_cache, baseline_fails=True)
    assert verdicts(again_dir) == verdicts(run_dir)
    assert not list((again_dir / "setup").glob("*/verify.r0.log")) and not list((again_dir / "setup").rglob("bench.json"))
    reused = [line.split("INFO setup: ")[1] for line in again_log.splitlines() if "INFO setup: " in line]
    assert len(reused) == len(SHIPPED), reused
    for spec, line in zip(SHIPPED, reused):
        assert line.startswith(f"{spec}: verified L1-L3") and line.endswith("by an earlier run (user cache)")
    assert "gymnax: verified L1-L3 (statistically only: state not synced)" in again_log
    assert again["backend"] == choice["backend"] and again["setup_seconds"] < 15, again

    # A changed constant in the JAX translation: only it is verified again, fails with its report, and
    # training falls back to the other verified backends (still from the user cache).
    commit_file(repo, "candidate/train.py", train_py, "train again")
    commit_file(repo, SHIPPED[0], jax_cartpole.replace("TAU = 0.02 ", "TAU = 0.021 "), "a changed constant")
    broken_dir, broken_log, broken = setup_run(repo, "broken", user_cache)
    report = broken_dir / "setup" / "cartpole_v1.py" / "verify.r0.log"
    assert "L2 interactions: FAIL" in report.read_text()
    line = next(line for line in broken_log.splitlines() if f"{SHIPPED[0]} FAILED verification" in line)
    assert f"(report {report})" in line and "[FAIL]" in line and "training falls back" in line
    # the failure is a verdict too, kept with its reason
    assert verdicts(broken_dir) == {"cartpole_v1.py": False, **{spec.split("/")[-1]: True for spec in SHIPPED[1:]}}
    assert broken_log.count("by an earlier run (user cache)") >= len(SHIPPED) - 1
    assert broken["backend"] in SHIPPED[1:]
    failed = next(b for b in broken["backends"] if b["backend"] == SHIPPED[0])
    assert failed["passed"] is False and "[FAIL]" in failed["how"]
    assert train_summary(broken_dir / "exp-0000" / "train.log")["backend"].endswith(broken["backend"])
    assert list(read_results(repo, "broken").status) == ["baseline", "baseline"]

    # The next run on the same broken content does not pay for its verification again: the failed verdict
    # comes from the user cache, with the check that failed.
    _, again_broken_log, again_broken = setup_run(repo, "broken-again", user_cache)
    assert "verifying" not in again_broken_log, again_broken_log
    line = next(line for line in again_broken_log.splitlines() if f"setup: {SHIPPED[0]}: verification failed" in line)
    assert "by an earlier run (user cache)" in line and "L2 interactions: " in line and "not verified again" in line
    assert again_broken["backend"] == broken["backend"]


def test_no_setup_verify_trains_on_what_needs_no_verdict(autorl_repo, user_verify_cache):
    repo = autorl_repo()
    run_dir, log, choice = setup_run(repo, "plain", user_verify_cache, "--no-setup-verify")
    assert "setup verification skipped: --no-setup-verify" in log and choice["backend"] == "auto"
    assert not (run_dir / "setup").exists() and not list((run_dir / "verify-cache").glob("verdict-*"))
    assert train_summary(run_dir / "exp-0000" / "train.log")["path"] == "jax-host"
    assert json.loads((run_dir / "run.json").read_text())["setup_verify"] is False


def test_the_user_cache_is_where_the_user_says(tmp_path):
    home = Path.home()
    assert user_cache_dir({USER_CACHE_ENV: str(tmp_path / "mine")}) == tmp_path / "mine"
    assert user_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "autorl" / "verify"
    assert user_cache_dir({}) == home / ".cache" / "autorl" / "verify"


@pytest.mark.skipif(not shutil.which("rustc"), reason="rustc not found on PATH")
def test_a_physics_scenes_jax_port_is_verified_at_setup_only_where_training_has_a_gpu(autorl_repo):
    """BipedalWalker ships a Rust and a JAX port: on a CPU the JAX one (~50x slower there, over an hour to
    verify) is left out; where training has a GPU (a Modal container's environment) setup verifies both.
    A scene without a physics engine keeps both translations on any machine."""
    from orchestrator.shipped import shipped_specs
    from orchestrator.workspace import Workspace

    repo = autorl_repo()
    workspace = Workspace(repo, "specs")
    commit = workspace.start_commit()
    cpu = {"machine": {"cpu": "x", "cpus": 2, "arch": "x86_64", "gpus": ""}}
    h100 = {"machine": {"cpu": "x", "cpus": 8, "arch": "x86_64", "gpus": "NVIDIA H100 80GB HBM3"}}
    assert shipped_specs("BipedalWalker-v3", workspace, commit, cpu) == ["envs_fast/translations/bipedalwalker_v3.rs"]
    assert shipped_specs("BipedalWalker-v3", workspace, commit, h100) == [
        "envs_fast/translations/bipedalwalker_v3.py", "envs_fast/translations/bipedalwalker_v3.rs"]
    assert shipped_specs("CartPole-v1", workspace, commit, cpu)[:2] == [
        "envs_fast/translations/cartpole_v1.py", "envs_fast/translations/cartpole_v1.rs"]
