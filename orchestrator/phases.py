"""Kinds of experiment. A phase says which paths the agent may change and how a committed
proposal is run, scored and judged.

The loop does what every phase shares: ask the agent, check the change (non-empty, allowed
paths, compiles), commit, then hand the commit to `phase.execute(run, exp, exp_dir, commit)`,
and finally keep the commit or file it under refs/autorl/<tag>/exp-NNNN according to the
returned Verdict (keep moves run.best_score/best_commit to the verdict's score and commit).

A new phase (translate) subclasses Phase and registers itself in PHASES. What it can use:
- `allowed_paths(run)` (glob patterns allowed) and `wants_turn(run)` (False: the schedule skips it);
- inside execute: `run.context(exp, self, exp_dir, repair_round=K)` + `run.propose(ctx)` for a
  repair round, `run.workspace.changed_paths/commit/diff`, `self.check(run, changed)`;
- `TrainPhase().measure(run, label, seed, exp_dir)` to retrain the incumbent (a re-baseline),
  `run.append(Row(...))` for an extra row, `run.stop.requested()` to notice a stop;
- a Verdict's `sps` and `note` fill the row's sps and the bracketed reason in its description.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from . import runner
from .daemon import log, progress
from .workspace import compile_errors, disallowed

if TYPE_CHECKING:
    from .loop import Run


@dataclass
class Measurement:
    """One train run scored by the trusted harness (status None when it went through)."""
    status: Optional[str] = None          # crash / timeout / invalid / interrupted, else None
    score: Optional[float] = None
    env_steps: Optional[int] = None
    sps: Optional[float] = None
    wall_s: float = 0.0
    note: str = ""                        # why, for the description column
    failure: Optional[str] = None         # what the agent gets next time (log tail, report)


@dataclass
class Verdict:
    status: str                           # keep discard crash timeout invalid interrupted
    score: Optional[float] = None
    env_steps: Optional[int] = None
    sps: Optional[float] = None
    note: str = ""
    failure: Optional[str] = None
    extra: dict = field(default_factory=dict)


class Phase:
    name = "phase"

    def allowed_paths(self, run: "Run") -> list[str]:
        raise NotImplementedError

    def wants_turn(self, run: "Run") -> bool:
        """False once this phase has nothing left to do (the schedule then skips it)."""
        return True

    def check(self, run: "Run", changed: list[str]) -> Optional[str]:
        """Why the change may not be run (None when it may)."""
        if not changed:
            return "no change"
        outside = disallowed(changed, self.allowed_paths(run))
        if outside:
            return f"changed paths outside {', '.join(self.allowed_paths(run))}: {', '.join(outside)}"
        return compile_errors(run.workspace.path, changed)

    def execute(self, run: "Run", exp: int, exp_dir: Path, commit: str) -> Verdict:
        raise NotImplementedError


class TrainPhase(Phase):
    """Edit candidate/train.py; train under the budget; score the artifact; keep if better."""

    name = "train"

    def allowed_paths(self, run: "Run") -> list[str]:
        return [runner.TRAIN_SCRIPT]

    def measure(self, run: "Run", label: str, seed: int, exp_dir: Path) -> Measurement:
        """Train once with `seed` in exp_dir and score the artifact with the trusted harness."""
        exp_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("train.log", "eval.json", "eval.log"):  # a retried attempt starts clean
            (exp_dir / stale).unlink(missing_ok=True)
        shutil.rmtree(exp_dir / "out", ignore_errors=True)
        cfg = run.config
        log_path = exp_dir / "train.log"
        log.info("%s: training %s with seed %d for %ss", label, runner.TRAIN_SCRIPT, seed, cfg.budget_s)
        train = runner.run_train(
            run.workspace.path, exp_dir / "out", log_path, cfg.env_id, cfg.budget_s, seed,
            cfg.grace_s, run.stop.requested,
            on_spawn=lambda pgid: run.note_process(pgid, "train"),
            on_tick=lambda t: progress.show(f"{label}: training {t:.0f}/{cfg.budget_s:.0f}s"),
        )
        m = Measurement(env_steps=_int(train.metrics.get("env_steps")),
                        sps=_float(train.metrics.get("sps")), wall_s=train.wall_s)
        tail = runner.log_tail(log_path)
        if train.interrupted:
            m.status, m.note = "interrupted", "stopped during training"
        elif train.timed_out:
            m.status, m.failure = "timeout", tail
            m.note = f"killed at {cfg.budget_s + cfg.grace_s:.0f}s (budget {cfg.budget_s:.0f}s + grace {cfg.grace_s:.0f}s)"
        elif train.returncode != 0:
            m.status, m.failure = "crash", tail
            m.note = f"train.py exited with {train.returncode}: {_last_line(tail)}"
        elif train.policy is None:
            m.status, m.failure = "crash", tail
            m.note = "no policy.pt in AUTORL_OUTPUT_DIR"
        if m.status:
            return m
        log.info("%s: trained (%s env steps, %s sps); evaluating with the trusted harness",
                 label, m.env_steps, m.sps)
        evaluation = run.evaluate(train.policy, exp_dir, label)
        m.wall_s += evaluation.wall_s
        if evaluation.tampered:
            m.status, m.note = "invalid", evaluation.error
        elif evaluation.interrupted:
            m.status, m.note = "interrupted", "stopped during evaluation"
        elif not evaluation.ok:
            m.status = "timeout" if evaluation.timed_out else "crash"
            m.note = f"evaluation failed: {evaluation.error}"
            m.failure = f"{m.note}\n--- train.log tail ---\n{tail}"
        else:
            m.score = evaluation.score
            log.info("%s: score %.3f (se %.3f over %d episodes)", label, m.score,
                     evaluation.result.get("se", float("nan")), evaluation.result.get("episodes", 0))
        return m

    def execute(self, run: "Run", exp: int, exp_dir: Path, commit: str) -> Verdict:
        cfg = run.config
        first = self.measure(run, f"exp {exp}", cfg.train_seeds[0], exp_dir)
        if first.status:
            return _verdict(first, first.status)
        best, noise = run.best_score, run.noise
        if first.score > best + noise:
            return _verdict(first, "keep", f"beats {best:.3f} by more than the noise {noise:.3f}")
        if first.score <= best:
            return _verdict(first, "discard", f"not above best {best:.3f}")
        # A win inside the noise: retrain with the other baseline seed, judge the mean of both.
        log.info("exp %d: %.3f beats %.3f by less than the noise %.3f; confirming with seed %d",
                 exp, first.score, best, noise, cfg.confirm_seed)
        second = self.measure(run, f"exp {exp} confirm", cfg.confirm_seed, exp_dir / "confirm")
        if second.status == "interrupted":
            return _verdict(first, "interrupted", "stopped during the confirmation run")
        if second.status:
            v = _verdict(first, "discard", f"confirmation run {second.status}: {second.note}")
            v.failure = second.failure
            return v
        mean = (first.score + second.score) / 2
        combined = Measurement(score=mean, env_steps=first.env_steps, sps=first.sps,
                               wall_s=first.wall_s + second.wall_s)
        note = f"confirmed over 2 seeds: {first.score:.3f}, {second.score:.3f}"
        if mean > best:
            return _verdict(combined, "keep", note)
        return _verdict(combined, "discard", f"not confirmed over 2 seeds: {first.score:.3f}, "
                                             f"{second.score:.3f} (mean {mean:.3f} <= best {best:.3f})")


def _verdict(m: Measurement, status: str, note: str = "") -> Verdict:
    return Verdict(status, score=m.score, env_steps=m.env_steps, sps=m.sps,
                   note=note or m.note, failure=m.failure, extra={"wall_s": m.wall_s})


def _int(value) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float(value) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip()[:200] if lines else ""


PHASES: dict[str, type[Phase]] = {"train": TrainPhase}


def parse_schedule(phases: Optional[str], schedule: Optional[str]) -> list[str]:
    """`--phases train` / `--schedule translate:1,train:4` -> the repeating pattern of phase names."""
    names = [p.strip() for p in (phases or "train").split(",") if p.strip()]
    pattern: list[str] = []
    if schedule:
        for item in schedule.split(","):
            name, _, count = item.strip().partition(":")
            try:
                repeat = int(count or 1)
            except ValueError:
                raise ValueError(f"--schedule: {item!r} is not PHASE:COUNT") from None
            if repeat < 1:
                raise ValueError(f"--schedule: the count in {item!r} must be at least 1")
            pattern += [name] * repeat
    else:
        pattern = names
    for name in set(pattern) | set(names):
        if name not in PHASES:
            raise ValueError(f"unknown or unavailable phase {name!r}; available: {', '.join(PHASES)}")
    if schedule and set(pattern) - set(names) and phases:
        raise ValueError("--schedule names a phase that --phases leaves out")
    if not pattern:
        raise ValueError("no phase to run")
    return pattern
