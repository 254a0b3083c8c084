"""LocalRunner: an experiment's processes on this machine, walled off and killed as a whole.

Every train, evaluation, verify and bench run starts from a fresh snapshot of its commit (the
files of `git archive COMMIT`, under `runs/.snapshots/<tag>/`), so candidates of one round never
share a directory and nothing they write lands in the worktree the agent edits. Each process:

- runs inside the sandbox where bubblewrap works (orchestrator/sandbox.py): no network, its
  snapshot and the Python environment read-only, only its output directory writable, a private
  /tmp and $HOME; the run folder, the checkout, the git directory and the user's $HOME absent.
  The trusted evaluation sees only the harness copy and the artifact (one file each);
- gets a scrubbed environment and a marker (AUTORL_EXPERIMENT_ID), recorded with its process
  group in the InFlight journal before it is waited on, so a `--resume` can kill its leftovers;
- is killed as a whole (PID namespace, cgroup, marker) at its deadline, on stop, and when it
  ends; a train run also when it writes more than `--max-output-mb` into its output directory.

Verify and bench write their verdicts and figures into a scratch copy of the run's verdict
cache; the daemon merges back only the records it expected (the translation's own verdict after
a pass, the benchmarked backend's figures), so candidate code cannot forge a verdict.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from envs_fast.protocol import is_file_spec
from envs_fast.verify.report import PROGRESS_PREFIX
from envs_fast.rust.build import RUSTC_ENV, toolchain as rust_toolchain

from .. import processes
from ..artifacts import TRAIN_SCRIPT, find_policy, log_tail, number_arg, parse_summary, train_env
from ..daemon import log, progress
from ..disk import prune
from ..inflight import InFlight
from ..sandbox import Sandbox, Walls
from ..usercache import USER_CACHE_ENV
from ..workspace import Workspace, remove_snapshot
from .base import (EvalOutcome, Measurement, RunnerSettings, Slot, StopCheck, TrainOutcome, VerifyOutcome,
                   add_evaluation, read_eval_json, side_by_side_args, train_failure)


JAX_CACHE_ENV = "AUTORL_JAX_CACHE_DIR"  # train.py points JAX's persistent compilation cache there
# evaluate.py's exit codes and its error line (the daemon never imports a harness it runs)
ENV_CHANGED_EXIT, POLICY_REFUSED_EXIT = 3, 4
HARNESS_ERROR_PREFIX = "evaluate.py: error: "


# envs_fast.verify's exits that carry a verdict (pass, fail); 2 is a usage error, a timeout is none
VERDICT_EXITS = (0, 1)


class ProgressLines:
    """The new `verify: ...` progress lines of a running verification's log, each into the daemon's
    log with the slot's label, when called (each tick of the wait, and once at its end)."""

    def __init__(self, path: Path, label: str):
        self.path, self.label, self.offset, self.partial = path, label, 0, ""

    def __call__(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data.decode("utf-8", errors="replace")).split("\n")
        for line in lines:
            if line.startswith(PROGRESS_PREFIX):
                log.info("%s: verify %s", self.label, line[len(PROGRESS_PREFIX):].strip())


