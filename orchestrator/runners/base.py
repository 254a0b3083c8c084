"""The Runner seam: what an experiment runs, and the typed results it hands back.

A runner does three things with a commit (never with the worktree, which the agent edits):
`measure` trains the commit's candidate/train.py for the budget and scores the exported policy
with the trusted harness; `verify` checks a translation at L1-L3; `bench` measures a backend's
throughput. Each records a cancellable handle (a local process group, a Modal function call) in
the run's InFlight journal before waiting on it, so `stop` and `--resume` can cancel it
whichever runner made it. Runners are called from several threads at once (`--parallel K`).

A runner reads its run through RunnerSettings: the run's RunConfig and the paths of its folder.
A train run's ending is a TrainOutcome before it is a Measurement because that is where the two
runners meet: LocalRunner has a process group's result and its output folder, ModalRunner a
container's reply and how waiting on the call ended (a lost container no process result can say),
and `train_failure` judges both alike.
"""
from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol

from ..artifacts import TRAIN_SCRIPT, log_tail, number_arg
from ..config import RunConfig
from ..results import ExpFolder, RunFolder


@dataclass
class Slot:
    """Where one piece of an experiment's work lands: its number, its folder, a log label."""
    exp: int
    folder: ExpFolder
    label: str


@dataclass(frozen=True)
class RunnerSettings:
    """What a runner reads of its run: the configuration that fixes the run's scores (budget,
    grace, env, held-out seed, harness hash, caps) and the run folder's paths, derived, not copied."""
    config: RunConfig
    folder: RunFolder

    @property
    def harness(self) -> Path:
        """The run's trusted copy of evaluate.py."""
        return self.folder.harness

    @property
    def verify_cache(self) -> Path:
        return self.folder.verify_cache

    @property
    def jax_cache(self) -> Path:
        """JAX compilation caches, a folder per commit (local runner)."""
        return self.folder.jax_cache


@dataclass
class TrainOutcome:
    """How a train run ended, wherever it ran."""
    returncode: Optional[int]
    wall_s: float
    timed_out: bool = False
    interrupted: bool = False
    metrics: dict = field(default_factory=dict)     # the `key: value` summary of train.py
    policy: Optional[Path] = None                   # the exported artifact, if any
    output_exceeded: bool = False
    note: str = ""                                  # a runner's own reason (e.g. container lost)
    infrastructure: str = ""                        # why it never ran to an end, not the code's doing
    artifact_s: Optional[float] = None              # seconds from train.py's start to its complete artifact


@dataclass
class EvalOutcome:
    ok: bool
    result: dict = field(default_factory=dict)      # the harness's JSON (mean, se, returns, ...)
    error: str = ""
    timed_out: bool = False
    interrupted: bool = False
    tampered: bool = False
    wall_s: float = 0.0
    compute_usd: float = 0.0
    infrastructure: str = ""                        # why it never ran to an end, not the policy's doing


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
    compute_usd: float = 0.0              # what the runner's compute cost (Modal)
    evaluation: dict = field(default_factory=dict)
    budget_s: Optional[float] = None      # the training budget it ran with
    trained_s: Optional[float] = None     # from train.py's start to its complete artifact (the daemon's clock)


@dataclass
class VerifyOutcome:
    passed: bool
    report: str = ""                      # what the agent gets to repair its translation
    returncode: Optional[int] = None
    interrupted: bool = False
    timed_out: bool = False


class Runner(Protocol):
    name: str

    def measure(self, slot: Slot, commit: str, seed: int, budget_s: Optional[float] = None) -> Measurement:
        """Train `commit` with `seed` for the run's budget (or `budget_s`: a screen's shorter one), then
        score its artifact with the harness."""

    def verify(self, slot: Slot, commit: str, backend: str, round_: int) -> VerifyOutcome:
        """Verify the translation file `backend` (repository-relative) of `commit` at L1-L3."""

    def bench(self, slot: Slot, commit: str, spec: str, json_path: Path, figures: str = "all") -> Optional[dict]:
        """Throughput of backend `spec` as `commit` would train on it (None when it failed);
        figures="train": only what ranking backends needs (train_sps, reference_sps)."""

    def bench_side_by_side(self, slot: Slot, commit: str, specs: list[str], json_path: Path,
                           seconds: float, rounds: int = 4) -> Optional[list[dict]]:
        """The train_sps of each of `specs` as `commit` would train on it, measured side by side in one
        process against one reference (`seconds` per figure, in `rounds` interleaved rounds, each
        round's figures in `round_train_sps`); None when it failed."""

    def record_environment(self) -> Optional[dict]:
        """Where training runs, as the run's verdict records are named by it (envs_fast.cache's
        `environment()`, field by field: what it leaves out is this process's): the run's envs_fast
        on this machine (local), a container's whole environment on Modal."""

    def unbilled_usd(self, seconds: float) -> float:
        """What the run spent that no measurement carries, since the loop last asked: `seconds` of the
        machine the daemon itself runs on (nothing on the user's own machine, the night's CPU container
        on Modal) and Modal's check calls (the environment probe, verify, bench). The loop bills it
        into each row, so a night's rows add up to what it cost."""

    def limit_spending(self, over_limit: Callable[[float], Optional[str]]) -> None:
        """Before launching any paid call, the runner asks `over_limit(spent)`, `spent` being what its
        calls cost since the loop's last row (not in the ledger yet); a reason (the loop stops the run)
        means the call is not launched and the work is recorded interrupted."""

    def cancel(self, handle: dict) -> bool:
        """Cancel a recorded handle (also one left by a previous daemon); True if it was live."""

    def close(self) -> None:
        """Release what the runner holds (a Modal app context)."""


