"""The runs of the best code that are no experiment of the agent's, each recorded as a baseline row:
the start's baselines (the first mean and noise), a noisy start's re-measures, and the re-baseline
of the best train.py after a kept translation. Run (loop.py) has them as methods."""
from __future__ import annotations

import shutil
import time
from typing import Optional

from .artifacts import TRAIN_SCRIPT
from .config import RunError
from .daemon import log
from .keep_rule import start_needs_run
from .results import ExpFolder, Row, read_json
from .runners import Slot
from .runners.base import Measurement


class BaselineRuns:
    """Run's baseline rows (a mixin: it reads Run's config, ledger, runner, journal and workspace)."""

    # ------------------------------------------------------------ baseline
    def run_baseline(self) -> bool:
        """Train the unmodified train.py --baselines times (the first mean and noise). False when stopped."""
        baselines = len(self.config.train_seeds)
        while True:
            done = self.ledger.baselines()
            index = len(done)
            if index >= baselines:
                log.info("baseline: %s (noise estimate %.3f)", ", ".join(f"{r.score:.3f}" for r in done),
                         self.noise)
                return True
            if self.stop.requested() or not self.disk.wait():
                return False
            seed = self.config.train_seeds[index]
            folder, m = self._train_start(index + 1, seed, "baseline", f"baseline {index + 1}/{baselines}")
            commit = self.workspace.short(self.best_commit)
            if m.status:
                self.append(Row.of(0, "train", m.status, m, commit, self.best_score, m.wall_s, m.compute_usd,
                                   f"baseline seed {seed} [{m.note}]"))
                self.journal.end(0)
                if m.status == "interrupted":  # by a stop, or by the infrastructure (a Modal call past its retries)
                    if self.stop.requested():
                        return False
                    raise RunError(f"baseline {index + 1}/{baselines} was not measured ({m.note}); "
                                   "`--resume` retries it")
                raise RunError(f"the unmodified {TRAIN_SCRIPT} failed its baseline run ({m.status}: "
                               f"{m.note}); see {folder.train_log}. Fix it, commit, and start a new run "
                               f"(--tag), or `--resume` to retry this one as it is")
            self.best_score = self._start_mean_with(m.score)
            self.append(Row.of(0, "train", "baseline", m, commit, self.best_score, m.wall_s, m.compute_usd,
                               f"baseline seed {seed}"))
            self.journal.end(0)

    def _train_start(self, index: int, seed: int, stage: str, label: str) -> tuple[ExpFolder, Measurement]:
        """The start's run `index` (exp-0000/run-N) trained with `seed`, in flight as `stage`."""
        folder = self.folder.exp(0).run(index)
        self.journal.begin(0, "train", stage, len(self.ledger.rows), commit=self.best_commit)
        m = self.runner.measure(Slot(0, folder, label), self.best_commit, seed)
        self._check_measurement(m)
        return folder, m

    def _start_mean_with(self, score: float) -> float:
        """The best when it is the start: the mean of its scored runs and `score`."""
        scores = [r.score for r in self.ledger.baselines()] + [score]
        return sum(scores) / len(scores)

    # ------------------------------------------------------------ a noisy start, re-measured
    def start_needs_run(self) -> Optional[int]:
        return start_needs_run(self.ledger.rows, self.folder, self.config.train_seeds, self.config.confirm_seed)

    def remeasure_start(self, seed: int) -> None:
        """Train the start once more with `seed`: its runs spread wider than the night's, so the
        verdicts judge it at its own spread, and its mean over more runs is the best to beat.
        Recorded like a baseline (exp 0); it is no experiment of the agent's, but a full budget."""
        index = len(self.ledger.baselines()) + 1
        # a run interrupted before it left its own
        shutil.rmtree(self.folder.exp(0).run(index).path, ignore_errors=True)
        _, m = self._train_start(index, seed, "re-measure", f"start run {index}")
        commit = self.workspace.short(self.best_commit)
        why = "the start re-measured: its runs spread wider than the night's"
        if m.status is None:
            self.best_score = self._start_mean_with(m.score)
        self.append(Row.of(0, "train", m.status or "baseline", m, commit, self.best_score, m.wall_s, m.compute_usd,
                           f"baseline seed {seed}: {why}" + (f" [{m.note}]" if m.status else "")))
        self.journal.end(0)
        log.info("start run %d (seed %d): %s; best %.3f", index, seed,
                 f"score {m.score:.3f}" if m.score is not None else m.status, self.best_score)

    # ------------------------------------------------------------ re-baseline after a kept translation
    def run_rebaseline(self, exp: int) -> None:
        """Retrain the best train.py on the new backend so later experiments compare like with like.

        Its score becomes the best to beat. If training fails on the new backend, the translation
        is reverted (its commit stays under refs/autorl/<tag>/exp-NNNN of its experiment)."""
        folder = self.folder.exp(exp)
        shutil.rmtree(folder.path, ignore_errors=True)
        started = time.monotonic()
        self.journal.begin(exp, "train", "re-baseline", len(self.ledger.rows), commit=self.best_commit)
        m = self.runner.measure(Slot(exp, folder, f"exp {exp} re-baseline"), self.best_commit,
                                self.config.train_seeds[0])
        self._check_measurement(m)
        commit = self.workspace.short(self.best_commit)
        note = m.note
        if m.status in ("crash", "timeout"):  # training fails on the new backend: revert the translation
            translation = self.ledger.kept_translation()
            previous = read_json(self.folder.exp(translation.exp).translate).get("previous_best")
            if previous:
                self.workspace.keep_ref(translation.exp, self.best_commit)
                self.best_commit = previous
                self.workspace.reset_to(previous)
            note = f"{m.note}; the translation of exp {translation.exp} is reverted"
            self.turns.last_failure = m.failure
        elif m.status is None:
            self.best_score = m.score
            before = self.ledger.last_best()
            note = f"was best {before:.3f} on the previous backend" if before is not None else "no score before"
        self.append(Row.of(exp, "train", m.status or "baseline", m, commit, self.best_score,
                           time.monotonic() - started, m.compute_usd,
                           f"re-baseline: the best train.py retrained on the newly kept backend [{note}]"))
        self.journal.end(exp)
        log.info("exp %d: re-baseline %s", exp, "score %.3f" % m.score if m.score is not None else m.status)
