"""Screening (`run --screen F`): a train candidate is trained first at F x the budget, and only a
promising one is trained at the full budget, where the keep rule judges it as always.

The rule: a candidate is promising when its screen score is at least the incumbent's own screen
score, measured at the same fraction of the budget with the same training seed (a paired
comparison: seed-to-seed noise is the largest part of a score's, and both sides share the seed).
The incumbent is screened once per best commit (results/<tag>/screen/<commit>/; a resumed run
reuses it). A candidate that screens worse is recorded `screened`, its score the screen's (with
its budget_s), and never kept: keep decisions use full-budget runs only. A screen that crashes or
times out is that failure, found at a fraction of the cost. When the incumbent's own screen fails,
the round is not screened (every candidate trains at the full budget) and the log says why.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from .daemon import log
from .phases import Verdict
from .results import ExpFolder, RunFolder, read_json
from .runners import Measurement, Runner, Slot
from .runners.base import measure_all

Measure = Callable[[Slot, str, int, float], Measurement]   # (slot, commit, seed, budget_s)


@dataclass
class IncumbentScreen:
    commit: str
    score: Optional[float]
    compute_usd: float = 0.0           # what measuring it cost now (0 when reused)
    note: str = ""                     # why there is no score


class Screening:
    def __init__(self, fraction: float, budget_s: float, folder: RunFolder):
        self.fraction = fraction
        self.budget_s = fraction * budget_s
        self.folder = folder

    def incumbent(self, commit: str, seed: int, measure: Measure) -> IncumbentScreen:
        """The best commit's screen score: from its folder when screened before, else measured."""
        screen_folder = ExpFolder(self.folder.path / RunFolder.SCREEN / commit[:12])
        earlier = read_json(screen_folder.eval_json)
        if "mean" in earlier and read_json(screen_folder.path / "screen.json").get("seed") == seed:
            return IncumbentScreen(commit, float(earlier["mean"]))
        log.info("screen: training the best commit %s for %gs (%g x the budget) to screen candidates against",
                 commit[:7], self.budget_s, self.fraction)
        m = measure(Slot(0, screen_folder, f"screen of the best {commit[:7]}"), commit, seed, self.budget_s)
        if m.status:
            return IncumbentScreen(commit, None, m.compute_usd, f"{m.status}: {m.note}")
        (screen_folder.path / "screen.json").write_text(f'{{"seed": {seed}, "budget_s": {self.budget_s}}}\n')
        return IncumbentScreen(commit, m.score, m.compute_usd)

    def judge(self, screen: Measurement, incumbent: IncumbentScreen) -> Optional[Verdict]:
        """None: promising, train it at the full budget. Else the candidate's verdict."""
        if screen.status:
            return Verdict(screen.status, measured=screen, failure=screen.failure,
                           note=f"{screen.note} (in its screen at {self.budget_s:g}s)")
        if incumbent.score is not None and screen.score < incumbent.score:
            return Verdict("screened", measured=screen,
                           note=f"screen {screen.score:.3f} at {self.budget_s:g}s (best's {incumbent.score:.3f}): "
                                f"not trained at the full budget")
        return None

    def screen(self, ready: list, seed: int, best_commit: str, runner: Runner) -> list:
        """Screen the round's candidates (turn.Candidate) against the best commit's own screen: each
        that screens lower (or fails) gets its verdict; returns those to train at the full budget.
        Each candidate's cost grows by its screen's, the first one's by the best's screen too."""
        incumbent = self.incumbent(best_commit, seed, runner.measure)
        ready[0].cost_usd += incumbent.compute_usd
        if incumbent.score is None:
            log.warning("screen: the best commit's own screen failed (%s); this round trains every candidate "
                        "at the full budget", incumbent.note)
            return ready
        measured = measure_all(runner, [Slot(c.exp, ExpFolder(c.folder.screen), f"exp {c.exp} screen")
                                        for c in ready], [c.commit for c in ready], seed, self.budget_s)
        promoted = []
        for c, m in zip(ready, measured):
            c.verdict = self.judge(m, incumbent)
            if c.verdict is None:
                c.cost_usd += m.compute_usd
                log.info("exp %d: screen %.3f at %gs, the best's %.3f: training it at the full budget", c.exp,
                         m.score, self.budget_s, incumbent.score)
                promoted.append(c)
        return promoted