# ---------------------------------------------------------------- shared judgement of outcomes
def side_by_side_args(seconds: float, rounds: int) -> list[str]:
    """bench.py's arguments for a side-by-side benchmark (--rounds only where it is not the default,
    which a commit's bench.py that predates the flag also measures)."""
    return ["--figures", "train", "--seconds", number_arg(seconds)] + (["--rounds", str(rounds)] if rounds != 4 else [])


def train_failure(train: TrainOutcome, folder: ExpFolder, config: RunConfig, budget_s: float) -> Measurement:
    """The measurement of a train run (of `budget_s`) so far: a status when it failed, else None to go on.
    The budget is exact: an artifact completed later than budget + config.export_margin_s (by the daemon's
    clock, from train.py's start) trained on time it was not given and is `invalid`; the run's allowance
    (grace_s) is only the kill deadline for a run that hangs."""
    m = Measurement(env_steps=_int(train.metrics.get("env_steps")), sps=_float(train.metrics.get("sps")),
                    wall_s=train.wall_s, budget_s=budget_s, trained_s=train.artifact_s)
    tail = log_tail(folder.train_log)
    limit = budget_s + config.grace_s
    budget = f"a {budget_s:g} s budget, allowance {config.grace_s:g} s"
    late = train.artifact_s is not None and train.artifact_s > budget_s + config.export_margin_s
    if train.interrupted:
        m.status, m.note = "interrupted", "stopped during training"
    elif train.infrastructure:
        m.status, m.note, m.failure = "interrupted", *infrastructure_failure(train.infrastructure, "training")
    elif train.output_exceeded:
        m.status, m.failure = "crash", tail
        m.note = f"wrote more than {config.max_output_mb:g} MB into AUTORL_OUTPUT_DIR"
        m.failure = f"{m.note}; the run was killed. Write only the policy artifact (and small files).\n{tail}"
    elif train.timed_out and train.artifact_s is not None and not late:
        m.status, m.failure = "timeout", tail
        m.note = (f"killed at {limit:g}s: the artifact was complete at {train.artifact_s:.0f}s, but {TRAIN_SCRIPT} "
                  f"had not exited ({budget})")
    elif late:
        m.status, m.note = "invalid", f"trained {train.artifact_s:.1f} s of a {budget_s:g} s budget"
        m.failure = (f"{TRAIN_SCRIPT} completed its artifact {train.artifact_s:.1f} s after it started; it must train "
                     f"within TIME_BUDGET (evaluate.TIME_BUDGET, {budget_s:g} s here, counted from the process start) "
                     f"and export within {config.export_margin_s:g} s of it. Its score was not taken.\n{tail}")
    elif train.timed_out:  # still training (or exporting) at the deadline: it stretched its budget
        m.status, m.note = "invalid", f"trained >= {limit:g} s of {budget}"
        m.failure = (f"{TRAIN_SCRIPT} must train within TIME_BUDGET (evaluate.TIME_BUDGET, {budget_s:g} s here, "
                     f"counted from the process start) and have exported its artifact by {limit:g} s; it was "
                     f"still running then and was killed.\n{tail}")
    elif train.note:
        m.status, m.failure, m.note = "crash", tail, train.note
    elif train.returncode != 0:
        m.status, m.failure = "crash", tail
        m.note = f"train.py exited with {train.returncode}: {last_line(tail)}"
    elif train.policy is None:
        m.status, m.failure = "crash", tail
        m.note = f"no policy.pt in AUTORL_OUTPUT_DIR ({TRAIN_SCRIPT} must export one)"
    return m


def add_evaluation(m: Measurement, evaluation: EvalOutcome, folder: ExpFolder) -> Measurement:
    m.wall_s += evaluation.wall_s
    m.compute_usd += evaluation.compute_usd
    m.evaluation = evaluation.result
    if evaluation.tampered:
        m.status, m.note = "invalid", evaluation.error
    elif evaluation.interrupted:
        m.status, m.note = "interrupted", "stopped during evaluation"
    elif evaluation.infrastructure:
        m.status, m.note, m.failure = "interrupted", *infrastructure_failure(evaluation.infrastructure, "scoring")
    elif not evaluation.ok:
        m.status = "timeout" if evaluation.timed_out else "crash"
        m.note = f"evaluation failed: {evaluation.error}"
        m.failure = f"{m.note}\n--- train.log tail ---\n{log_tail(folder.train_log)}"
    else:
        m.score = float(evaluation.result["mean"])
    return m


def infrastructure_failure(reason: str, stage: str) -> tuple[str, str]:
    """(note, what the agent is shown) for work the infrastructure never ran to an end (a Modal call
    that never started, lost its container or its output): recorded `interrupted`, never the code's fault."""
    note = f"infrastructure: {reason}; not your code"
    return note, (f"Your last experiment's {stage} did not run to an end because of the infrastructure ({reason}). "
                  "This says nothing about your code: nothing was measured, and the same change may be tried again.")


def read_eval_json(path: Path) -> tuple[Optional[dict], str]:
    try:
        result = json.loads(Path(path).read_text())
        float(result["mean"])
        return result, ""
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"unreadable evaluation output: {exc}"


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip()[:200] if lines else ""


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


StopCheck = Callable[[], bool]


def measure_all(runner: Runner, slots: list[Slot], commits: list[str], seed: int,
                budget_s: Optional[float] = None) -> list[Measurement]:
    """Train and score a round's candidates, all at once when there are several (--parallel)."""
    if len(slots) == 1:
        return [runner.measure(slots[0], commits[0], seed, budget_s)]
    logging.getLogger("autorl").info("exps %s: training %d candidates at once",
                                     ", ".join(str(s.exp) for s in slots), len(slots))
    with ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="candidate") as pool:
        return list(pool.map(lambda pair: runner.measure(pair[0], pair[1], seed, budget_s), zip(slots, commits)))
