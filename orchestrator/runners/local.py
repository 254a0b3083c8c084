"""LocalRunner: an experiment's processes on this machine, each in its own process group.

Every train, evaluation, verify and bench run starts from a fresh snapshot of its commit (the
files of `git archive COMMIT`), so candidates of one round never share a directory and nothing
they write lands in the worktree the agent edits. Each process gets a scrubbed environment, is
recorded in the InFlight journal before it is waited on, and is killed as a group at its
deadline, on stop, and when it ends.
"""
from __future__ import annotations

import hashlib
import shutil
import sys
import uuid
from pathlib import Path
from typing import Optional

from .. import processes
from ..artifacts import TRAIN_SCRIPT, find_policy, number_arg, train_env
from ..daemon import log, progress
from ..inflight import InFlight
from ..workspace import Workspace
from .base import (EvalOutcome, Measurement, RunnerSettings, Slot, StopCheck, TrainOutcome, VerifyOutcome,
                   add_evaluation, read_eval_json, train_failure)
from ..artifacts import parse_summary


class LocalRunner:
    name = "local"

    def __init__(self, settings: RunnerSettings, workspace: Workspace, should_stop: StopCheck, journal: InFlight,
                 harness_bytes: bytes, snapshots: Optional[Path] = None):
        self.settings = settings
        self.workspace = workspace
        self.should_stop = should_stop
        self.journal = journal
        self.harness_bytes = harness_bytes
        self.snapshots = snapshots or snapshot_root(workspace)

    # ------------------------------------------------------------ pieces
    def _checkout(self, commit: str, name: str) -> Path:
        path = self.snapshots / f"{name}-{uuid.uuid4().hex[:6]}"
        self.workspace.extract(commit, path)
        return path

    def _spawn(self, slot: Slot, stage: str, cmd: list[str], cwd: Path, env: dict, log_path: Path,
               timeout_s: float, tick: str) -> processes.ProcessResult:
        return processes.run_group(
            cmd, cwd, env, log_path, timeout_s, self.should_stop,
            on_spawn=lambda pgid: self.journal.add_handle(slot.exp, {"kind": "local", "pgid": pgid, "stage": stage}),
            on_tick=lambda t: progress.show(f"{slot.label}: {tick} {t:.0f}s"))

    def _backend_env(self) -> dict:
        """Train, verify and bench share the run's verdict cache, so train.py's
        make_vec_env("auto") uses what this run verified."""
        return {"AUTORL_VERIFY_CACHE": str(self.settings.verify_cache), "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONUNBUFFERED": "1"}

    # ------------------------------------------------------------ measure
    def measure(self, slot: Slot, commit: str, seed: int) -> Measurement:
        s, folder = self.settings, slot.folder
        folder.path.mkdir(parents=True, exist_ok=True)
        for stale in (folder.train_log, folder.eval_json, folder.eval_log):  # a retried attempt starts clean
            stale.unlink(missing_ok=True)
        shutil.rmtree(folder.out, ignore_errors=True)
        folder.out.mkdir(parents=True)
        log.info("%s: training %s with seed %d for %ss", slot.label, TRAIN_SCRIPT, seed, number_arg(s.budget_s))
        source = self._checkout(commit, f"{folder.path.name}-seed{seed}")
        try:
            env = processes.scrubbed_env({**self._backend_env(), **train_env(folder.out, s.env_id, s.budget_s, seed)})
            result = self._spawn(slot, "train", [sys.executable, TRAIN_SCRIPT], source, env, folder.train_log,
                                 s.budget_s + s.grace_s, f"training (budget {s.budget_s:.0f}s)")
        finally:
            shutil.rmtree(source, ignore_errors=True)
        text = folder.train_log.read_text(encoding="utf-8", errors="replace") if folder.train_log.exists() else ""
        train = TrainOutcome(result.returncode, result.wall_s, result.timed_out, result.interrupted,
                             metrics=parse_summary(text), policy=find_policy(folder.out),
                             output_exceeded=getattr(result, "output_exceeded", False))
        m = train_failure(train, folder, s.budget_s, s.grace_s)
        if m.status:
            return m
        log.info("%s: trained (%s env steps, %s sps); evaluating with the trusted harness", slot.label,
                 m.env_steps, m.sps)
        evaluation = self.evaluate(slot, train.policy)
        m = add_evaluation(m, evaluation, folder)
        if m.score is not None:
            log.info("%s: score %.3f (se %.3f over %d episodes)", slot.label, m.score,
                     evaluation.result.get("se", float("nan")), evaluation.result.get("episodes", 0))
        return m

    def evaluate(self, slot: Slot, policy: Path) -> EvalOutcome:
        """Score `policy` with the run's copy of evaluate.py (hash checked first) in a fresh process
        that imports nothing of the candidate's: it runs from the run folder without PYTHONPATH."""
        s, folder = self.settings, slot.folder
        if hashlib.sha256(s.harness.read_bytes()).hexdigest() != s.harness_sha256:
            log.error("%s does not match the hash recorded at setup; restoring it from the copy verified at "
                      "startup", s.harness)
            s.harness.write_bytes(self.harness_bytes)
            return EvalOutcome(False, error="the trusted harness copy was modified during the experiment",
                               tampered=True)
        extra = {"PYTHONUNBUFFERED": "1"}
        if s.eval_workers:
            extra["AUTORL_EVAL_WORKERS"] = str(s.eval_workers)
        env = processes.scrubbed_env(extra)
        env.pop("PYTHONPATH", None)  # nothing but installed packages and the harness itself
        folder.eval_json.unlink(missing_ok=True)
        cmd = [sys.executable, str(s.harness), "--policy", str(policy), "--env", s.env_id,
               "--episodes", str(s.eval_episodes), "--seed", str(s.eval_seed), "--out", str(folder.eval_json)]
        proc = self._spawn(slot, "eval", cmd, s.harness.parent, env, folder.eval_log, s.eval_timeout_s,
                           f"evaluating {s.eval_episodes} episodes")
        if proc.interrupted:
            return EvalOutcome(False, error="interrupted", interrupted=True, wall_s=proc.wall_s)
        if proc.timed_out:
            return EvalOutcome(False, error=f"evaluation took longer than {s.eval_timeout_s:.0f}s", timed_out=True,
                               wall_s=proc.wall_s)
        if proc.returncode != 0 or not folder.eval_json.exists():
            from ..artifacts import log_tail

            reason = log_tail(folder.eval_log, 1) or f"evaluate.py exited with {proc.returncode}"
            return EvalOutcome(False, error=reason, wall_s=proc.wall_s)
        result, error = read_eval_json(folder.eval_json)
        if result is None:
            return EvalOutcome(False, error=error, wall_s=proc.wall_s)
        return EvalOutcome(True, result=result, wall_s=proc.wall_s)

    # ------------------------------------------------------------ verify and bench
    def verify(self, slot: Slot, commit: str, backend: str, round_: int) -> VerifyOutcome:
        s, folder = self.settings, slot.folder
        json_path, log_path = folder.verify_round(round_)
        source = self._checkout(commit, f"{folder.path.name}-verify{round_}")
        try:
            result = self._spawn(
                slot, "verify", [sys.executable, "-m", "envs_fast.verify", "--env", s.env_id, "--backend", backend,
                                 "--levels", "1,2,3", "--json", str(json_path)],
                source, processes.scrubbed_env(self._backend_env()), log_path, s.verify_timeout_s, "verifying")
        finally:
            shutil.rmtree(source, ignore_errors=True)
        if result.interrupted:
            return VerifyOutcome(False, interrupted=True)
        if json_path.exists():
            shutil.copyfile(json_path, folder.verify)  # the last round's full report
        report = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
        if result.timed_out:
            return VerifyOutcome(False, f"verification timed out after {s.verify_timeout_s:.0f}s\n{report[-4000:]}",
                                 returncode=3, timed_out=True)
        return VerifyOutcome(result.returncode == 0, report[-12000:], returncode=result.returncode)

    def bench(self, slot: Slot, commit: str, spec: str, json_path: Path) -> Optional[dict]:
        s = self.settings
        source = self._checkout(commit, f"{slot.folder.path.name}-bench")
        try:
            result = self._spawn(
                slot, "bench", [sys.executable, "-m", "envs_fast.bench", "--env", s.env_id, "--backend", spec,
                                "--seconds", number_arg(s.bench_seconds), "--json", str(json_path)],
                source, processes.scrubbed_env(self._backend_env()), json_path.with_suffix(".log"),
                s.verify_timeout_s, "benchmarking")
        finally:
            shutil.rmtree(source, ignore_errors=True)
        if result.returncode != 0 or not json_path.exists():
            return None
        try:
            import json

            return json.loads(json_path.read_text()) or None
        except ValueError:
            return None

    # ------------------------------------------------------------ cancel
    def cancel(self, handle: dict) -> bool:
        return cancel_local(handle, [self.workspace.path, self.snapshots, self.settings.harness.parent])

    def close(self) -> None:
        shutil.rmtree(self.snapshots, ignore_errors=True)


def snapshot_root(workspace: Workspace) -> Path:
    """Where a run's commit snapshots are unpacked (beside the worktrees, out of the checkout's git)."""
    return workspace.main_root / "runs" / ".snapshots" / workspace.tag


def cancel_local(handle: dict, cwd_inside: list[Path]) -> bool:
    pgid = handle.get("pgid")
    if not pgid:
        return False
    killed = processes.kill_orphaned_group(int(pgid), cwd_inside)
    if killed:
        log.warning("killed %d orphaned process(es) of group %d (%s)", killed, pgid, handle.get("stage", "?"))
    return bool(killed)
