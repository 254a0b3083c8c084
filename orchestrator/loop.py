"""The experiment state machine: setup or resume, baseline, then one experiment after another.

    propose (agent edits the worktree) -> check (non-empty, allowed paths, compiles) -> commit
    -> phase.execute (train, trusted evaluation, confirmation) -> keep, or file the commit under
    refs/autorl/<tag>/exp-NNNN and reset the branch to the best -> one row in results.tsv

The state of the experiment in flight (number, stage, commit, process groups) is written to
results/<tag>/state.json before each step, so `--resume` after any crash can account for it.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable, Optional

from . import runner
from .agents.base import AgentContext, NoMoreProposals, Outcome, Proposal
from .daemon import (LockHeld, RunLock, StopControl, StopRequested, log, progress, read_state,
                     setup_logging, write_state)
from .phases import PHASES, Phase, TrainPhase, Verdict, parse_schedule
from .results import ResultsFile, Row, compact_table, summarize, utc_now
from .workspace import Workspace, repo_root

HARNESS = "evaluate.py"
BASELINE_RUNS = 2


class RunError(Exception):
    """A problem the user must fix before the run can go on (the message says what)."""


@dataclass
class RunConfig:
    """What fixes a run's scores; written to results/<tag>/run.json and kept across resumes."""
    tag: str
    env_id: str
    budget_s: float
    grace_s: float
    eval_episodes: int
    eval_seed: int                        # held out: drawn here, kept only in run.json
    train_seeds: list[int]
    confirm_seed: int
    eval_timeout_s: float
    eval_workers: Optional[int]
    schedule: list[str]
    main_root: str
    worktree: str
    branch: str
    base_commit: str
    harness_sha256: str
    created: str
    agent: str                            # what a --resume without --agent uses again
    agent_options: dict = field(default_factory=dict)
    schedule_from_agent: bool = False     # replay: each folder's files say its phase
    # translate phase
    repair_rounds: int = 3
    target_speedup: float = 100.0
    translate_patience: int = 3
    verify_timeout_s: float = 1800.0
    bench_seconds: float = 2.0

    @classmethod
    def load(cls, path: Path) -> "RunConfig":
        data = json.loads(path.read_text())
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")


@dataclass
class Limits:
    """When this session stops (besides a stop request). None: no limit."""
    max_experiments: Optional[int] = None     # experiments after the baseline, in the whole run
    deadline: Optional[float] = None          # epoch seconds (--until, --max-hours)
    max_cost: Optional[float] = None          # USD, the whole run
    backoff_base_s: float = 5.0
    backoff_cap_s: float = 300.0


@dataclass
class Options:
    """A parsed `run` command (the CLI builds it; tests may too)."""
    env_id: Optional[str] = None
    tag: Optional[str] = None
    agent: Optional[str] = None
    resume: bool = False
    budget_s: Optional[float] = None
    grace_s: Optional[float] = None
    eval_episodes: Optional[int] = None
    eval_timeout_s: float = 1800.0
    eval_workers: Optional[int] = None
    phases: Optional[str] = None
    schedule: Optional[str] = None
    repair_rounds: int = 3
    target_speedup: float = 100.0
    translate_patience: int = 3
    bench_seconds: float = 2.0
    limits: Limits = field(default_factory=Limits)
    repo: Optional[Path] = None
    agent_args: object = None                # the argparse namespace, for the agent factory


