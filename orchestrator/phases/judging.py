"""What phases share: the incumbent a candidate must beat, a verdict, the requests a judgement
yields for the loop to answer (Confirm, Verify, RepairRound, Bench, BenchPair) with what came of a
repair (Repair), `judge` that drives a judgement, and the Phase every phase is."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generator, Optional

from ..keep_rule import Noise, best_evidence, night_noise
from ..results import Row, RunFolder
from ..runners.base import Measurement
from ..workspace import compile_errors, disallowed


@dataclass
class Incumbent:
    """The best so far: what a candidate must beat."""
    score: Optional[float]
    commit: str
    noise: Noise                          # seed-to-seed noise of a run's score, measured this night
    seeds: tuple[int, int] = (1, 2)       # a candidate's train seed and its first confirmation seed
    runs: int = 0                         # how many runs `score` is the mean of (0: as if exact)
    entered: int = 0                      # candidates since the last keep that got past their first look
    stretch: int = 0                      # the exp of the train keep that began the stretch (0: the start)


def incumbent_of(rows: list[Row], folder: RunFolder, score: Optional[float], commit: str, train_seeds: list[int],
                 confirm_seed: int) -> Incumbent:
    """The best as results.tsv and the exp folders say it is (the loop's, a resumed loop's and the
    keep rule's simulation's alike): its score, its runs, the night's noise and the stretch's spending."""
    return Incumbent(score, commit, night_noise(rows, folder, train_seeds, confirm_seed),
                     (train_seeds[0], confirm_seed), *best_evidence(rows, folder))


def concluding_order(verdicts: list["Verdict"]) -> list[int]:
    """The order a round's rows are written in: the keep first, so the others' rows show the new best."""
    return sorted(range(len(verdicts)), key=lambda i: verdicts[i].status != "keep")


def decision_record(verdict: "Verdict") -> dict:
    """decision.json of a judged train candidate: the keep rule's evidence with the row's status."""
    return {**verdict.decision, "status": verdict.status, "note": verdict.note}


@dataclass
class Verdict:
    """A phase's judgement of one experiment: its status and why, over what was measured."""
    status: str                           # keep discard crash timeout invalid interrupted
    measured: Measurement = field(default_factory=Measurement)  # a confirmed candidate's: the mean of its runs
    note: str = ""                        # the bracketed reason in the description
    failure: Optional[str] = None         # what the agent is shown next time
    commit: Optional[str] = None          # the final commit when repair rounds made new ones
    agent_cost_usd: float = 0.0           # repair rounds' agent cost
    decision: dict = field(default_factory=dict)  # train: the keep rule's evidence (decision.json)

    @property
    def score(self) -> Optional[float]:
        return self.measured.score


@dataclass
class Confirm:
    """Train candidate `index` of the round again: confirmation run `k` with `seed`."""
    index: int
    k: int
    seed: int


@dataclass
class Verify:
    """Verify the translation `spec` of `commit` at L1-L3 (round 0, then repair rounds)."""
    commit: str
    spec: str
    round_: int


@dataclass
class RepairRound:
    """Let the agent repair its translation from the verifier's report (answered with a Repair)."""
    failure: str
    round_: int


@dataclass
class Bench:
    """Benchmark backend `spec` as `commit` would train on it, into `json_path` (answered with
    the figures, or None when it failed)."""
    commit: str
    spec: str
    json_path: Path


@dataclass
class BenchPair:
    """Benchmark translation `spec` of `commit` and the incumbent backend side by side, in one
    process and interleaved rounds, so that both figures see the same machine load: `incumbent` is
    a package name, or the repo-relative path of a translation of `incumbent_commit` (set beside the
    candidate's). Answered with the figures [candidate, incumbent], or None when it failed."""
    commit: str
    spec: str
    incumbent_commit: str
    incumbent: str
    json_path: Path
    rounds: int


# The side-by-side benchmark of a translate experiment: PAIR_BENCH_FACTOR x --bench-seconds per
# figure in PAIR_ROUNDS interleaved rounds. Its per-round ratios decide the keep: two copies of the
# same Rust port measured so (2 s rounds, 2 cores under load) came out 1.12x, 0.91x and 0.92x.
PAIR_BENCH_FACTOR = 4
PAIR_ROUNDS = 8
INCUMBENT_FOLDER = "incumbent"  # where a pair benchmark's snapshot holds the incumbent translation


Judgement = Generator[Any, Any, Any]


def judge(judgement: Judgement, answer: Callable[[Any], Any]):
    """Drive a phase's judgement: answer each request it yields until it returns its verdict(s)."""
    try:
        request = next(judgement)
        while True:
            request = judgement.send(answer(request))
    except StopIteration as done:
        return done.value


def verdict_of(m: Measurement, status: str, note: str = "") -> Verdict:
    return Verdict(status, m, note=note or m.note, failure=m.failure)


class Phase:
    name = "phase"

    def allowed_paths(self, env_id: str) -> list[str]:
        raise NotImplementedError

    def wants_turn(self, rows: list[Row], folder: RunFolder, target_speedup: float, patience: int) -> bool:
        """False once this phase has nothing left to do (the schedule then skips it)."""
        return True

    def check(self, worktree: Path, env_id: str, changed: list[str]) -> Optional[str]:
        """Why the change may not be run (None when it may)."""
        if not changed:
            return "no change"
        allowed = self.allowed_paths(env_id)
        outside = disallowed(changed, allowed)
        if outside:
            return f"changed paths outside {', '.join(allowed)}: {', '.join(outside)}"
        return compile_errors(worktree, changed)


@dataclass
class Repair:
    """What the loop made of one repair round (the agent edited, the change was checked and committed)."""
    status: str                           # "ok", "stopped", "no more", "unchanged", "invalid"
    commit: Optional[str] = None
    cost_usd: float = 0.0
    problem: str = ""
