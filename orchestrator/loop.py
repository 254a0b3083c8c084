"""The experiment state machine: baseline, then one round after another until a limit.

    a round: K candidates (--parallel K; 1 for translate) each proposed from the best commit
    (agent edits the worktree) -> checked (non-empty, allowed paths, compiles) -> committed;
    then the runner measures them concurrently, the phase judges them together, and each gets
    its row: keep (the branch moves to it) or its commit filed under refs/autorl/<tag>/exp-NNNN.

What is in flight (experiments, stages, commits, runner handles) is written to state.json
before each step (InFlight), so `--resume` after any crash can account for it.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .agents.base import AgentContext, NoMoreProposals, Outcome, Proposal
from .artifacts import TRAIN_SCRIPT
from .config import BASELINE_RUNS, Limits, RunConfig, RunError
from .daemon import StopControl, StopRequested, log
from .disk import DiskSpace, is_disk_full
from .guard import Guard
from .report import refresh as refresh_report
from .inflight import InFlight, recorded
from .keep_rule import Noise, night_noise, write_decision
from .phases import (PHASES, Incumbent, Phase, Repair, TrainPhase, TranslatePhase, TranslateTrial, Verdict,
                     translate_languages)
from .results import ExpFolder, ResultsFile, Row, RunFolder, compact_table, summarize
from .runners import Runner, Slot, cancel_handle
from .workspace import Workspace


@dataclass
class Candidate:
    """One experiment of a round, from the agent's turn to its row."""
    exp: int
    folder: ExpFolder
    ctx: AgentContext
    started: float
    description: str = ""
    cost_usd: float = 0.0
    commit: Optional[str] = None
    verdict: Optional[Verdict] = None     # set early when it never reaches the runner


