"""The morning's figure out of sample: the start and the night's best trained again on fresh seeds.

The night's own gain is measured on the runs that chose the best, so it is biased upward (the
winner's curse: of many candidates, the one kept is partly the one whose seeds were lucky). At the
end of a night (and with `orchestrator report --rescore K`), the start and the best are trained
again on K seeds no run of the night used, each scored by the harness like any run, and their
difference is the figure the summary leads with, with a Welch t interval over the seeds.
Everything lands in results/<tag>/rescore.json and results/<tag>/rescore/<start|best>-seed-N/.
"""
from __future__ import annotations

from typing import Optional

from .daemon import log
from .report.rescored import Rescore
from .results import ExpFolder, RunFolder, utc_now
from .runners.base import Runner, Slot

DEFAULT_RESCORE_SEEDS = 2
# Far above every seed a night trains with: baselines and start re-measures 1 .. 2 x --baselines,
# confirmations from config.FIRST_CONFIRM_SEED (10,000) on, one block per candidate
RESCORE_SEED_BASE = 1_000_000
FOLDER = "rescore"


def rescore_seeds(k: int) -> list[int]:
    return [RESCORE_SEED_BASE + i for i in range(k)]


def rescore(runner: Runner, folder: RunFolder, start_commit: str, best_commit: str, k: int,
            stop_requested=lambda: False) -> Optional[Rescore]:
    """Train and score the start and the best on k fresh seeds (None: nothing to compare, or stopped)."""
    if k < 1 or start_commit == best_commit:
        return None
    seeds = rescore_seeds(k)
    scores: dict[str, list] = {"start": [], "best": []}
    for seed in seeds:  # seed by seed, the start and the best side by side: both see the same machine
        for label, commit in (("start", start_commit), ("best", best_commit)):
            if stop_requested():
                log.info("rescoring stopped: the summary keeps the night's in-sample gain")
                return None
            run = ExpFolder(folder.path / FOLDER / f"{label}-seed-{seed}")
            m = runner.measure(Slot(0, run, f"rescore {label} seed {seed}"), commit, seed)
            scores[label].append(m.score if not m.status else None)
            if m.status:
                log.warning("rescore %s seed %d: %s [%s]", label, seed, m.status, m.note)
    result = Rescore(start_commit, best_commit, seeds, scores["start"], scores["best"], utc_now())
    result.save(folder.path)
    log.info("out of sample: best - start = %s", result.line())
    return result
