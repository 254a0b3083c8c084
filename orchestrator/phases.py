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

import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from envs_fast.backend import slug

from . import runner
from .agents.base import NoMoreProposals
from .daemon import StopRequested, log, progress
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
            extra_env=backend_env(run),
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


class TranslatePhase(Phase):
    """Write or repair envs_fast/<slug>.py; verify L1-L3 (with repair rounds); benchmark; keep
    when verified and faster, at train.py's NUM_ENVS, than the backend training uses now."""

    name = "translate"

    def translation(self, run: "Run") -> str:
        return f"envs_fast/{slug(run.config.env_id)}.py"

    def allowed_paths(self, run: "Run") -> list[str]:
        return [self.translation(run)]

    def wants_turn(self, run: "Run") -> bool:
        cfg = run.config
        kept = [r for r in run.rows() if r.phase == self.name and r.status == "keep"]
        if kept:
            record = _read_json(run.exp_dir(kept[-1].exp) / "translate.json")
            if record.get("ratio", 0.0) >= cfg.target_speedup:
                return False
        since_gain = [r for r in run.rows() if r.phase == self.name and r.status not in ("keep", "interrupted")
                      and (not kept or r.exp > kept[-1].exp)]
        return len(since_gain) < cfg.translate_patience

    def execute(self, run: "Run", exp: int, exp_dir: Path, commit: str) -> Verdict:
        cfg = run.config
        previous_best = run.best_commit
        path = self.translation(run)
        extra = {"cost_usd": 0.0, "commit": commit}
        for repair in range(cfg.repair_rounds + 1):
            label = f"exp {exp}" + (f" repair {repair}" if repair else "")
            report, code = self._verify(run, label, exp_dir, repair)
            if code is None:
                return Verdict("interrupted", note="stopped during verification", extra=extra)
            if code == 0:
                break
            failure = report or "the verifier produced no report"
            if code != 1:  # bad input: file that does not import, protocol missing, timeout
                failure = f"verification could not run (exit {code}):\n{failure}"
            if repair == cfg.repair_rounds:
                return Verdict("discard", note=f"verification failed after {repair} repair round(s): "
                               f"{_first_line(failure)}", failure=failure, extra=extra)
            # A repair round: the agent gets the report and edits the same file; each round a commit.
            ctx = run.context(exp, self, exp_dir, repair_round=repair + 1)
            ctx.last_failure = failure
            try:
                proposal = run.propose(ctx)
            except NoMoreProposals:
                return Verdict("discard", note=f"verification failed: {_first_line(failure)}",
                               failure=failure, extra=extra)
            except StopRequested:
                return Verdict("interrupted", note="stopped during a repair round", extra=extra)
            extra["cost_usd"] += proposal.cost_usd
            changed = run.workspace.changed_paths(extra["commit"])
            if not changed:
                return Verdict("discard", note=f"repair round {repair + 1} changed nothing; verification "
                               f"failed: {_first_line(failure)}", failure=failure, extra=extra)
            problem = self.check(run, changed)
            extra["commit"] = run.workspace.commit(f"{proposal.description} (repair round {repair + 1})")
            if problem:
                return Verdict("invalid", note=f"repair round {repair + 1}: {problem}",
                               failure=f"the repair was rejected: {problem}", extra=extra)
            run.set_in_flight(exp, self.name, f"repair {repair + 1}", commit=extra["commit"])
        verified = "verified L1-L3" + (f" after {repair} repair round(s)" if repair else "")
        incumbent = self._incumbent_spec(run, previous_best, exp_dir)
        new = self._bench(run, f"exp {exp}", path, exp_dir / "bench.json")
        old = self._bench(run, f"exp {exp} incumbent", incumbent, exp_dir / "bench-incumbent.json")
        if new is None or old is None:
            stopped = run.stop.requested()
            return Verdict("interrupted" if stopped else "crash",
                           note="stopped during the benchmark" if stopped else f"{verified}; the benchmark failed",
                           failure=runner.log_tail(exp_dir / "bench.log"), extra=extra)
        speedup = new["adapter_sps"] / max(old["adapter_sps"], 1e-9)
        record = {"spec": path, "incumbent": _spec_name(incumbent), "ratio": new["ratio"], "speedup": speedup,
                  "adapter_sps": new["adapter_sps"], "incumbent_adapter_sps": old["adapter_sps"],
                  "backend_sps": new["backend_sps"], "reference_sps": new["reference_sps"],
                  "num_envs": new["adapter_num_envs"], "previous_best": previous_best}
        (exp_dir / "translate.json").write_text(json.dumps(record, indent=1) + "\n")
        figures = (f"{verified}; {new['ratio']:.0f}x the reference env; at {new['adapter_num_envs']} envs "
                   f"{new['adapter_sps']:,.0f} sps vs {old['adapter_sps']:,.0f} ({_spec_name(incumbent)}) = "
                   f"{speedup:.2f}x")
        status = "keep" if speedup > 1.0 else "discard"
        verdict = Verdict(status, sps=new["backend_sps"], note=figures if status == "keep" else
                          f"{figures}: not faster than the current backend", extra=extra)
        if status == "discard":
            verdict.failure = (f"Your translation passed verification but is not faster than the backend "
                               f"training uses now: {figures}. Make it faster.")
        return verdict

    # ---- the steps, each in a subprocess with the scrubbed environment (the translation is candidate code)
    def _verify(self, run: "Run", label: str, exp_dir: Path, repair: int) -> tuple[str, Optional[int]]:
        cfg = run.config
        json_path, log_path = exp_dir / f"verify.r{repair}.json", exp_dir / f"verify.r{repair}.log"
        log.info("%s: verifying %s at L1-L3", label, self.translation(run))
        result = runner.run_group(
            [sys.executable, "-m", "envs_fast.verify", "--env", cfg.env_id, "--backend", self.translation(run),
             "--levels", "1,2,3", "--json", str(json_path)],
            run.workspace.path, runner.scrubbed_env(backend_env(run)), log_path, cfg.verify_timeout_s,
            run.stop.requested, on_spawn=lambda pgid: run.note_process(pgid, "verify"),
            on_tick=lambda t: progress.show(f"{label}: verifying {t:.0f}s"))
        if result.interrupted:
            return "", None
        if json_path.exists():
            shutil.copyfile(json_path, exp_dir / "verify.json")  # the last round's full report
        report = log_path.read_text(encoding="utf-8", errors="replace") if log_path.exists() else ""
        if result.timed_out:
            return f"verification timed out after {cfg.verify_timeout_s:.0f}s\n{report[-4000:]}", 3
        log.info("%s: verification %s", label, "passed" if result.returncode == 0 else "FAILED")
        return report[-12000:], result.returncode

    def _bench(self, run: "Run", label: str, spec: str, json_path: Path) -> Optional[dict]:
        cfg = run.config
        log.info("%s: benchmarking %s", label, _spec_name(spec))
        result = runner.run_group(
            [sys.executable, "-m", "envs_fast.bench", "--env", cfg.env_id, "--backend", spec,
             "--seconds", runner.number_arg(cfg.bench_seconds), "--json", str(json_path)],
            run.workspace.path, runner.scrubbed_env(backend_env(run)), json_path.with_suffix(".log"),
            cfg.verify_timeout_s, run.stop.requested, on_spawn=lambda pgid: run.note_process(pgid, "bench"),
            on_tick=lambda t: progress.show(f"{label}: benchmarking {t:.0f}s"))
        if result.returncode != 0 or not json_path.exists():
            return None
        return _read_json(json_path) or None

    def _incumbent_spec(self, run: "Run", best_commit: str, exp_dir: Path) -> str:
        """What `make_vec_env(backend="auto")` used before this experiment: the kept translation (a
        copy of the best commit's file), else envpool where it has the env, else gymnasium."""
        try:
            old = run.workspace.repo.git.show(f"{best_commit}:{self.translation(run)}")
        except Exception:
            old = None
        kept = [r for r in run.rows() if r.phase == self.name and r.status == "keep"]
        if old is not None and kept:
            copy = exp_dir / f"incumbent_{Path(self.translation(run)).name}"
            copy.write_text(old + ("\n" if not old.endswith("\n") else ""))
            return str(copy)
        from envs_fast.envpool_backend import envpool_supports

        return "envpool" if envpool_supports(run.config.env_id) else "reference"


def verify_cache_dir(run_dir: Path) -> Path:
    """Verdicts of this run's backends: shared by the verifier and train.py's make_vec_env("auto")."""
    return run_dir / "verify-cache"


def backend_env(run: "Run") -> dict:
    """Environment for every process that picks or judges a backend (train, verify, bench): they
    share the run's verdict cache, so train.py's make_vec_env("auto") uses what was verified here."""
    return {"AUTORL_VERIFY_CACHE": str(verify_cache_dir(run.run_dir)), "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1"}


def _spec_name(spec: str) -> str:
    if spec.endswith(".py"):
        return "the kept translation" if Path(spec).name.startswith("incumbent_") else Path(spec).name
    return {"reference": "gymnasium vector env"}.get(spec, spec)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    failing = [line for line in lines if "FAIL" in line]
    return (failing[0] if failing else lines[0] if lines else "")[:240]


PHASES: dict[str, type[Phase]] = {"train": TrainPhase, "translate": TranslatePhase}


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