class Run:
    def __init__(self, config: RunConfig, folder: RunFolder, workspace: Workspace, limits: Limits,
                 stop: StopControl, runner: Runner, journal: InFlight, agent, harness_bytes: bytes):
        self.config = config
        self.folder = folder
        self.workspace = workspace
        self.limits = limits
        self.stop = stop
        self.runner = runner
        self.journal = journal
        self.agent = agent
        self.results = ResultsFile(folder.results)
        self.phases = {name: PHASES[name]() for name in PHASES}  # one instance per kind
        self.phases["translate"] = TranslatePhase(translate_languages(config.translate_lang))
        self.schedule = [self.phases[name] for name in config.schedule]
        self.pending_cost = 0.0          # spent by agent turns that failed before a row
        self.agent_failures = 0
        self.last_failure: Optional[str] = None
        self._warned_main_harness = False
        self.best_score: Optional[float] = None
        self.best_commit = config.base_commit
        self.disk = DiskSpace(folder.path, journal.set_waiting, stop.requested, stop.sleep)
        self.guard = Guard(folder, harness_bytes)
        self._load_best()

    # ------------------------------------------------------------ derived state
    def rows(self) -> list[Row]:
        return self.results.read()

    def _load_best(self) -> None:
        summary = summarize(self.rows())
        self.best_score = summary["best"]
        if summary["best_commit"]:
            self.best_commit = self.workspace.resolve(summary["best_commit"])

    @property
    def noise(self) -> float:
        """Seed-to-seed noise of a run's score (sigma of the keep rule), from every pair so far."""
        return self.noise_estimate().sigma

    def noise_estimate(self) -> Noise:
        return night_noise(self.rows(), self.folder, self.config.train_seeds, self.config.confirm_seed)

    def incumbent(self) -> Incumbent:
        return Incumbent(self.best_score, self.best_commit, self.noise_estimate(),
                         (self.config.train_seeds[0], self.config.confirm_seed))

    def next_exp(self) -> int:
        return max([r.exp for r in self.rows()] + [0]) + 1

    def total_cost(self) -> float:
        return sum(r.cost_usd for r in self.rows()) + self.pending_cost

    def append(self, row: Row) -> None:
        """fsync'd append of a whole line or nothing; a full disk is waited out rather than losing
        the row. A stop while waiting re-raises: the experiment stays in state.json, and a
        `--resume` records it as interrupted."""
        delay = 1.0
        while True:
            try:
                self.results.append(row)
                self.guard.note(self.folder.results)
                if delay > 1.0:
                    self.journal.set_waiting(None)
                refresh_report(self.folder.path)  # the morning report is current at any hour
                return
            except OSError as exc:
                log.error("cannot write results.tsv (%s); retrying in %.0fs", exc, delay)
                if is_disk_full(exc):
                    self.disk.announce(f"waiting for disk space on {self.folder.path} to write results.tsv")
                if not self.stop.sleep(delay):
                    raise
                delay = min(delay * 2, 60.0)

    # ------------------------------------------------------------ resume
    def recover(self) -> None:
        """Account for the experiments that were in flight when the previous daemon died."""
        torn = self.results.repair_torn_tail()
        if torn:
            log.warning("results.tsv ended in a torn line (cut): %r", torn[:120])
        records = recorded(self.folder.path)
        self._load_best()
        for record in records:
            for handle in record.get("handles", []):
                cancel_handle(handle, self.runner)
        recorded_exps = {r.exp for r in self.rows()}
        for record in records:
            exp = record["exp"]
            missing = (len(self.rows()) <= record.get("rows_before", 0)) if exp == 0 else exp not in recorded_exps
            if not missing:
                continue
            commit = record.get("commit")
            if not commit and len(records) == 1 and self.workspace.head() != self.best_commit:
                commit = self.workspace.head()  # died between committing and recording the commit
            if commit and commit != self.best_commit:
                self.workspace.keep_ref(exp, commit)
            self.append(Row(exp=exp, phase=record.get("phase", "train"), status="interrupted",
                            commit=self.workspace.short(commit) if commit else "", best=self.best_score,
                            cost_usd=self.pending_cost,
                            description=f"interrupted: the daemon died during {record.get('stage')} "
                                        "(recovered on resume)"))
            self.pending_cost = 0.0
            log.warning("exp %d was in flight when the daemon died: recorded as interrupted", exp)
        self.journal.clear()
        self._load_best()
        self.workspace.reset_to(self.best_commit)
        last = self.rows()[-1] if self.rows() else None
        if last is not None:
            failure = self.folder.exp(last.exp).failure
            self.last_failure = failure.read_text() if failure.exists() else None

    # ------------------------------------------------------------ baseline
    def run_baseline(self) -> bool:
        """Train the unmodified train.py twice (noise estimate). False when stopped."""
        while True:
            done = [r for r in self.rows() if r.exp == 0 and r.status == "baseline"]
            index = len(done)
            if index >= BASELINE_RUNS:
                log.info("baseline: %s (noise estimate %.3f)", ", ".join(f"{r.score:.3f}" for r in done),
                         self.noise)
                return True
            if self.stop.requested() or not self.disk.wait():
                return False
            seed = self.config.train_seeds[index]
            folder = self.folder.exp(0).run(index + 1)
            self.journal.begin(0, "train", "baseline", len(self.rows()), commit=self.best_commit)
            m = self.runner.measure(Slot(0, folder, f"baseline {index + 1}/{BASELINE_RUNS}"), self.best_commit, seed)
            self._check_measurement(m)
            commit = self.workspace.short(self.best_commit)
            if m.status:
                self.append(Row(exp=0, phase="train", status=m.status, commit=commit, best=self.best_score,
                                env_steps=m.env_steps, sps=m.sps, wall_s=m.wall_s, cost_usd=m.compute_usd,
                                description=f"baseline seed {seed} [{m.note}]"))
                self.journal.end(0)
                if m.status == "interrupted":
                    return False
                raise RunError(f"the unmodified {TRAIN_SCRIPT} failed its baseline run ({m.status}: "
                               f"{m.note}); see {folder.train_log}. Fix it, commit, and start a new run "
                               f"(--tag), or `--resume` to retry this one as it is")
            scores = [r.score for r in done] + [m.score]
            self.best_score = sum(scores) / len(scores)
            self.append(Row(exp=0, phase="train", status="baseline", commit=commit, score=m.score,
                            best=self.best_score, env_steps=m.env_steps, sps=m.sps, wall_s=m.wall_s,
                            cost_usd=m.compute_usd, description=f"baseline seed {seed}"))
            self.journal.end(0)

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
        folder = self.folder.exp(exp)
        shutil.rmtree(folder.path, ignore_errors=True)
        started = time.monotonic()
        self.journal.begin(exp, "train", "re-baseline", len(self.rows()), commit=self.best_commit)
        m = self.runner.measure(Slot(exp, folder, f"exp {exp} re-baseline"), self.best_commit,
                                self.config.train_seeds[0])
        self._check_measurement(m)
        commit = self.workspace.short(self.best_commit)
        note = m.note
        if m.status in ("crash", "timeout"):  # training fails on the new backend: revert the translation
            translation = [r for r in self.rows() if r.phase == "translate" and r.status == "keep"][-1]
            record = self.folder.exp(translation.exp).translate
            previous = json.loads(record.read_text()).get("previous_best") if record.exists() else None
            if previous:
                self.workspace.keep_ref(translation.exp, self.best_commit)
                self.best_commit = previous
                self.workspace.reset_to(previous)
            note = f"{m.note}; the translation of exp {translation.exp} is reverted"
            self.last_failure = m.failure
        elif m.status is None:
            self.best_score = m.score
            scored = [r.best for r in self.rows() if r.best is not None]
            note = f"was best {scored[-1]:.3f} on the previous backend" if scored else "no score before"
        self.append(Row(exp=exp, phase="train", status=m.status or "baseline", commit=commit, score=m.score,
                        best=self.best_score, env_steps=m.env_steps, sps=m.sps,
                        wall_s=time.monotonic() - started, cost_usd=m.compute_usd,
                        description=f"re-baseline: the best train.py retrained on the newly kept backend [{note}]"))
        self.journal.end(exp)
        log.info("exp %d: re-baseline %s", exp, "score %.3f" % m.score if m.score is not None else m.status)

    # ------------------------------------------------------------ the agent's turn
    def context(self, exp: int, phase: Phase, folder: ExpFolder, repair_round: int = 0,
                peers: Optional[list[str]] = None) -> AgentContext:
        program = Path(self.config.main_root) / "program.md"  # the human steers by editing it
        if not program.exists():
            program = self.workspace.path / "program.md"
        return AgentContext(
            phase=phase.name, exp=exp, env_id=self.config.env_id, worktree=self.workspace.path,
            run_dir=self.folder.path, exp_dir=folder.path,
            program=program.read_text() if program.exists() else "",
            allowed_paths=phase.allowed_paths(self.config.env_id), results_table=compact_table(self.rows()),
            last_failure=self.last_failure, repair_round=repair_round,
            notes_path=self.folder.notes, round_peers=list(peers or []), sandbox=self.config.sandbox,
            main_root=Path(self.config.main_root))

    def propose(self, ctx: AgentContext) -> Proposal:
        """The agent's turn; a stop request interrupts it (StopRequested)."""
        with self.stop.interruptible():
            return self.agent.propose(ctx)

    def _candidate(self, exp: int, phase: Phase, peers: list[str]) -> Optional[Candidate]:
        """Ask the agent for one candidate and commit it (on a ref, since the branch stays at the
        best until the round is judged). None when the agent failed (retried with backoff)."""
        folder = self.folder.exp(exp)
        shutil.rmtree(folder.path, ignore_errors=True)  # a retried attempt starts clean
        folder.path.mkdir(parents=True)
        self.workspace.reset_to(self.best_commit)
        self.journal.begin(exp, phase.name, "agent", len(self.rows()))
        ctx = self.context(exp, phase, folder, peers=peers)
        c = Candidate(exp, folder, ctx, time.monotonic())
        log.info("exp %d (%s): asking the %s agent", exp, phase.name, self.agent.name)
        try:
            proposal = self.propose(ctx)
        except NoMoreProposals:
            self.journal.end(exp)
            raise
        except StopRequested:
            c.commit = self._commit_leftovers(exp)
            c.verdict = Verdict("interrupted", note="stopped while the agent was working")
            return c
        except Exception as exc:
            self._agent_failed(exp, exc)
            return None
        self.agent_failures = 0
        c.cost_usd, self.pending_cost = proposal.cost_usd + self.pending_cost, 0.0
        c.description = proposal.description
        changed = self.workspace.changed_paths(self.best_commit)
        if self.stop.requested():
            c.commit = self._commit(exp, c.description) if changed else None
            c.verdict = Verdict("interrupted", note="stopped before training")
            return c
        if not changed:
            c.verdict = Verdict("invalid", note="no change", failure="your last proposal changed nothing")
            return c
        c.commit = self._commit(exp, c.description)
        folder.diff.write_text(self.workspace.diff(self.best_commit, c.commit))
        problem = phase.check(self.workspace.path, self.config.env_id, changed)
        if problem:
            c.verdict = Verdict("invalid", note=problem, failure=f"the proposal was rejected: {problem}")
        return c

    def _commit(self, exp: int, description: str) -> str:
        commit = self.workspace.commit(description)
        self.workspace.keep_ref(exp, commit)  # reachable while the branch goes back for the next candidate
        self.journal.stage(exp, "committed", commit=commit)
        return commit

    def _commit_leftovers(self, exp: int) -> Optional[str]:
        changed = self.workspace.changed_paths(self.best_commit)
        return self._commit(exp, f"exp {exp}: unfinished edits (stopped)") if changed else None

    def _agent_failed(self, exp: int, exc: Exception) -> None:
        self.agent_failures += 1
        self.pending_cost += float(getattr(exc, "cost_usd", 0.0) or 0.0)
        delay = min(self.limits.backoff_cap_s, self.limits.backoff_base_s * 2 ** (self.agent_failures - 1))
        log.warning("exp %d: the agent failed (%s: %s); retrying in %.0fs (failure %d in a row)",
                    exp, type(exc).__name__, exc, delay, self.agent_failures)
        self.workspace.reset_to(self.best_commit)
        self.journal.end(exp)
        self.stop.sleep(delay)

    # ------------------------------------------------------------ a round
    def round_size(self) -> int:
        size = max(1, self.config.parallel)
        if self.limits.max_experiments is not None:
            size = min(size, max(1, self.limits.max_experiments - self._experiments_done()))
        return size

    def run_train_round(self, first_exp: int, phase: TrainPhase) -> None:
        candidates: list[Candidate] = []
        for i in range(self.round_size()):
            try:
                c = self._candidate(first_exp + i, phase, [c.description for c in candidates if c.description])
            except NoMoreProposals:
                if not candidates:
                    raise
                break
            if c is None:
                break
            candidates.append(c)
            if c.verdict is not None and c.verdict.status == "interrupted":
                break
        self.workspace.reset_to(self.best_commit)
        if not candidates:
            return
        ready = [c for c in candidates if c.verdict is None]
        if self.stop.requested():
            for c in ready:
                c.verdict = Verdict("interrupted", note="stopped before training")
            ready = []
        if ready:
            for c in ready:
                self.journal.stage(c.exp, "train")
            slots = [Slot(c.exp, c.folder, f"exp {c.exp}") for c in ready]
            seed = self.config.train_seeds[0]
            if len(ready) > 1:
                log.info("exps %s: training %d candidates at once", ", ".join(str(c.exp) for c in ready), len(ready))
                with ThreadPoolExecutor(max_workers=len(ready), thread_name_prefix="candidate") as pool:
                    measured = list(pool.map(lambda pair: self.runner.measure(pair[0], pair[1].commit, seed),
                                             zip(slots, ready)))
            else:
                measured = [self.runner.measure(slots[0], ready[0].commit, seed)]

            incumbent = self.incumbent()

            def confirm(i: int, k: int):
                c, seed = ready[i], incumbent.confirmation_seed(k)
                log.info("exp %d: %.3f is above the best %.3f but within the noise; confirmation %d with seed %d",
                         c.exp, measured[i].score, self.best_score, k, seed)
                self.journal.stage(c.exp, f"confirm {k}")
                return self.runner.measure(Slot(c.exp, c.folder.confirmation(k), f"exp {c.exp} confirm {k}"),
                                           c.commit, seed)

            verdicts = phase.judge_round(measured, incumbent, confirm, [c.exp for c in ready])
            for c, v in zip(ready, verdicts):
                c.verdict = v
            self._check_run_files(ready)
            for c, v in zip(ready, verdicts):  # the keep rule's evidence, with the status the row gets
                if v.decision:
                    write_decision(c.folder.decision, {**v.decision, "status": c.verdict.status,
                                                       "note": c.verdict.note})
        for c in candidates:  # keep first: the others' rows then show the new best
            if c.verdict.status == "keep":
                self._conclude(c, phase)
        for c in candidates:
            if c.verdict.status != "keep":
                self._conclude(c, phase)

    def run_translate(self, exp: int, phase: TranslatePhase) -> None:
        c = self._candidate(exp, phase, [])
        if c is None:
            return
        if c.verdict is None:
            self.journal.stage(exp, "verify")
            c.verdict = phase.execute(TranslateTrial(
                slot=Slot(exp, c.folder, f"exp {exp}"), commit=c.commit, previous_best=self.best_commit,
                env_id=self.config.env_id, repair_rounds=self.config.repair_rounds, runner=self.runner,
                spec=phase.spec_for(self.config.env_id, self.workspace.changed_paths(self.best_commit)),
                repair=lambda failure, round_: self._repair(c, phase, failure, round_),
                stop_requested=self.stop.requested))
            self._check_run_files([c])
        self._conclude(c, phase)

    def _repair(self, c: Candidate, phase: Phase, failure: str, round_: int) -> Repair:
        """A repair round: the agent gets the verifier's report and edits the same file; a commit."""
        current = c.commit
        self.workspace.reset_to(current)
        ctx = self.context(c.exp, phase, c.folder, repair_round=round_)
        ctx.last_failure = failure
        try:
            proposal = self.propose(ctx)
        except NoMoreProposals:
            return Repair("no more")
        except StopRequested:
            return Repair("stopped")
        changed = self.workspace.changed_paths(current)
        if not changed:
            return Repair("unchanged", cost_usd=proposal.cost_usd)
        problem = phase.check(self.workspace.path, self.config.env_id, changed)
        commit = self._commit(c.exp, f"{proposal.description} (repair round {round_})")
        c.commit = commit
        self.journal.stage(c.exp, f"repair {round_}", commit=commit)
        return Repair("invalid" if problem else "ok", commit=commit, cost_usd=proposal.cost_usd, problem=problem or "")

    def _check_measurement(self, m) -> None:
        changed = self.guard.check()
        if changed:
            m.status, m.score = "invalid", None
            m.note = f"{', '.join(changed)} of the run folder changed while it ran (restored)"

    def _check_run_files(self, candidates: list[Candidate]) -> None:
        """The daemon's files as it left them, else restored, and the candidates that ran meanwhile invalid."""
        changed = self.guard.check()
        if not changed:
            return
        note = f"{', '.join(changed)} of the run folder changed while this experiment ran (restored)"
        for c in candidates:
            c.verdict = Verdict("invalid", note=note, commit=c.verdict.commit if c.verdict else None,
                                failure=f"The run's own files must not be touched: {note}.")

    def _conclude(self, c: Candidate, phase: Phase) -> None:
        verdict = c.verdict
        commit = verdict.commit or c.commit
        cost = c.cost_usd + verdict.agent_cost_usd + verdict.compute_usd
        if verdict.status == "keep":
            self.best_commit = commit
            self.workspace.drop_ref(c.exp)  # the branch holds it now
            if verdict.score is not None:  # a kept translation changes the backend, not the score
                self.best_score = verdict.score
        elif commit:
            self.workspace.keep_ref(c.exp, commit)
        # Also after a keep: whatever was left in the worktree goes.
        self.workspace.reset_to(self.best_commit)
        text = c.description.strip() or "(no description)"
        if verdict.note:
            text = f"{text} [{verdict.note}]"
        self.append(Row(exp=c.exp, phase=phase.name, status=verdict.status,
                        commit=self.workspace.short(commit) if commit else "", score=verdict.score,
                        best=self.best_score, env_steps=verdict.env_steps, sps=verdict.sps,
                        wall_s=time.monotonic() - c.started, cost_usd=cost, description=text))
        self._check_main_harness(c.exp)
        self.last_failure = verdict.failure
        if verdict.failure:
            c.folder.failure.write_text(verdict.failure)
        self.journal.end(c.exp)
        score = "-" if verdict.score is None else f"{verdict.score:.3f}"
        best = "-" if self.best_score is None else f"{self.best_score:.3f}"
        log.info("exp %d: %s  score %s  best %s  %s", c.exp, verdict.status.upper(), score, best, text)
        try:
            self.agent.tell(c.ctx, Outcome(verdict.status, verdict.score, self.best_score))
        except Exception as exc:  # learning from an outcome is optional; the night goes on
            log.warning("the agent failed to take the outcome of exp %d: %s", c.exp, exc)

    def _check_main_harness(self, exp: int) -> None:
        """Warn (once) when the checkout's evaluate.py changed: a new run would copy it."""
        main_harness = Path(self.config.main_root) / RunFolder.HARNESS
        if self._warned_main_harness or not main_harness.exists():
            return
        if hashlib.sha256(main_harness.read_bytes()).hexdigest() != self.config.harness_sha256:
            self._warned_main_harness = True
            log.warning("%s changed during exp %d (by the candidate?); this run keeps scoring with its verified "
                        "copy, but check it before starting another run", main_harness, exp)

    # ------------------------------------------------------------ the night
    def _experiments_done(self) -> int:
        return len({r.exp for r in self.rows() if r.exp > 0})

    def stop_reason(self) -> Optional[str]:
        if self.stop.requested():
            return f"stopped ({self.stop.reason})"
        lim = self.limits
        done = self._experiments_done()
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
        rows = self.rows()
        cfg = self.config
        for offset in range(count):
            phase = self.schedule[(exp - 1 + offset) % count]
            if phase.wants_turn(rows, self.folder, cfg.target_speedup, cfg.translate_patience):
                return phase
        return None

    def loop(self) -> str:
        while True:
            reason = self.stop_reason()
            if reason:
                return reason
            if not self.disk.wait():
                continue  # stopped while waiting for space
            exp = self.next_exp()
            try:
                if self.needs_rebaseline():
                    self.run_rebaseline(exp)
                    continue
                phase = self.phase_for(exp)
                if phase is None:
                    return "no phase wants another experiment"
                if isinstance(phase, TranslatePhase):
                    self.run_translate(exp, phase)
                else:
                    self.run_train_round(exp, phase)
            except NoMoreProposals as exc:
                self.workspace.reset_to(self.best_commit)
                self.journal.clear()
                return f"the agent has no more proposals ({exc})" if str(exc) else "the agent has no more proposals"
            except Exception as exc:  # a daemon-side failure (disk, git): log, back off, go on
                for record in list(self.journal.records.values()):
                    if record.get("commit"):
                        self.workspace.keep_ref(record["exp"], record["commit"])
                if is_disk_full(exc):  # not the experiment's fault: wait for space, then retry it
                    log.error("exp %d: the disk is full (%s)", exp, exc)
                    self.journal.records.clear()
                    self.disk.wait()
                    continue
                log.exception("exp %d failed inside the daemon: %s", exp, exc)
                self.journal.clear()
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

