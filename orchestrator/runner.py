"""Runs one experiment's processes: train+eval, or verify+bench (local subprocess, Modal).

Every process here runs in its own process group with a scrubbed environment and is killed as a
group (grandchildren too) at its deadline, when the daemon is asked to stop, and after it exits
(so a forgotten worker process cannot outlive its experiment).
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import psutil

# A variable whose name contains one of these never reaches candidate code or agent commands.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "COOKIE", "PRIVATE")
# Credentials the daemon itself holds under names without the markers above.
DAEMON_CREDENTIALS = ("ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH", "MODAL_TOKEN_ID", "AWS_PROFILE")
# A secret copied under an innocent name (FOO=$ANTHROPIC_API_KEY) is caught by its value.
MIN_SECRET_VALUE_LENGTH = 8


def _is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS) or upper.startswith(DAEMON_CREDENTIALS)


def scrubbed_env(extra: dict | None = None) -> dict:
    """The daemon's environment without secrets, plus `extra`."""
    secret_values = [
        value for name, value in os.environ.items()
        if _is_secret_name(name) and len(value) >= MIN_SECRET_VALUE_LENGTH
    ]
    env = {
        name: value
        for name, value in os.environ.items()
        if not _is_secret_name(name) and not any(secret in value for secret in secret_values)
    }
    env.update(extra or {})
    return env