# ---------------------------------------------------------------- naming
def env_slug(env_id: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", env_id.lower()).strip("_")


def default_tag(env_id: str, now: Optional[datetime] = None) -> str:
    now = now or datetime.now()
    return f"{env_slug(env_id)}-{now.strftime('%b').lower()}{now.day}"


TAG_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def check_tag(tag: str) -> str:
    if not TAG_PATTERN.match(tag) or ".." in tag or tag.endswith((".lock", ".")):
        raise RunError(f"bad tag {tag!r}: use letters, digits, '.', '_' and '-' (it names a git branch)")
    return tag


def parse_until(text: str, now: Optional[datetime] = None) -> float:
    """`--until HH:MM` (local time): the next time the clock shows it."""
    match = re.fullmatch(r"(\d{1,2}):(\d{2})", text.strip())
    if not match or int(match[1]) > 23 or int(match[2]) > 59:
        raise RunError(f"--until wants HH:MM (24-hour local time), got {text!r}")
    now = now or datetime.now()
    target = now.replace(hour=int(match[1]), minute=int(match[2]), second=0, microsecond=0)
    if target <= now:
        target += timedelta(days=1)
    return target.timestamp()


def default_agent(environ: dict) -> tuple[str, str]:
    if environ.get("ANTHROPIC_API_KEY"):
        return "anthropic", "ANTHROPIC_API_KEY is set"
    return "optuna", "ANTHROPIC_API_KEY is not set, so the offline Optuna agent tunes hyperparameters"


def check_env_id(env_id: str) -> None:
    if ":" in env_id:
        return  # `module:Env-v0` registers on import; the baseline run will tell
    import gymnasium

    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error as exc:
        raise RunError(f"unknown environment {env_id!r}: {exc}") from None


# ---------------------------------------------------------------- the run
class Run:
    def __init__(self, config: RunConfig, run_dir: Path, workspace: Workspace, limits: Limits,
                 stop: StopControl, harness_bytes: bytes):
        self.config = config
        self.run_dir = run_dir
        self.workspace = workspace
        self.limits = limits
        self.stop = stop
        self.harness_bytes = harness_bytes
        self.results = ResultsFile(run_dir / "results.tsv")
        self.agent = None
        self.phases = {name: PHASES[name]() for name in PHASES}  # one instance per kind
        self.schedule = [self.phases[name] for name in config.schedule]
        self.pending_cost = 0.0          # spent by agent turns that failed before a row
        self.agent_failures = 0
        self.last_failure: Optional[str] = None
        self.in_flight: Optional[dict] = None
        self._warned_main_harness = False
        self.session_started = time.time()
        self.best_score: Optional[float] = None
        self.best_commit = config.base_commit
        self._load_best()

    # ------------------------------------------------------------ derived state
    @property
    def harness(self) -> Path:
        return self.run_dir / HARNESS

    def rows(self) -> list[Row]:
        return self.results.read()

    def _load_best(self) -> None:
        rows = self.rows()
        summary = summarize(rows)
        self.best_score = summary["best"]
        if summary["best_commit"]:
            self.best_commit = self.workspace.resolve(summary["best_commit"])

    @property
    def noise(self) -> float:
        scores = [r.score for r in self.rows() if r.exp == 0 and r.status == "baseline"][:BASELINE_RUNS]
        return abs(scores[0] - scores[1]) if len(scores) == BASELINE_RUNS else 0.0

    def exp_dir(self, exp: int) -> Path:
        return self.run_dir / f"exp-{exp:04d}"

    def next_exp(self) -> int:
        return max([r.exp for r in self.rows()] + [0]) + 1

    def total_cost(self) -> float:
        return sum(r.cost_usd for r in self.rows()) + self.pending_cost

    # ------------------------------------------------------------ state of the experiment in flight
    def set_in_flight(self, exp: int, phase: str, stage: str, commit: Optional[str] = None) -> None:
        if self.in_flight is None or self.in_flight["exp"] != exp:
            self.in_flight = {"exp": exp, "phase": phase, "started": time.time(),
                              "rows_before": len(self.rows()), "pgids": []}
        self.in_flight.update(stage=stage)
        if commit:
            self.in_flight["commit"] = commit
        self._save_state()

    def note_process(self, pgid: int, kind: str) -> None:
        """Record a process group before waiting on it, so a resume can kill it as an orphan."""
        if self.in_flight is not None:
            self.in_flight["pgids"].append(pgid)
            self.in_flight["stage"] = kind
            self._save_state()

    def clear_in_flight(self) -> None:
        self.in_flight = None
        self._save_state()

    def _save_state(self) -> None:
        write_state(self.run_dir, {"pid": os.getpid(), "session_started": self.session_started,
                                   "in_flight": self.in_flight})

    # ------------------------------------------------------------ trusted evaluation
    def evaluate(self, policy: Path, exp_dir: Path, label: str = "") -> runner.EvalResult:
        cfg = self.config
        try:
            return runner.run_harness(
                self.harness, cfg.harness_sha256, policy, cfg.env_id, cfg.eval_episodes, cfg.eval_seed,
                exp_dir / "eval.json", exp_dir / "eval.log", cfg.eval_timeout_s, self.stop.requested,
                workers=cfg.eval_workers, on_spawn=lambda pgid: self.note_process(pgid, "eval"),
                on_tick=lambda t: progress.show(f"{label or exp_dir.name}: evaluating {cfg.eval_episodes} episodes, {t:.0f}s"))
        except runner.HarnessTampered as exc:
            log.error("%s; restoring it from the copy verified at startup", exc)
            self.harness.write_bytes(self.harness_bytes)
            return runner.EvalResult(False, error="the trusted harness copy was modified during the "
                                     "experiment", tampered=True)

    # ------------------------------------------------------------ rows
    def append(self, row: Row) -> None:
        """fsync'd append; a moment of full disk is waited out rather than losing the row."""
        delay = 1.0
        while True:
            try:
                self.results.append(row)
                return
            except OSError as exc:
                log.error("cannot write results.tsv (%s); retrying in %.0fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 60.0)

    # ------------------------------------------------------------ resume
    def recover(self) -> None:
        """Account for an experiment that was in flight when the previous daemon died."""
        torn = self.results.repair_torn_tail()
        if torn:
            log.warning("results.tsv ended in a torn line (cut): %r", torn[:120])
        state = read_state(self.run_dir)
        in_flight = state.get("in_flight")
        if in_flight:
            for pgid in in_flight.get("pgids", []):
                killed = runner.kill_orphaned_group(pgid, [self.workspace.path, self.run_dir])
                if killed:
                    log.warning("killed %d orphaned process(es) of group %d left by the previous daemon",
                                killed, pgid)
            if len(self.rows()) <= in_flight.get("rows_before", 0):
                exp, commit = in_flight["exp"], in_flight.get("commit")
                self._load_best()
                # Died between committing and recording the commit: the branch tip is that commit.
                commit = commit or (self.workspace.head() if self.workspace.head() != self.best_commit else None)
                if commit and commit != self.best_commit:
                    self.workspace.keep_ref(exp, commit)
                self.append(Row(exp=exp, phase=in_flight.get("phase", "train"), status="interrupted",
                                commit=self.workspace.short(commit) if commit else "",
                                best=self.best_score, cost_usd=self.pending_cost,
                                description=f"interrupted: the daemon died during {in_flight.get('stage')}"
                                            " (recovered on resume)"))
                log.warning("exp %d was in flight when the daemon died: recorded as interrupted", exp)
        self.in_flight = None
        self._save_state()
        self._load_best()
        self.workspace.reset_to(self.best_commit)
        last = self.rows()[-1] if self.rows() else None
        if last is not None:
            failure = self.exp_dir(last.exp) / "failure.txt"
            self.last_failure = failure.read_text() if failure.exists() else None

    # ------------------------------------------------------------ baseline
    def run_baseline(self) -> bool:
        """Train the unmodified train.py twice (noise estimate). False when stopped."""
        phase = TrainPhase()
        while True:
            done = [r for r in self.rows() if r.exp == 0 and r.status == "baseline"]
            index = len(done)
            if index >= BASELINE_RUNS:
                log.info("baseline: %s (noise estimate %.3f)", ", ".join(f"{r.score:.3f}" for r in done),
                         self.noise)
                return True
            if self.stop.requested():
                return False
            seed = self.config.train_seeds[index]
            exp_dir = self.exp_dir(0) if index == 0 else self.exp_dir(0) / f"run-{index + 1}"
            self.set_in_flight(0, phase.name, "baseline", commit=self.best_commit)
            m = phase.measure(self, f"baseline {index + 1}/{BASELINE_RUNS}", seed, exp_dir)
            commit = self.workspace.short(self.best_commit)
            if m.status:
                self.append(Row(exp=0, phase=phase.name, status=m.status, commit=commit,
                                best=self.best_score, env_steps=m.env_steps, sps=m.sps, wall_s=m.wall_s,
                                description=f"baseline seed {seed} [{m.note}]"))
                self.clear_in_flight()
                if m.status == "interrupted":
                    return False
                raise RunError(f"the unmodified {runner.TRAIN_SCRIPT} failed its baseline run ({m.status}: "
                               f"{m.note}); see {exp_dir / 'train.log'}. Fix it, commit, and start a new run "
                               f"(--tag), or `--resume` to retry this one as it is")
            scores = [r.score for r in done] + [m.score]
            self.best_score = sum(scores) / len(scores)
            self.append(Row(exp=0, phase=phase.name, status="baseline", commit=commit, score=m.score,
                            best=self.best_score, env_steps=m.env_steps, sps=m.sps, wall_s=m.wall_s,
                            description=f"baseline seed {seed}"))
            self.clear_in_flight()

    # ------------------------------------------------------------ re-baseline after a kept translation
    def needs_rebaseline(self) -> bool:
        """A translation was kept and the incumbent train.py has not been retrained on it yet."""
        rows = self.rows()
        kept = [i for i, r in enumerate(rows) if r.phase == "translate" and r.status == "keep"]
        return bool(kept) and not any(r.phase == "train" and r.status != "interrupted" for r in rows[kept[-1] + 1:])

    def run_rebaseline(self, exp: int) -> None:
        """Retrain the best train.py on the new backend so later experiments compare like with like.

        Its score becomes the best to beat. If training fails on the new backend, the translation
        is reverted (its commit stays under refs/autorl/<tag>/exp-NNNN of its experiment)."""
        phase = TrainPhase()
        exp_dir = self.exp_dir(exp)
        shutil.rmtree(exp_dir, ignore_errors=True)
        started = time.monotonic()
        self.set_in_flight(exp, phase.name, "re-baseline", commit=self.best_commit)
        m = phase.measure(self, f"exp {exp} re-baseline", self.config.train_seeds[0], exp_dir)
        commit = self.workspace.short(self.best_commit)
        description = "re-baseline: the best train.py retrained on the newly kept backend"
        note = m.note
        if m.status in ("crash", "timeout"):  # training fails on the new backend: revert the translation
            translation = [r for r in self.rows() if r.phase == "translate" and r.status == "keep"][-1]
            record = self.exp_dir(translation.exp) / "translate.json"
            previous = json.loads(record.read_text()).get("previous_best") if record.exists() else None
            if previous:
                self.workspace.keep_ref(translation.exp, self.best_commit)
                self.best_commit = previous
                self.workspace.reset_to(previous)
            note = f"{m.note}; the translation of exp {translation.exp} is reverted"
            self.last_failure = m.failure
        elif m.status is None:
            self.best_score = m.score
            note = f"was {self._previous_best_text()}"
        self.append(Row(exp=exp, phase=phase.name, status=m.status or "baseline", commit=commit, score=m.score,
                        best=self.best_score, env_steps=m.env_steps, sps=m.sps,
                        wall_s=time.monotonic() - started, description=f"{description} [{note}]"))
        self.clear_in_flight()
        log.info("exp %d: re-baseline %s", exp, "score %.3f" % m.score if m.score is not None else m.status)

    def _previous_best_text(self) -> str:
        scored = [r.best for r in self.rows() if r.best is not None]
        return f"best {scored[-1]:.3f} on the previous backend" if scored else "no score yet"

    # ------------------------------------------------------------ one experiment
    def context(self, exp: int, phase: Phase, exp_dir: Path, repair_round: int = 0) -> AgentContext:
        program = Path(self.config.main_root) / "program.md"  # the human steers by editing it
        if not program.exists():
            program = self.workspace.path / "program.md"
        return AgentContext(
            phase=phase.name, exp=exp, env_id=self.config.env_id, worktree=self.workspace.path,
            run_dir=self.run_dir, exp_dir=exp_dir,
            program=program.read_text() if program.exists() else "",
            allowed_paths=phase.allowed_paths(self), results_table=compact_table(self.rows()),
            last_failure=self.last_failure, repair_round=repair_round,
            notes_path=self.run_dir / "notes.md")

    def propose(self, ctx: AgentContext) -> Proposal:
        """The agent's turn; a stop request interrupts it (StopRequested)."""
        with self.stop.interruptible():
            return self.agent.propose(ctx)

    def run_experiment(self, exp: int, phase: Phase) -> None:
        exp_dir = self.exp_dir(exp)
        shutil.rmtree(exp_dir, ignore_errors=True)  # a retried attempt starts clean
        exp_dir.mkdir(parents=True)
        started = time.monotonic()
        self.set_in_flight(exp, phase.name, "agent")
        ctx = self.context(exp, phase, exp_dir)
        log.info("exp %d (%s): asking the %s agent", exp, phase.name, self.agent.name)
        try:
            proposal = self.propose(ctx)
        except NoMoreProposals:
            raise
        except StopRequested:
            self._conclude(exp, phase, ctx, self._commit_leftovers(exp), Verdict(
                "interrupted", note="stopped while the agent was working"), "", 0.0, started)
            return
        except Exception as exc:
            self._agent_failed(exp, exc)
            return
        self.agent_failures = 0
        cost = proposal.cost_usd + self.pending_cost
        self.pending_cost = 0.0
        description = proposal.description
        changed = self.workspace.changed_paths(self.best_commit)
        if self.stop.requested():
            commit = self.workspace.commit(description) if changed else None
            self._conclude(exp, phase, ctx, commit, Verdict("interrupted", note="stopped before training"),
                           description, cost, started)
            return
        if not changed:
            self._conclude(exp, phase, ctx, None, Verdict("invalid", note="no change",
                                                          failure="your last proposal changed nothing"),
                           description, cost, started)
            return
        commit = self.workspace.commit(description)
        (exp_dir / "diff.patch").write_text(self.workspace.diff(self.best_commit, commit))
        self.set_in_flight(exp, phase.name, "check", commit=commit)
        problem = phase.check(self, changed)
        if problem:
            verdict = Verdict("invalid", note=problem, failure=f"the proposal was rejected: {problem}")
        else:
            verdict = phase.execute(self, exp, exp_dir, commit)
        self._conclude(exp, phase, ctx, commit, verdict, description, cost, started)

    def _commit_leftovers(self, exp: int) -> Optional[str]:
        changed = self.workspace.changed_paths(self.best_commit)
        return self.workspace.commit(f"exp {exp}: unfinished edits (stopped)") if changed else None

    def _conclude(self, exp: int, phase: Phase, ctx: AgentContext, commit: Optional[str],
                  verdict: Verdict, description: str, cost: float, started: float) -> None:
        commit = verdict.extra.get("commit", commit)  # a translate experiment's last repair round
        cost += verdict.extra.get("cost_usd", 0.0)
        if verdict.status == "keep":
            self.best_commit = commit
            if verdict.score is not None:  # a kept translation changes the backend, not the score
                self.best_score = verdict.score
        elif commit:
            self.workspace.keep_ref(exp, commit)
        # Also after a keep: whatever the train run wrote into the worktree goes.
        self.workspace.reset_to(self.best_commit)
        text = description.strip() or "(no description)"
        if verdict.note:
            text = f"{text} [{verdict.note}]"
        row = Row(exp=exp, phase=phase.name, status=verdict.status,
                  commit=self.workspace.short(commit) if commit else "", score=verdict.score,
                  best=self.best_score, env_steps=verdict.env_steps, sps=verdict.sps,
                  wall_s=time.monotonic() - started, cost_usd=cost, description=text)
        self.append(row)
        self._check_main_harness(exp)
        self.last_failure = verdict.failure
        if verdict.failure:
            (self.exp_dir(exp) / "failure.txt").write_text(verdict.failure)
        self.clear_in_flight()
        score = "-" if verdict.score is None else f"{verdict.score:.3f}"
        log.info("exp %d: %s  score %s  best %.3f  %s", exp, verdict.status.upper(), score,
                 self.best_score, text)
        try:
            self.agent.tell(ctx, Outcome(verdict.status, verdict.score, self.best_score))
        except Exception as exc:  # learning from an outcome is optional; the night goes on
            log.warning("the agent failed to take the outcome of exp %d: %s", exp, exc)

    def _check_main_harness(self, exp: int) -> None:
        """Warn (once) when the checkout's evaluate.py changed: a new run would copy it."""
        main_harness = Path(self.config.main_root) / HARNESS
        if self._warned_main_harness or not main_harness.exists():
            return
        if runner.sha256_file(main_harness) != self.config.harness_sha256:
            self._warned_main_harness = True
            log.warning("%s changed during exp %d (by the candidate?); this run keeps scoring with its verified "
                        "copy, but check it before starting another run", main_harness, exp)

    def _agent_failed(self, exp: int, exc: Exception) -> None:
        self.agent_failures += 1
        self.pending_cost += float(getattr(exc, "cost_usd", 0.0) or 0.0)
        delay = min(self.limits.backoff_cap_s, self.limits.backoff_base_s * 2 ** (self.agent_failures - 1))
        log.warning("exp %d: the agent failed (%s: %s); retrying in %.0fs (failure %d in a row)",
                    exp, type(exc).__name__, exc, delay, self.agent_failures)
        self.workspace.reset_to(self.best_commit)
        self.clear_in_flight()
        self.stop.sleep(delay)

    # ------------------------------------------------------------ the night
    def stop_reason(self) -> Optional[str]:
        if self.stop.requested():
            return f"stopped ({self.stop.reason})"
        lim = self.limits
        done = len({r.exp for r in self.rows() if r.exp > 0})
        if lim.max_experiments is not None and done >= lim.max_experiments:
            return f"--max-experiments {lim.max_experiments} reached"
        if lim.max_cost is not None and self.total_cost() >= lim.max_cost:
            return f"--max-cost reached (${self.total_cost():.2f} of ${lim.max_cost:.2f})"
        if lim.deadline is not None and time.time() + self.config.budget_s > lim.deadline:
            return "the deadline leaves no time for another experiment"
        return None

    def phase_for(self, exp: int) -> Optional[Phase]:
        """The schedule's phase for this experiment, skipping phases that are done."""
        hint = getattr(self.agent, "phase_hint", None)
        if self.config.schedule_from_agent and hint is not None:
            name = hint(exp)  # replay: the folder's files say which phase (None: the schedule decides)
            if name in self.phases:
                return self.phases[name]
        count = len(self.schedule)
        for offset in range(count):
            phase = self.schedule[(exp - 1 + offset) % count]
            if phase.wants_turn(self):
                return phase
        return None

    def loop(self) -> str:
        while True:
            reason = self.stop_reason()
            if reason:
                return reason
            exp = self.next_exp()
            if self.needs_rebaseline():
                self.run_rebaseline(exp)
                continue
            phase = self.phase_for(exp)
            if phase is None:
                return "no phase wants another experiment"
            try:
                self.run_experiment(exp, phase)
            except NoMoreProposals as exc:
                self.workspace.reset_to(self.best_commit)
                self.clear_in_flight()
                return f"the agent has no more proposals ({exc})" if str(exc) else "the agent has no more proposals"
            except Exception as exc:  # a daemon-side failure (disk, git): log, back off, go on
                log.exception("exp %d failed inside the daemon: %s", exp, exc)
                if self.in_flight and self.in_flight.get("commit"):
                    self.workspace.keep_ref(exp, self.in_flight["commit"])
                self.agent_failures += 1
                delay = min(self.limits.backoff_cap_s, self.limits.backoff_base_s * 2 ** (self.agent_failures - 1))
                try:
                    self.workspace.reset_to(self.best_commit)
                except Exception as reset_exc:
                    log.error("cannot reset the worktree: %s", reset_exc)
                self.stop.sleep(delay)

    def summary_line(self) -> str:
        s = summarize(self.rows())
        counts = " ".join(f"{k} {v}" for k, v in sorted(s["counts"].items()))
        return (f"best {s['best']:.3f} at {s['best_commit']} (exp {s['best_exp']}); {s['experiments']} "
                f"experiments ({counts}); cost ${s['cost_usd']:.2f}" if s["best"] is not None
                else f"no score yet; {counts}")


# ---------------------------------------------------------------- entry point
def find_run_to_resume(results_root: Path, env_id: Optional[str]) -> Optional[str]:
    """The most recently active run (for env_id, when given)."""
    candidates = []
    for run_json in results_root.glob("*/run.json"):
        try:
            data = json.loads(run_json.read_text())
        except ValueError:
            continue
        if env_id is None or data.get("env_id") == env_id:
            candidates.append((run_json.parent.stat().st_mtime, run_json.parent.name))
    return max(candidates)[1] if candidates else None


def start(options: Options, agent_factory: Callable, environ: dict) -> int:
    """`python -m orchestrator run`: returns the exit code."""
    setup_logging(None)
    root = repo_root(options.repo or Path.cwd())
    results_root = root / "results"
    tag = options.tag
    if tag is None:
        if options.env_id is None and not options.resume:
            raise RunError("--env ENV_ID is required for a new run")
        tag = default_tag(options.env_id) if options.env_id else None
        if options.resume and (tag is None or not (results_root / tag / "run.json").exists()):
            tag = find_run_to_resume(results_root, options.env_id)
            if tag is None:
                raise RunError("--resume: no run to resume" + (f" for {options.env_id}" if options.env_id else "")
                               + f" under {results_root}")
    check_tag(tag)
    run_dir = results_root / tag
    workspace = Workspace(root, tag)
    existing = (run_dir / "run.json").exists()
    if existing and not options.resume:
        raise RunError(f"run {tag!r} already exists ({run_dir}); pass --resume to continue it, or --tag NAME "
                       "for a new run")
    if options.resume and not existing:
        raise RunError(f"--resume: there is no run {tag!r} ({run_dir / 'run.json'} is missing)")
    if not existing and workspace.exists():
        raise RunError(f"branch {workspace.branch} or folder {workspace.path} already exists without a run "
                       f"folder; remove them (git worktree remove, git branch -D) or choose another --tag")
    if not existing:
        _check_new_run(options, root)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except LockHeld as exc:
        raise RunError(f"run {tag!r} is already running (pid {exc.pid}); `python -m orchestrator stop --tag {tag}` "
                       "stops it") from None
    try:
        setup_logging(run_dir)
        stop = StopControl(run_dir)
        stop.install()
        if existing:
            config, harness_bytes = _resume_config(options, run_dir, workspace)
        if options.agent:
            agent_name, why = options.agent, "chosen with --agent"
        elif existing:
            agent_name, why = config.agent, "the agent this run started with"
            _restore_agent_options(options.agent_args, config.agent_options)
        else:
            agent_name, why = default_agent(environ)
        options.agent_args.agent = agent_name
        try:  # before anything is created: a misconfigured agent leaves no half-made run behind
            agent = agent_factory(options.agent_args, run_dir)
        except Exception as exc:
            raise RunError(f"cannot start the {agent_name} agent: {exc}") from None
        if existing:
            log.info("resuming run %s (%s) in %s", tag, config.env_id, workspace.path)
        else:
            config, harness_bytes = _new_config(options, tag, root, run_dir, workspace, agent_name)
            log.info("new run %s: %s, budget %ss, %d eval episodes; worktree %s on branch %s", tag,
                     config.env_id, config.budget_s, config.eval_episodes, workspace.path, workspace.branch)
        log.info("agent: %s (%s)", agent_name, why)
        run = Run(config, run_dir, workspace, options.limits, stop, harness_bytes)
        run.agent = agent
        if existing:
            run.recover()
        if run.run_baseline():
            reason = run.loop()
        else:
            reason = f"stopped ({stop.reason})"
        run.workspace.reset_to(run.best_commit)
        log.info("run %s ended: %s; %s", tag, reason, run.summary_line())
        log.info("results: %s; branch %s is at the best commit", run.results.path, workspace.branch)
        return 0
    except BaseException:
        if created and not (run_dir / "run.json").exists():  # a new run that never started
            lock.release()
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    finally:
        progress.active = False
        lock.release()


# Agents that write code alternate translating the env and training; optuna only tunes train.py.
CODE_WRITING_AGENTS = ("anthropic", "command")
DEFAULT_PHASES, DEFAULT_SCHEDULE = "translate,train", "translate:1,train:4"


def _schedule(options: Options, agent_name: Optional[str] = None) -> list[str]:
    phases, schedule = options.phases, options.schedule
    if not phases and not schedule:
        if agent_name in CODE_WRITING_AGENTS:
            phases, schedule = DEFAULT_PHASES, DEFAULT_SCHEDULE
    elif phases and not schedule and set(phases.replace(" ", "").split(",")) == {"translate", "train"}:
        schedule = DEFAULT_SCHEDULE
    try:
        return parse_schedule(phases, schedule)
    except ValueError as exc:
        raise RunError(str(exc)) from None


# Agent options a resume without --agent takes over from the run's start.
AGENT_OPTIONS = ("replay_dir", "agent_cmd", "agent_timeout", "model", "max_turns", "price_table", "optuna_params")


def _agent_options(args) -> dict:
    options = {}
    for name in AGENT_OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            options[name] = str(Path(value).resolve()) if name == "replay_dir" else value
    return options


def _restore_agent_options(args, stored: dict) -> None:
    for name, value in stored.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def _check_new_run(options: Options, root: Path) -> None:
    check_env_id(options.env_id)
    for required, why in ((HARNESS, "the trusted harness is needed to score experiments"),
                          (runner.TRAIN_SCRIPT, "nothing to train")):
        if not (root / required).is_file():
            raise RunError(f"{root / required} is missing: {why}")
    _schedule(options)


def _new_config(options: Options, tag: str, root: Path, run_dir: Path, workspace: Workspace,
                agent_name: str) -> tuple[RunConfig, bytes]:
    env_id = options.env_id
    harness_src = root / HARNESS
    harness_budget, harness_episodes = _harness_defaults(root)
    budget = options.budget_s if options.budget_s is not None else harness_budget
    if workspace.main_is_dirty():
        log.warning("the main checkout has uncommitted changes; the run starts from its last commit")
    schedule = _schedule(options, agent_name)
    base = workspace.create()
    harness_bytes = harness_src.read_bytes()
    (run_dir / HARNESS).write_bytes(harness_bytes)
    config = RunConfig(
        tag=tag, env_id=env_id, budget_s=budget,
        grace_s=options.grace_s if options.grace_s is not None else max(30.0, 0.1 * budget),
        eval_episodes=options.eval_episodes or harness_episodes,
        eval_seed=secrets.randbelow(2**31 - 1_000_000), train_seeds=[1, 2], confirm_seed=2,
        eval_timeout_s=options.eval_timeout_s, eval_workers=options.eval_workers, schedule=schedule,
        main_root=str(root), worktree=str(workspace.path), branch=workspace.branch, base_commit=base,
        harness_sha256=runner.sha256_file(run_dir / HARNESS), created=utc_now(), agent=agent_name,
        agent_options=_agent_options(options.agent_args),
        schedule_from_agent=agent_name == "replay" and not (options.phases or options.schedule),
        repair_rounds=options.repair_rounds, target_speedup=options.target_speedup,
        translate_patience=options.translate_patience, bench_seconds=options.bench_seconds)
    config.save(run_dir / "run.json")
    ResultsFile(run_dir / "results.tsv").create()
    return config, harness_bytes


def _harness_defaults(root: Path) -> tuple[float, int]:
    """evaluate.py's TIME_BUDGET and NUM_EVAL_EPISODES, read in a separate process."""
    import subprocess
    import sys

    code = "import evaluate; print(evaluate.TIME_BUDGET, evaluate.NUM_EVAL_EPISODES)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          env=runner.scrubbed_env(), timeout=120)
    try:
        budget, episodes = proc.stdout.split()[-2:]
        return float(budget), int(episodes)
    except ValueError:
        raise RunError(f"cannot read TIME_BUDGET from {root / HARNESS}: {proc.stderr.strip()[-300:]}") from None


def _resume_config(options: Options, run_dir: Path, workspace: Workspace) -> tuple[RunConfig, bytes]:
    config = RunConfig.load(run_dir / "run.json")
    for flag, given, kept in (("--env", options.env_id, config.env_id),
                              ("--budget", options.budget_s, config.budget_s),
                              ("--eval-episodes", options.eval_episodes, config.eval_episodes)):
        if given is not None and given != kept:
            raise RunError(f"run {config.tag!r} was started with {flag} {kept}; a resumed run keeps it so its "
                           f"scores stay comparable (start a new --tag to change it)")
    harness_bytes = (run_dir / HARNESS).read_bytes()
    if runner.sha256_file(run_dir / HARNESS) != config.harness_sha256:
        raise RunError(f"{run_dir / HARNESS} no longer matches the hash recorded in run.json; the run's "
                       "scores cannot be trusted to continue (start a new --tag)")
    if options.phases or options.schedule:
        config.schedule = _schedule(options)
        config.save(run_dir / "run.json")
    workspace.ensure()
    return config, harness_bytes
