"""`schedule`: a run starts at --at (once), its report is written, `status` shows the next start;
a night due while the previous runs is skipped, the next starts from the previous night's best
(`run --from`), and SIGTERM stops the scheduler and the run in flight."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import git
import pytest

from orchestrator.config import default_tag
from orchestrator.daemon import lock_holder
from tests.conftest import (FAST, TINY_TRAIN_PY, daemon_cmd, daemon_env, processes_of, read_results, run_daemon,
                            tiny_train_py, write_replay)


def _start(repo: Path, log: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(daemon_cmd("schedule", *args), cwd=repo, env=daemon_env(), stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _state(repo: Path) -> dict:
    try:
        return json.loads((repo / "results" / "_schedule" / "schedule.json").read_text())
    except (OSError, ValueError):
        return {}


def _wait(what, timeout: float, proc: subprocess.Popen, log: Path, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        assert proc.poll() is None, f"the scheduler exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen, log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.long
@pytest.mark.slow
def test_schedule(autorl_repo, tmp_path):
    """Two schedulers in two checkouts at once (so the minute's wait is spent on the second): one with
    --at the next minute, one with a night every 3 s to overlap nights and stop one in flight."""
    at_the_minute = AtTheMinute(autorl_repo(TINY_TRAIN_PY, name="nightly"), tmp_path)
    try:
        overlap_then_sigterm(autorl_repo(TINY_TRAIN_PY, name="overlap"), tmp_path)
        at_the_minute.check()
    finally:
        at_the_minute.stop()


class AtTheMinute:
    """`schedule --at <next minute> --max-experiments 1`: exactly one run, at that minute, with its report."""

    def __init__(self, repo: Path, tmp_path: Path):
        self.repo = repo
        replay = write_replay(tmp_path / "replay-nightly", {1: {"candidate/train.py": tiny_train_py(BIAS=0.0),
                                                                "DESCRIPTION": "no bias"}})
        now = datetime.now()
        self.at = (now + timedelta(minutes=2 if now.second > 45 else 1)).replace(second=0, microsecond=0)
        self.until = self.at + timedelta(minutes=5)
        self.log = tmp_path / "nightly.log"
        self.proc = _start(repo, self.log, "--at", f"{self.at:%H:%M}", "--until", f"{self.until:%H:%M}", "--env",
                           "CartPole-v1", "--agent", "replay", "--replay-dir", str(replay), "--budget", "2",
                           "--max-experiments", "1", *FAST, "--grace", "30")
        _wait(lambda: _state(repo).get("next_start"), 30, self.proc, self.log)
        status = run_daemon(repo, "status")
        assert f"schedule: running (pid {self.proc.pid}); next start {self.at:%a %d %b %H:%M}" in status.stdout, \
            status.stdout
        assert not _state(repo)["nights"]

    def check(self) -> None:
        repo = self.repo

        def night_done():
            nights = _state(repo).get("nights", [])
            return nights if nights and nights[0].get("ended") else None

        nights = _wait(night_done, (self.at - datetime.now()).total_seconds() + 240, self.proc, self.log)
        assert len(nights) == 1
        night = nights[0]
        started = datetime.strptime(night["started"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        assert started.astimezone().strftime("%H:%M") == f"{self.at:%H:%M}"  # at the minute, not before or after
        assert night["tag"] == default_tag("CartPole-v1", self.at) and night["returncode"] == 0
        assert night["from"] is None and night["command"][-2:] == ["--until", f"{self.until:%H:%M}"]
        assert read_results(repo, night["tag"]).status.tolist() == ["baseline", "baseline", "keep"]
        run_dir = repo / "results" / night["tag"]
        assert (run_dir / "progress.png").exists() and "no bias" in (run_dir / "report.html").read_text()
        assert "next start" in run_daemon(repo, "status").stdout  # tomorrow's

    def stop(self) -> None:
        _stop(self.proc, self.log)
        assert "schedule: not running" in run_daemon(self.repo, "status").stdout


def overlap_then_sigterm(repo: Path, tmp_path: Path) -> None:
    """Nights every 3 s: those due while night 1 runs are skipped; night 2 starts from night 1's best;
    SIGTERM while night 2 trains stops the scheduler and the run cleanly, and writes its report."""
    slow = tiny_train_py(BIAS=0.0, SLEEP=5.0)  # kept in night 1, so night 2's baseline trains it: 5 s in flight
    replay = write_replay(tmp_path / "replay-overlap", {1: {"candidate/train.py": slow,
                                                            "DESCRIPTION": "slow but right"}})
    until = datetime.now() + timedelta(minutes=30)
    log = tmp_path / "overlap.log"
    proc = _start(repo, log, "--at", "00:00", "--every", "3", "--until", f"{until:%H:%M}", "--env", "CartPole-v1",
                  "--agent", "replay", "--replay-dir", str(replay), "--budget", "20", "--max-experiments", "1", *FAST,
                  "--grace", "30")
    try:
        nights = _wait(lambda: len(_state(repo).get("nights", [])) >= 2 and _state(repo)["nights"], 240, proc, log)
        second_dir = repo / "results" / nights[1]["tag"]

        def in_flight():
            try:
                records = json.loads((second_dir / "state.json").read_text())["in_flight"]
            except (OSError, ValueError, KeyError):
                return None
            return records if records and records[0].get("handles") else None

        _wait(in_flight, 60, proc, log, interval=0.2)
        out_dir = second_dir / "exp-0000" / "out"
        assert processes_of(out_dir), "night 2's baseline should be training"
        assert "night skipped: the previous night" in (repo / "results" / "_schedule" / "schedule.log").read_text()
    finally:
        _stop(proc, log)

    state = _state(repo)
    assert len(state["nights"]) == 2 and state["next_start"] is None
    first, second = state["nights"]
    assert first["returncode"] == 0 and first["from"] is None
    assert read_results(repo, first["tag"]).status.tolist() == ["baseline", "baseline", "keep"]
    # Night 2 started from night 1's best: its base commit is night 1's branch tip.
    assert second["tag"] == first["tag"] + "-2" and second["from"] == f"autorl/{first['tag']}"
    tip = git.Repo(repo).commit(f"autorl/{first['tag']}").hexsha
    assert json.loads((second_dir / "run.json").read_text())["base_commit"] == tip
    # SIGTERM stopped its run cleanly: the experiment in flight recorded, nothing left running, a report.
    assert second["returncode"] == 0
    assert read_results(repo, second["tag"]).status.tolist() == ["interrupted"]
    assert lock_holder(second_dir) is None and not processes_of(out_dir)
    assert (second_dir / "report.html").exists()