# ---------------------------------------------------------------- process groups
def kill_group(pgid: int) -> None:
    """SIGKILL a whole process group; a group that is already gone is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def kill_orphaned_group(pgid: int, cwd_inside: list[Path]) -> int:
    """Kill what is left of a recorded process group after the daemon died.

    The pgid is only trusted if a member still runs with its cwd inside one of `cwd_inside` (the
    run's worktree or folder), so a reused pgid of an unrelated process is never touched.
    Returns the number of processes killed."""
    roots = [str(Path(p).resolve()) for p in cwd_inside]

    def inside(path: str) -> bool:
        return any(path == root or path.startswith(root + os.sep) for root in roots)

    members = group_members(pgid)
    ours = False
    for proc in members:
        try:
            ours = ours or inside(proc.cwd()) or inside(proc.environ().get("AUTORL_OUTPUT_DIR", "/nonexistent"))
        except psutil.Error:
            continue
    if not ours:
        return 0
    kill_group(pgid)
    for proc in members:
        try:
            proc.wait(timeout=5)
        except psutil.Error:
            pass
    return len(members)


def _descendants(pid: int) -> set[psutil.Process]:
    try:
        return set(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return set()


@dataclass
class ProcessResult:
    returncode: Optional[int]
    wall_s: float
    timed_out: bool = False
    interrupted: bool = False


def run_group(
    cmd: list[str],
    cwd: Path,
    env: dict,
    log_path: Path,
    timeout_s: float,
    should_stop: Callable[[], bool],
    on_spawn: Callable[[int], None] = lambda pgid: None,
    on_tick: Callable[[float], None] = lambda elapsed: None,
    stderr_path: Optional[Path] = None,
) -> ProcessResult:
    """Run `cmd` in a new session, output to `log_path` (stderr too, unless `stderr_path`); kill its
    group at the timeout, on stop, and when an exception (a stop signal) interrupts the wait."""
    started = time.monotonic()
    with open(log_path, "ab") as log, open(stderr_path or os.devnull, "ab") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log,
                                stderr=err if stderr_path else subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        pgid = proc.pid  # start_new_session: the child leads its own group
        on_spawn(pgid)
        timed_out = interrupted = False
        seen: set[psutil.Process] = set()  # descendants, in case one leaves the group (setsid)
        try:
            while True:
                try:
                    proc.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
                seen |= _descendants(proc.pid)
                elapsed = time.monotonic() - started
                on_tick(elapsed)
                if should_stop():
                    interrupted = True
                elif elapsed > timeout_s:
                    timed_out = True
                if timed_out or interrupted:
                    kill_group(pgid)
                    proc.wait()
                    break
        finally:
            kill_group(pgid)  # leftovers: workers, grandchildren
            for escaped in seen:
                try:
                    escaped.kill()  # psutil checks it is still the same process (pid + start time)
                except psutil.Error:
                    pass
            if proc.poll() is None:
                proc.wait()
    return ProcessResult(proc.returncode, time.monotonic() - started, timed_out, interrupted)


# ---------------------------------------------------------------- train
TRAIN_SCRIPT = "candidate/train.py"


@dataclass
class TrainResult(ProcessResult):
    metrics: dict = field(default_factory=dict)   # the `---` key: value tail of train.py
    policy: Optional[Path] = None                 # the exported artifact, if any


def parse_summary(log_text: str) -> dict:
    """The `key: value` lines after train.py's last `---` line (information, never the score)."""
    lines = log_text.splitlines()
    try:
        start = len(lines) - 1 - lines[::-1].index("---")
    except ValueError:
        return {}
    metrics = {}
    for line in lines[start + 1:]:
        key, sep, value = line.partition(":")
        if not sep or not key.strip() or " " in key.strip():
            continue
        value = value.strip()
        try:
            metrics[key.strip()] = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            metrics[key.strip()] = value
    return metrics


def find_policy(out_dir: Path) -> Optional[Path]:
    for name in ("policy.pt", "policy.pt2"):
        if (out_dir / name).is_file():
            return out_dir / name
    return None


def run_train(
    worktree: Path,
    out_dir: Path,
    log_path: Path,
    env_id: str,
    budget_s: float,
    seed: int,
    grace_s: float,
    should_stop: Callable[[], bool],
    on_spawn: Callable[[int], None] = lambda pgid: None,
    on_tick: Callable[[float], None] = lambda elapsed: None,
    extra_env: dict | None = None,
) -> TrainResult:
    out_dir.mkdir(parents=True, exist_ok=True)
    env = scrubbed_env({
        **(extra_env or {}),
        "AUTORL_OUTPUT_DIR": str(out_dir),
        "AUTORL_TIME_BUDGET": number_arg(budget_s),
        "AUTORL_SEED": str(seed),
        "AUTORL_ENV_ID": env_id,
        "PYTHONUNBUFFERED": "1",  # a killed run still leaves its log
        "PYTHONDONTWRITEBYTECODE": "1",  # no stray __pycache__ in the worktree
    })
    result = run_group([sys.executable, TRAIN_SCRIPT], worktree, env, log_path, budget_s + grace_s,
                       should_stop, on_spawn, on_tick)
    text = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
    return TrainResult(result.returncode, result.wall_s, result.timed_out, result.interrupted,
                       metrics=parse_summary(text), policy=find_policy(out_dir))


def number_arg(value: float) -> str:
    """A number as a command-line argument or environment value: 30, not 30.0."""
    return str(int(value)) if float(value).is_integer() else str(value)


def log_tail(path: Path, lines: int = 60) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


# ---------------------------------------------------------------- trusted evaluation
def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


class HarnessTampered(Exception):
    """The run's trusted evaluate.py copy no longer has the hash recorded at setup."""


@dataclass
class EvalResult:
    ok: bool
    result: dict = field(default_factory=dict)   # the harness's JSON (mean, se, returns, ...)
    error: str = ""                              # one-line reason when not ok
    timed_out: bool = False
    interrupted: bool = False
    tampered: bool = False
    wall_s: float = 0.0

    @property
    def score(self) -> Optional[float]:
        return float(self.result["mean"]) if self.ok else None


def run_harness(
    harness: Path,
    expected_sha256: str,
    policy: Path,
    env_id: str,
    episodes: int,
    seed: int,
    out_json: Path,
    log_path: Path,
    timeout_s: float,
    should_stop: Callable[[], bool],
    workers: Optional[int] = None,
    on_spawn: Callable[[int], None] = lambda pgid: None,
    on_tick: Callable[[float], None] = lambda elapsed: None,
) -> EvalResult:
    """Score `policy` with the run's copy of evaluate.py in a fresh process.

    The copy's hash is checked first (HarnessTampered otherwise). It runs from the run folder,
    so no candidate module is importable, with a scrubbed environment."""
    if sha256_file(harness) != expected_sha256:
        raise HarnessTampered(f"{harness} does not match the hash recorded at setup")
    extra = {"PYTHONUNBUFFERED": "1"}
    if workers:
        extra["AUTORL_EVAL_WORKERS"] = str(workers)
    env = scrubbed_env(extra)
    env.pop("PYTHONPATH", None)  # nothing but installed packages and the harness itself
    out_json.unlink(missing_ok=True)
    cmd = [sys.executable, str(harness), "--policy", str(policy), "--env", env_id,
           "--episodes", str(episodes), "--seed", str(seed), "--out", str(out_json)]
    proc = run_group(cmd, harness.parent, env, log_path, timeout_s, should_stop, on_spawn, on_tick)
    wall = proc.wall_s
    if proc.interrupted:
        return EvalResult(False, error="interrupted", interrupted=True, wall_s=wall)
    if proc.timed_out:
        return EvalResult(False, error=f"evaluation took longer than {timeout_s:.0f}s", timed_out=True,
                          wall_s=wall)
    if proc.returncode != 0 or not out_json.exists():
        reason = log_tail(log_path, 1) or f"evaluate.py exited with {proc.returncode}"
        return EvalResult(False, error=reason, wall_s=wall)
    try:
        result = json.loads(out_json.read_text())
        float(result["mean"])
    except (ValueError, KeyError, TypeError) as exc:
        return EvalResult(False, error=f"unreadable evaluation output: {exc}", wall_s=wall)
    return EvalResult(True, result=result, wall_s=wall)
