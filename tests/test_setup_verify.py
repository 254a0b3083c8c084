"""Setup verifies what a checkout ships: before the baseline, a new run verifies (L1-L3) and benchmarks
the env's shipped translations (and gymnax) into its cache, so the baseline trains on the fastest
verified backend; a second run takes the records from the user-level cache instead."""
from __future__ import annotations

import json
import shutil
import time

import git

from tests.conftest import FAST, read_results, run_daemon

SHIPPED = ["envs_fast/cartpole_v1.py"] + (["envs_fast/cartpole_v1.rs"] if shutil.which("rustc") else []) + ["gymnax"]
# The real train.py, trained briefly: the baseline only has to show which path it took.
QUICK = ("--budget", "3", "--max-experiments", "0", *FAST, "--grace", "60")


def setup_run(repo, tag: str, user_cache, *extra: str):
    """A run on CartPole with the user-level cache `user_cache` (the tests' session cache:
    conftest's user_verify_cache, content-keyed, so sharing it is what a user gets)."""
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", tag, *QUICK, *extra,
                      env={"AUTORL_USER_CACHE": str(user_cache)}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = repo / "results" / tag
    return run_dir, (run_dir / "daemon.log").read_text(), json.loads((run_dir / "backend.json").read_text())


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


def test_a_new_run_verifies_what_it_ships_and_the_next_run_reuses_it(autorl_repo, tmp_path):
    repo, user_cache = autorl_repo(), tmp_path / "fresh-user-cache"  # nothing verified yet
    run_dir, log, choice = setup_run(repo, "first", user_cache)

    # Every shipped backend was verified by the runner (its report is kept) into the run's cache.
    assert verdicts(run_dir) == {spec.split("/")[-1]: True for spec in SHIPPED}
    for spec in SHIPPED:
        assert "PASS" in (run_dir / "setup" / spec.split("/")[-1] / "verify.r0.log").read_text()
        assert f"setup: {spec} verified L1-L3" in log
    assert choice["backend"] in SHIPPED and choice["path"] == "jax-e2e"
    assert "verified L1-L3 at setup" in choice["why"] and "train sps" in choice["why"]
    assert f"training backend: {choice['backend']} (verified L1-L3 at setup" in log
    # The baseline trained on it, end to end, in both runs.
    for train_log in (run_dir / "exp-0000" / "train.log", run_dir / "exp-0000" / "run-2" / "train.log"):
        summary = train_summary(train_log)
        assert summary["path"] == "jax-e2e" and summary["backend"].endswith(choice["backend"]), summary
    status = run_daemon(repo, "status", "--tag", "first")
    assert f"training backend: {choice['backend']}" in status.stdout

    # The second run on the same content: every record comes from the user cache, nothing is verified.
    started = time.monotonic()
    second_dir, second_log, second = setup_run(repo, "second", user_cache)
    assert verdicts(second_dir) == verdicts(run_dir)
    assert not list((second_dir / "setup").glob("*/verify.r0.log"))
    assert not list((second_dir / "setup").glob("*/bench.json"))
    assert [line.split("setup: ")[1] for line in second_log.splitlines() if "INFO setup: " in line] == \
        [f"{spec}: verified L1-L3 by an earlier run (user cache)" for spec in SHIPPED]
    assert second["backend"] == choice["backend"] and second["setup_seconds"] < 15, second
    assert time.monotonic() - started < 240


def test_no_setup_verify_keeps_the_host_path(autorl_repo, user_verify_cache):
    repo = autorl_repo()
    run_dir, log, choice = setup_run(repo, "plain", user_verify_cache, "--no-setup-verify")
    assert "setup verification skipped: --no-setup-verify" in log and choice["backend"] == "auto"
    assert not (run_dir / "setup").exists() and not list((run_dir / "verify-cache").glob("verdict-*"))
    assert train_summary(run_dir / "exp-0000" / "train.log")["path"] == "host"
    assert json.loads((run_dir / "run.json").read_text())["setup_verify"] is False


def test_a_broken_shipped_translation_fails_setup_and_training_falls_back(autorl_repo, user_verify_cache):
    repo = autorl_repo()
    path = repo / "envs_fast" / "cartpole_v1.py"
    path.write_text(path.read_text().replace("TAU = 0.02 ", "TAU = 0.021 "))
    git.Repo(repo).git.commit("-am", "a changed constant in the JAX CartPole")

    run_dir, log, choice = setup_run(repo, "broken", user_verify_cache)
    report = run_dir / "setup" / "cartpole_v1.py" / "verify.r0.log"
    assert "L2 interactions: FAIL" in report.read_text()
    line = next(line for line in log.splitlines() if "envs_fast/cartpole_v1.py FAILED verification" in line)
    assert f"(report {report})" in line and "[FAIL]" in line and "training falls back" in line
    assert verdicts(run_dir).get("cartpole_v1.py") is None  # a failed verdict is never merged
    assert choice["backend"] != "envs_fast/cartpole_v1.py"
    failed = next(b for b in choice["backends"] if b["backend"] == "envs_fast/cartpole_v1.py")
    assert failed["passed"] is False and "[FAIL]" in failed["how"]
    assert not train_summary(run_dir / "exp-0000" / "train.log")["backend"].endswith("cartpole_v1.py")
    assert list(read_results(repo, "broken").status) == ["baseline", "baseline"]