class LocalRunner:
    name = "local"

    def __init__(self, settings: RunnerSettings, workspace: Workspace, should_stop: StopCheck, journal: InFlight,
                 harness_bytes: bytes, snapshots: Optional[Path] = None, sandbox: Optional[Sandbox] = None):
        self.settings = settings
        self.workspace = workspace
        self.should_stop = should_stop
        self.journal = journal
        self.harness_bytes = harness_bytes
        self.snapshots = snapshots or snapshot_root(workspace)
        self.sandbox = sandbox or Sandbox(settings.config.sandbox)
        self.hidden = [workspace.main_root, workspace.path, settings.harness.parent]
        settings.verify_cache.mkdir(parents=True, exist_ok=True)
        self.rust = rust_toolchain()  # shown to walled-in processes so that Rust backends build and load
        self.jax_caches = JaxCaches(settings.jax_cache)

    # ------------------------------------------------------------ pieces
    def _scratch(self, name: str) -> Path:
        path = self.snapshots / f"{name}-{uuid.uuid4().hex[:6]}"
        path.mkdir(parents=True)
        return path

    def _checkout(self, commit: str, name: str) -> Path:
        path = self.snapshots / f"{name}-{uuid.uuid4().hex[:6]}"
        self.workspace.extract(commit, path)
        return path

    def _spawn(self, slot: Slot, stage: str, cmd: list[str], cwd: Path, env: dict, log_path: Path,
               timeout_s: float, tick: str, walls: Walls, output_dir: Optional[Path] = None,
               max_output_bytes: Optional[int] = None, artifact=None) -> processes.ProcessResult:
        marker = processes.new_marker()
        # a verification's level lines reach the daemon's log as they come (the ticker shows only on a
        # terminal: under nohup a setup's minutes of verifying would otherwise be silent)
        follow = ProgressLines(log_path, slot.label) if stage == "verify" else lambda: None

        def on_tick(elapsed: float) -> None:
            progress.show(f"{slot.label}: {tick} {elapsed:.0f}s")
            follow()

        try:
            return processes.run_group(
                cmd, cwd, env, log_path, timeout_s, self.should_stop,
                on_spawn=lambda pgid: self.journal.add_handle(
                    slot.exp, {"kind": "local", "pgid": pgid, "marker": marker, "stage": stage}),
                on_tick=on_tick, walls=walls, sandbox=self.sandbox, output_dir=output_dir,
                max_output_bytes=max_output_bytes, marker=marker, artifact=artifact)
        finally:
            follow()

    def _walls(self, cwd: Path, read_only: list[Path], writable: list[Path]) -> Walls:
        toolchain = [self.rust[1]] if self.rust else []
        return Walls(cwd=cwd, read_only=read_only + toolchain, writable=writable, hidden=self.hidden)

    def _backend_env(self, cache: Path) -> dict:
        # the run's budget: it decides how many envs train.py's jax-host path steps (what the bench measures)
        env = {"AUTORL_VERIFY_CACHE": str(cache), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
               "AUTORL_TIME_BUDGET": number_arg(self.settings.config.budget_s)}
        if self.rust:
            env[RUSTC_ENV] = str(self.rust[0])
        return env

    def _candidate_env(self, extra: dict) -> dict:
        """A scrubbed environment for candidate code, without the name of the user-level cache (only
        the daemon reads and writes that; the walls hide it too)."""
        env = processes.scrubbed_env(extra)
        env.pop(USER_CACHE_ENV, None)
        return env

    # ------------------------------------------------------------ measure
    def measure(self, slot: Slot, commit: str, seed: int, budget_s: Optional[float] = None) -> Measurement:
        s, c, folder = self.settings, self.settings.config, slot.folder
        budget = budget_s or c.budget_s
        folder.path.mkdir(parents=True, exist_ok=True)
        for stale in (folder.train_log, folder.eval_json, folder.eval_log):  # a retried attempt starts clean
            stale.unlink(missing_ok=True)
        shutil.rmtree(folder.out, ignore_errors=True)
        folder.out.mkdir(parents=True)
        log.info("%s: training %s with seed %d for %ss", slot.label, TRAIN_SCRIPT, seed, number_arg(budget))
        source = self._checkout(commit, f"{folder.path.name}-seed{seed}")
        try:
            # train.py reads the run's verdicts (make_vec_env("auto")); it cannot write them.
            with self.jax_caches.use(commit) as jax_cache:
                env = self._candidate_env({**self._backend_env(s.verify_cache),
                                           **train_env(folder.out, c.env_id, budget, seed),
                                           JAX_CACHE_ENV: str(jax_cache)})
                result = self._spawn(slot, "train", [sys.executable, TRAIN_SCRIPT], source, env, folder.train_log,
                                     budget + c.grace_s, f"training (budget {budget:.0f}s)",
                                     self._walls(source, [source, s.verify_cache], [folder.out, jax_cache]),
                                     output_dir=folder.out, max_output_bytes=int(c.max_output_mb * 2**20),
                                     artifact=lambda: processes.file_fingerprint(find_policy(folder.out)))
        finally:
            shutil.rmtree(source, ignore_errors=True)
        text = folder.train_log.read_text(encoding="utf-8", errors="replace") if folder.train_log.exists() else ""
        train = TrainOutcome(result.returncode, result.wall_s, result.timed_out, result.interrupted,
                             metrics=parse_summary(text), policy=find_policy(folder.out),
                             output_exceeded=result.output_exceeded, artifact_s=result.artifact_s)
        m = train_failure(train, folder, c, budget)
        prune(folder)  # ballast, checkpoints: only the policy artifact stays
        if m.status:
            return m
        log.info("%s: trained (%s env steps, %s sps); evaluating with the trusted harness", slot.label,
                 m.env_steps, m.sps)
        evaluation = self.evaluate(slot, train.policy, commit)
        m = add_evaluation(m, evaluation, folder)
        prune(folder)
        if m.score is not None:
            log.info("%s: score %.3f (se %.3f over %d episodes)", slot.label, m.score,
                     evaluation.result.get("se", float("nan")), evaluation.result.get("episodes", 0))
        return m

    def evaluate(self, slot: Slot, policy: Path, commit: Optional[str] = None) -> EvalOutcome:
        """Score `policy` with the run's copy of evaluate.py (hash checked first) in a fresh process
        that imports nothing of the candidate's and sees only the harness copy and the artifact (and,
        for a created environment, `commit`'s envs/<name>/, whose frozen hash the harness checks)."""
        s, c, folder = self.settings, self.settings.config, slot.folder
        if hashlib.sha256(s.harness.read_bytes()).hexdigest() != c.harness_sha256:
            log.error("%s does not match the hash recorded at setup; restoring it from the copy verified at "
                      "startup", s.harness)
            s.harness.write_bytes(self.harness_bytes)
            return EvalOutcome(False, error="the trusted harness copy was modified during the experiment",
                               tampered=True)
        extra = {"PYTHONUNBUFFERED": "1"}
        if c.eval_workers:
            extra["AUTORL_EVAL_WORKERS"] = str(c.eval_workers)
        env = processes.scrubbed_env(extra)
        env.pop("PYTHONPATH", None)  # nothing but installed packages and the harness itself
        folder.eval_json.unlink(missing_ok=True)
        # the only writable place: the folder eval.json is written to; a created env's code is a sibling
        # (not inside it: a writable bind over its parent would cover a read-only one), read-only
        scratch = self._scratch(f"{folder.path.name}-eval")
        out_json = scratch / folder.eval_json.name
        env_root: Optional[Path] = None
        read_only = [s.harness, policy]
        try:
            if c.env_folder and commit:
                env_root = self.workspace.extract(commit, self._scratch(f"{folder.path.name}-env") / "env-root",
                                                  [c.env_folder], read_only=True)
                read_only.append(env_root)
                env["AUTORL_ENV_ROOT"] = str(env_root)
                env["AUTORL_ENV_SHA256"] = c.env_sha256 or ""
                env["PYTHONDONTWRITEBYTECODE"] = "1"
            cmd = [sys.executable, str(s.harness), "--policy", str(policy), "--env", c.env_id,
                   "--episodes", str(c.eval_episodes), "--seed", str(c.eval_seed), "--out", str(out_json)]
            proc = self._spawn(slot, "eval", cmd, scratch, env, folder.eval_log, c.eval_timeout_s,
                               f"evaluating {c.eval_episodes} episodes", self._walls(scratch, read_only, [scratch]))
            if out_json.exists():
                shutil.copyfile(out_json, folder.eval_json)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            if env_root is not None:
                remove_snapshot(env_root.parent)
        if proc.interrupted:
            return EvalOutcome(False, error="interrupted", interrupted=True, wall_s=proc.wall_s)
        if proc.timed_out:
            return EvalOutcome(False, error=f"evaluation took longer than {c.eval_timeout_s:.0f}s", timed_out=True,
                               wall_s=proc.wall_s)
        if proc.returncode != 0 or not folder.eval_json.exists():
            reason = log_tail(folder.eval_log, 1) or f"evaluate.py exited with {proc.returncode}"
            # Neither is a crash of the candidate's; both are recorded invalid with the harness's reason: the
            # frozen env folder changed (evaluate.ENV_CHANGED_EXIT), or the policy's graph holds an op a policy
            # may not use (evaluate.POLICY_REFUSED_EXIT).
            changed_env = bool(c.env_folder) and proc.returncode == ENV_CHANGED_EXIT
            refused = changed_env or proc.returncode == POLICY_REFUSED_EXIT
            if refused:
                reason = reason.removeprefix(HARNESS_ERROR_PREFIX)
            return EvalOutcome(False, error=reason, wall_s=proc.wall_s, tampered=refused)
        result, error = read_eval_json(folder.eval_json)
        if result is None:
            return EvalOutcome(False, error=error, wall_s=proc.wall_s)
        return EvalOutcome(True, result=result, wall_s=proc.wall_s)

    # ------------------------------------------------------------ verify and bench
    def _in_snapshot(self, slot: Slot, stage: str, commit: str, args: list[str], json_path: Path, log_path: Path,
                     tick: str) -> tuple[processes.ProcessResult, Optional[dict], Path, Path]:
        """Run `python -m envs_fast.<stage> ... --json J` in a snapshot of `commit` with a scratch
        copy of the verdict cache; returns the result, its JSON, the snapshot and the scratch cache
        (the caller merges what it trusts, then removes both)."""
        s, c = self.settings, self.settings.config
        source = self._checkout(commit, f"{slot.folder.path.name}-{stage}")
        cache = self._scratch(f"{slot.folder.path.name}-{stage}-cache")
        shutil.copytree(s.verify_cache, cache, dirs_exist_ok=True)
        out = cache / json_path.name
        result = self._spawn(
            slot, stage, [sys.executable, "-m", f"envs_fast.{stage}", "--env", c.env_id, *args, "--json", str(out)],
            source, self._candidate_env(self._backend_env(cache)), log_path, c.verify_timeout_s, tick,
            self._walls(source, [source], [cache]))
        data = None
        if out.exists():
            shutil.copyfile(out, json_path)
            try:
                data = json.loads(out.read_text()) or None
            except ValueError:
                data = None
        return result, data, source, cache

    def _merge(self, cache: Path, kind: str, spec: str) -> None:
        """Copy one record the daemon expects from a scratch cache into the run's cache."""
        from envs_fast import cache as verdicts

        name = verdicts.record_name(kind, spec, self.settings.config.env_id, self.record_environment())
        if (cache / name).is_file():
            shutil.copyfile(cache / name, self.settings.verify_cache / name)
        else:
            log.warning("no %s record for %s in the scratch cache", kind, spec)
        # Rust libraries built there (the scratch started as a copy of the run's cache, so only new
        # ones are copied back): training loads them, as it cannot write the cache.
        for built in (cache / "rust").glob("*/"):
            kept = self.settings.verify_cache / "rust" / built.name
            if not any(kept.glob("*.so")):  # (a copy cut short earlier is redone)
                shutil.copytree(built, kept, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".build-*"))

    def verify(self, slot: Slot, commit: str, backend: str, round_: int) -> VerifyOutcome:
        c, folder = self.settings.config, slot.folder
        json_path, log_path = folder.verify_round(round_)
        result, _, source, cache = self._in_snapshot(slot, "verify", commit,
                                                     ["--backend", backend, "--levels", "1,2,3"],
                                                     json_path, log_path, "verifying")
        try:
            if result.returncode in VERDICT_EXITS and not result.interrupted and not result.timed_out:
                # a file's record is keyed by its content (found from here); gymnax's by its version. A
                # failing verdict is kept too: the same code is not verified again (a change is)
                self._merge(cache, "verdict", str(source / backend) if is_file_spec(backend) else backend)
        finally:
            shutil.rmtree(source, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
        if result.interrupted:
            return VerifyOutcome(False, interrupted=True)
        if json_path.exists():
            shutil.copyfile(json_path, folder.verify)  # the last round's full report
        report = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
        if result.timed_out:
            return VerifyOutcome(False, f"verification timed out after {c.verify_timeout_s:.0f}s\n{report[-4000:]}",
                                 returncode=3, timed_out=True)
        return VerifyOutcome(result.returncode == 0, report[-12000:], returncode=result.returncode)

    def bench(self, slot: Slot, commit: str, spec: str, json_path: Path, figures: str = "all") -> Optional[dict]:
        args = ["--backend", spec, "--seconds", number_arg(self.settings.config.bench_seconds)]
        args += ["--figures", figures] if figures != "all" else []  # (a commit's bench.py may predate the flag)
        results = self._bench(slot, commit, args, json_path, [spec])
        return results[0] if results else None

    def bench_side_by_side(self, slot: Slot, commit: str, specs: list[str], json_path: Path,
                           seconds: float, rounds: int = 4) -> Optional[list[dict]]:
        args = [arg for spec in specs for arg in ("--backend", spec)] + side_by_side_args(seconds, rounds)
        return self._bench(slot, commit, args, json_path, specs)

    def _bench(self, slot: Slot, commit: str, args: list[str], json_path: Path,
               specs: list[str]) -> Optional[list[dict]]:
        """Run bench.py in a snapshot and merge the throughput record of each backend measured."""
        result, data, source, cache = self._in_snapshot(slot, "bench", commit, args, json_path,
                                                        json_path.with_suffix(".log"), "benchmarking")
        results = (data.get("side_by_side") or [data]) if result.returncode == 0 and data else None
        try:
            for spec, _ in zip(specs, results or []):
                # the record of what the daemon asked for, never of what the process says it measured
                # (a translation could name another backend to lend it its speed); "auto" names none
                # (the incumbent's own record is in the run's cache already: it was chosen by it)
                if spec == "auto":
                    continue
                measured = str(source / spec) if is_file_spec(spec) and not Path(spec).is_absolute() else spec
                self._merge(cache, "bench", measured)
        finally:
            shutil.rmtree(source, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
        return results

    def record_environment(self) -> Optional[dict]:
        """This machine, and the envs_fast the run's processes import: the run's worktree's, which
        may differ from this daemon's checkout (a night --from an older commit, a checkout edited
        since); a run's experiments cannot change it (they edit train.py or a translation)."""
        from envs_fast.cache import source_hashes

        package = self.workspace.path / "envs_fast"
        return {"envs_fast": source_hashes(package)} if package.is_dir() else None

    def unbilled_usd(self, seconds: float) -> float:
        return 0.0  # the user's own machine

    def limit_spending(self, over_limit) -> None:
        pass  # nothing it launches is paid for

    # ------------------------------------------------------------ cancel
    def cancel(self, handle: dict) -> bool:
        return cancel_local(handle, [self.workspace.path, self.snapshots, self.settings.harness.parent])

    def close(self) -> None:
        remove_snapshot(self.snapshots)  # (a read-only env root left by a kill too)
        self.jax_caches.remove()


class JaxCaches:
    """JAX's persistent compilation cache of each train run: an empty folder of its own
    (`<root>/<commit>-<n>/`), writable only inside that run's walls and removed when it ends. Every
    scored run compiles cold, so a baseline and a candidate's first run pay the same compile time
    out of the same budget (with a cache per commit, baselines 2-4 reused the start's while a
    candidate compiled cold), and no run can leave anything (compiled code, or weights) for the next."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._count = itertools.count(1)

    @contextmanager
    def use(self, commit: str):
        path = self.root / f"{commit}-{next(self._count)}"
        shutil.rmtree(path, ignore_errors=True)  # (a folder a killed daemon left under this name)
        path.mkdir(parents=True)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def snapshot_root(workspace: Workspace) -> Path:
    """Where a run's commit snapshots are unpacked (beside the worktrees, out of the checkout's git)."""
    return workspace.main_root / "runs" / ".snapshots" / workspace.tag


def cancel_local(handle: dict, cwd_inside: list[Path]) -> bool:
    """Kill what a recorded process group (and anything carrying its marker) left running."""
    pgid, marker = handle.get("pgid"), handle.get("marker")
    if not pgid and not marker:
        return False
    killed = processes.kill_orphaned_group(int(pgid or 0), cwd_inside, marker=marker) if pgid else \
        processes.kill_marked(marker)
    if killed:
        log.warning("killed %d orphaned process(es) of %s (%s)", killed, f"group {pgid}" if pgid else marker,
                    handle.get("stage", "?"))
    return bool(killed)
