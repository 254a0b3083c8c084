"""Crash safety and control of a running daemon: the lock, status, kill -9 then --resume with
nothing lost and no orphan process, and `stop`."""
from __future__ import annotations

import json
import os
import signal
import time

import git

from tests.conftest import (FAST, TINY_TRAIN_PY, all_dead, processes_of, read_results, run_daemon, start_daemon,
                            tiny_train_py, write_replay)

TAG = "crashy"

# A child in the group, and a daemon that double-forks out of it (setsid, reparented to init).
HANG_WITH_GRANDCHILD = tiny_train_py(BIAS=0.5).replace("out = Path(", """\
import subprocess
_child = subprocess.Popen(["sleep", "600"])
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
Path(os.environ["AUTORL_OUTPUT_DIR"]).mkdir(parents=True, exist_ok=True)
(Path(os.environ["AUTORL_OUTPUT_DIR"]) / "pids").write_text(f"{os.getpid()} {_child.pid}")
time.sleep(600)
out = Path(""", 1)


def wait_for_training(run_dir, exp, proc, timeout=90):
    """Until exp is in its train run and has started its processes; returns them (psutil)."""
    deadline = time.time() + timeout
    pids = run_dir / f"exp-{exp:04d}" / "out" / "pids"
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        state = json.loads((run_dir / "state.json").read_text()) if (run_dir / "state.json").exists() else {}
        in_flight = {record["exp"]: record for record in state.get("in_flight") or []}
        if in_flight.get(exp, {}).get("stage") == "train" and pids.exists():
            time.sleep(0.3)  # the double-forked daemon is up
            return processes_of(pids.parent)
        time.sleep(0.2)
    raise AssertionError(f"exp {exp} never started training")


def test_lock_kill_9_resume_status_and_stop(autorl_repo, tmp_path):
    repo = autorl_repo(TINY_TRAIN_PY)
    run_dir = repo / "results" / TAG
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": HANG_WITH_GRANDCHILD, "DESCRIPTION": "hangs, then the daemon is killed"},
        2: {"candidate/train.py": HANG_WITH_GRANDCHILD, "DESCRIPTION": "hangs, then stop"},
    })
    args = ("run", "--env", "CartPole-v1", "--tag", TAG, "--agent", "replay", "--replay-dir", str(replay),
            "--budget", "120", *FAST)
    daemon = start_daemon(repo, *args)
    started = wait_for_training(run_dir, 1, daemon)
    assert len(started) >= 3, started  # train.py, its child, the escaped daemon

    # A second daemon on the same tag exits at once, naming the running pid.
    second = run_daemon(repo, *args, "--resume", timeout=60)
    assert second.returncode != 0 and f"pid {daemon.pid}" in second.stderr
    # Without --resume an existing tag is refused.
    again = run_daemon(repo, *args, timeout=60)
    assert again.returncode != 0 and "--resume" in again.stderr

    status = run_daemon(repo, "status", "--tag", TAG, timeout=60)
    assert f"running (pid {daemon.pid})" in status.stdout and "in flight: exp 1 (train, train)" in status.stdout

    # kill -9 of the daemon mid-training leaves an orphaned train process group.
    os.kill(daemon.pid, signal.SIGKILL)
    daemon.wait(timeout=10)
    # (Inside the sandbox they die with the daemon already; without it they wait for the resume.)
    assert read_results(repo, TAG)["status"].tolist() == ["baseline", "baseline"]
    text_before = (run_dir / "results.tsv").read_text()
    assert "not running" in run_daemon(repo, "status", "--tag", TAG, timeout=60).stdout

    # --resume records exp 1 interrupted, kills the orphans, and goes on with exp 2.
    resumed = start_daemon(repo, "run", "--tag", TAG, "--resume")  # same agent and options as at the start
    wait_for_training(run_dir, 2, resumed)
    assert all_dead(started), "resume kills what the killed daemon's experiment left, however it detached"
    rows = read_results(repo, TAG)
    assert rows["exp"].tolist() == [0, 0, 1]
    assert rows["status"].tolist() == ["baseline", "baseline", "interrupted"]
    assert (run_dir / "results.tsv").read_text().startswith(text_before)  # nothing lost or rewritten
    main = git.Repo(repo)
    assert main.commit(f"refs/autorl/{TAG}/exp-0001").message.strip() == "hangs, then the daemon is killed"

    # stop: the experiment in flight is aborted and recorded; the daemon exits cleanly.
    started = processes_of(run_dir / "exp-0002" / "out")
    assert len(started) >= 3, started
    stop = run_daemon(repo, "stop", "--tag", TAG, timeout=120)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert resumed.wait(timeout=30) == 0
    output = resumed.stdout.read()
    assert "resuming run" in output and "interrupted" in output
    assert "agent: replay (the agent this run started with)" in output
    assert all_dead(started), "stop kills the experiment's processes, however they detached"
    rows = read_results(repo, TAG)
    assert rows["status"].tolist() == ["baseline", "baseline", "interrupted", "interrupted"]
    assert rows["exp"].tolist() == [0, 0, 1, 2]
    # The worktree is back at the best commit (the start), clean.
    worktree = git.Repo(repo / "runs" / TAG)
    assert worktree.head.commit == main.commit("main") == main.commit(f"autorl/{TAG}")
    assert not worktree.is_dirty(untracked_files=True)
    assert "not running" in run_daemon(repo, "status", timeout=60).stdout
    assert run_daemon(repo, "stop", "--tag", TAG, timeout=60).returncode == 1  # nothing to stop
