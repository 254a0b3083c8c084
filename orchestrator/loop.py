"""The experiment state machine: baseline, then one round after another until a limit.

    a round: K candidates (--parallel K; 1 for translate) each proposed from the best commit
    (agent edits the worktree) -> checked (non-empty, allowed paths, compiles) -> committed;
    then the runner measures them concurrently, the phase judges them together, and each gets
    its row: keep (the branch moves to it) or its commit filed under refs/autorl/<tag>/exp-NNNN.

What is in flight (experiments, stages, commits, runner handles) is written to state.json
before each step (InFlight), so `--resume` after any crash can account for it.
The best code's runs that are no experiment (baselines, re-measures, re-baselines) are
baseline_runs.py's.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

from envs_fast.protocol import is_file_spec, translation_files

from .agents.base import NoMoreProposals, Outcome
from .baseline_runs import BaselineRuns
from .config import Limits, RunConfig
from .daemon import StopControl, log
from .disk import DiskSpace, is_disk_full
from .guard import Guard
from .report import refresh as refresh_report
from .inflight import InFlight, recorded
from .keep_rule import Noise, best_evidence, first_confirmation_seed, night_noise, write_decision
from .phases import (INCUMBENT_FOLDER, PAIR_BENCH_FACTOR, PHASES, BenchPair, Confirm, Incumbent, Phase, RepairRound,
                     TrainPhase, TranslatePhase, TranslateTrial, Verdict, Verify, concluding_order, decision_record,
                     incumbent_of, judge, translate_languages)
from .ledger import Ledger
from .results import ExpFolder, ResultsFile, Row, RunFolder, read_json
from .runners import Runner, Slot, cancel_handle
from .runners.base import Measurement, measure_all
from .screening import Screening
from .seed_copies import artifact_sha256
from .turn import AgentTurns, Candidate
from .workspace import Workspace


def _note_artifact(m: Measurement, folder: ExpFolder) -> Measurement:
    """The run's policy.pt sha256 in its evaluation (`policy_sha256`), for the keep rule's copy check."""
    if m.status is None:
        m.evaluation["policy_sha256"] = artifact_sha256(folder)
    return m


class Run(BaselineRuns):
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
        self.ledger = Ledger(self.results)
        self.turns = AgentTurns(config, folder, workspace, self.ledger, journal, stop, limits, agent)
        self.phases = {name: PHASES[name]() for name in PHASES}  # one instance per kind
        self.phases["translate"] = TranslatePhase(translate_languages(config.translate_lang))
        self.schedule = [self.phases[name] for name in config.schedule]
        self._warned_main_harness = False
        self.best_score: Optional[float] = None
        self.best_commit = config.base_commit
        self.disk = DiskSpace(folder.path, journal.set_waiting, stop.requested, stop.sleep)
        self.guard = Guard(folder, harness_bytes)
        self._billed_to = time.monotonic()  # the daemon's own machine is billed up to here
        runner.limit_spending(self._over_cost_limit)
        self.screening = Screening(config.screen, config.budget_s, folder) if config.screen else None
        self._load_best()

    # ------------------------------------------------------------ derived state
    def _load_best(self) -> None:
        summary = self.ledger.summary()
        self.best_score = summary["best"]
        if summary["best_commit"]:
            self.best_commit = self.workspace.resolve(summary["best_commit"])

    @property
    def noise(self) -> float:
        """Seed-to-seed noise of a run's score (sigma of the keep rule), from every pair so far."""
        return self.noise_estimate().sigma

    def noise_estimate(self) -> Noise:
        return night_noise(self.ledger.rows, self.folder, self.config.train_seeds, self.config.confirm_seed)

    def incumbent(self) -> Incumbent:
        return incumbent_of(self.ledger.rows, self.folder, self.best_score, self.best_commit,
                            self.config.train_seeds, self.config.confirm_seed)

    def total_cost(self) -> float:
        return self.ledger.cost() + self.turns.pending_cost

    def _over_cost_limit(self, unrecorded_usd: float) -> Optional[str]:
        """Asked before the runner launches any paid call (parallel candidates, confirmations, checks):
        --max-cost reached counting what its calls since the last row cost stops the run there, not
        after the experiments in flight. (The count restarts at each row: a round's rows are written
        after its calls, so none of a finished call's cost is outside both the ledger and the count
        when the next call is asked for.)"""
        if self.limits.max_cost is None:
            return None
        spent = self.total_cost() + unrecorded_usd
        if spent < self.limits.max_cost:
            return None
        reason = f"--max-cost reached (${spent:.2f} of ${self.limits.max_cost:.2f}, counting calls not yet recorded)"
        self.stop.request(reason)
        return reason

    def append(self, row: Row) -> None:
        """fsync'd append of a whole line or nothing, with the daemon's own machine billed since the
        row before (a night's container on Modal). A full disk is waited out; a stop while waiting
        re-raises: the experiment stays in state.json, and a `--resume` records it as interrupted."""
        billed_to, self._billed_to = self._billed_to, time.monotonic()
        row.cost_usd += self.runner.unbilled_usd(self._billed_to - billed_to)
        delay = 1.0
        while True:
            try:
                self.ledger.write(row)
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
        self.ledger.reload()
        records = recorded(self.folder.path)
        self._load_best()
        for record in records:
            for handle in record.get("handles", []):
                cancel_handle(handle, self.runner)
        recorded_exps = {r.exp for r in self.ledger.rows}
        for record in records:
            exp = record["exp"]
            missing = (len(self.ledger.rows) <= record.get("rows_before", 0)) if exp == 0 else exp not in recorded_exps
            if not missing:
                continue
            commit = record.get("commit")
            if not commit and len(records) == 1 and self.workspace.head() != self.best_commit:
                commit = self.workspace.head()  # died between committing and recording the commit
            if commit and commit != self.best_commit:
                self.workspace.keep_ref(exp, commit)
            if str(record.get("stage", "")).startswith("confirm"):
                self._spent_in_confirmation(exp, record["stage"])
            self.append(Row(exp=exp, phase=record.get("phase", "train"), status="interrupted",
                            commit=self.workspace.short(commit) if commit else "", best=self.best_score,
                            cost_usd=self.turns.pending_cost,
                            description=f"interrupted: the daemon died during {record.get('stage')} "
                                        "(recovered on resume)"))
            self.turns.pending_cost = 0.0
            log.warning("exp %d was in flight when the daemon died: recorded as interrupted", exp)
        self.journal.clear()
        self._load_best()
        self.workspace.reset_to(self.best_commit)
        last = self.ledger.rows[-1] if self.ledger.rows else None
        if last is not None:
            failure = self.folder.exp(last.exp).failure
            self.turns.last_failure = failure.read_text() if failure.exists() else None

    def _spent_in_confirmation(self, exp: int, stage: str) -> None:
        """A candidate the daemon died confirming had got past its first look: it spent its share of
        the stretch's level, which decision.json records for best_evidence (its looks were in memory)."""
        decision = self.folder.exp(exp).decision
        if read_json(decision).get("looks"):
            return
        _, entered, stretch = best_evidence(self.ledger.rows, self.folder)
        decision.parent.mkdir(parents=True, exist_ok=True)
        write_decision(decision, {"exp": exp, "stretch": stretch, "alpha": None, "entered_since_keep": entered,
                                  "looks": [{"action": "confirm", "note": f"the daemon died during {stage}"}],
                                  "status": "interrupted"})

    # ------------------------------------------------------------ a round
    def round_size(self) -> int:
        size = max(1, self.config.parallel)
        if self.limits.max_experiments is not None:
            size = min(size, max(1, self.limits.max_experiments - self.ledger.experiments_done()))
        return size

    def run_train_round(self, first_exp: int, phase: TrainPhase) -> None:
        candidates: list[Candidate] = []
        for i in range(self.round_size()):
            try:
                c = self.turns.candidate(first_exp + i, phase, [c.description for c in candidates if c.description],
                                         self.best_commit)
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
            seed = self.config.train_seeds[0]
            if self.screening:
                ready = self._screen(ready, seed)
        if ready:
            measured = measure_all(self.runner, [Slot(c.exp, c.folder, f"exp {c.exp}") for c in ready],
                                   [c.commit for c in ready], seed)
            for c, m in zip(ready, measured):
                _note_artifact(m, c.folder)

            # fresh confirmation seeds: the round's first experiment's own (keep_rule.first_confirmation_seed)
            incumbent = replace(self.incumbent(),
                                seeds=(seed, first_confirmation_seed(self.config.confirm_seed, ready[0].exp)))

            def confirm(request: Confirm) -> Measurement:
                c = ready[request.index]
                log.info("exp %d: %.3f is above the best %.3f but within the noise; confirmation %d with seed %d",
                         c.exp, measured[request.index].score, self.best_score, request.k, request.seed)
                self.journal.stage(c.exp, f"confirm {request.k}")
                folder = c.folder.confirmation(request.k)
                return _note_artifact(self.runner.measure(Slot(c.exp, folder, f"exp {c.exp} confirm {request.k}"),
                                                          c.commit, request.seed), folder)

            verdicts = judge(phase.judge_round(measured, incumbent, [c.exp for c in ready]), confirm)
            for c, v in zip(ready, verdicts):
                c.verdict = v
            self._check_run_files(ready)
            for c, v in zip(ready, verdicts):  # the keep rule's evidence, with the status the row gets
                if v.decision:
                    write_decision(c.folder.decision, decision_record(replace(v, status=c.verdict.status,
                                                                              note=c.verdict.note)))
        for i in concluding_order([c.verdict for c in candidates]):
            self._conclude(candidates[i], phase)

    def _screen(self, ready: list[Candidate], seed: int) -> list[Candidate]:
        """--screen: the candidates that screen below the best get their verdict; returns the others."""
        for c in ready:
            self.journal.stage(c.exp, "screen")
        promoted = self.screening.screen(ready, seed, self.best_commit, self.runner)
        self._check_run_files(ready)
        promoted = [c for c in promoted if c.verdict is None]
        for c in promoted:
            self.journal.stage(c.exp, "train")
        return promoted

    def run_translate(self, exp: int, phase: TranslatePhase) -> None:
        c = self.turns.candidate(exp, phase, [], self.best_commit)
        if c is None:
            return
        if c.verdict is None:
            self.journal.stage(exp, "verify")
            slot = Slot(exp, c.folder, f"exp {exp}")

            def answer(request):
                if isinstance(request, Verify):
                    return self.runner.verify(slot, request.commit, request.spec, request.round_)
                if isinstance(request, RepairRound):
                    return self.turns.repair(c, phase, request.failure, request.round_)
                if isinstance(request, BenchPair):
                    return self._bench_pair(slot, request)
                return self.runner.bench(slot, request.commit, request.spec, request.json_path)

            trial = TranslateTrial(slot=slot, commit=c.commit, previous_best=self.best_commit,
                                   env_id=self.config.env_id, repair_rounds=self.config.repair_rounds,
                                   spec=phase.spec_for(self.config.env_id,
                                                       self.workspace.changed_paths(self.best_commit)),
                                   stop_requested=self.stop.requested)
            c.verdict = judge(phase.judge(trial), answer)
            self._check_run_files([c])
        self._conclude(c, phase)

    def _bench_pair(self, slot: Slot, request: BenchPair) -> Optional[list[dict]]:
        """A translation and the incumbent benchmarked in one process: an incumbent translation is
        taken from its commit into a commit of the candidate's files (under INCUMBENT_FOLDER/)."""
        commit, incumbent = request.commit, request.incumbent
        if is_file_spec(incumbent):
            commit = self.workspace.commit_beside(request.commit, request.incumbent_commit,
                                                  translation_files(incumbent), INCUMBENT_FOLDER)
            incumbent = f"{INCUMBENT_FOLDER}/{incumbent}"
        return self.runner.bench_side_by_side(slot, commit, [request.spec, incumbent], request.json_path,
                                              self.config.bench_seconds * PAIR_BENCH_FACTOR, request.rounds)

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
        cost = c.cost_usd + verdict.agent_cost_usd + verdict.measured.compute_usd
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
        self.append(Row.of(c.exp, phase.name, verdict.status, verdict.measured,
                           self.workspace.short(commit) if commit else "", self.best_score,
                           time.monotonic() - c.started, cost, text))
        self._check_main_harness(c.exp)
        self.turns.last_failure = verdict.failure
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
    def stop_reason(self) -> Optional[str]:
        if self.stop.requested():
            return f"stopped ({self.stop.reason})"
        lim = self.limits
        done = self.ledger.experiments_done()
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
        rows = self.ledger.rows
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
            exp = self.ledger.next_exp()
            try:
                if self.ledger.needs_rebaseline():
                    self.run_rebaseline(exp)
                    continue
                seed = self.start_needs_run()
                if seed is not None:
                    self.remeasure_start(seed)
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
                delay = self.turns.backoff_s()
                try:
                    self.workspace.reset_to(self.best_commit)
                except Exception as reset_exc:
                    log.error("cannot reset the worktree: %s", reset_exc)
                self.stop.sleep(delay)

    def summary_line(self) -> str:
        return self.ledger.summary_line()
