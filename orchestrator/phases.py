"""Kinds of experiment, and what each must show to be kept. Phases judge; they run nothing and
never call back into the loop.

A judgement is a generator: it yields what it needs measured next (a confirmation run, a
verification, a repair round, a benchmark), the loop answers each request (through the runner,
or the agent for a repair) and sends the answer back in, and the generator returns its
verdict(s). Both phases are driven the same way, by `judge(judgement, answer)`.

- `TrainPhase.judge_round`: K candidates of one round, each measured once; the best that beats
  the incumbent by more than the measured noise is kept (a win inside it is confirmed with more
  seeds first: `Confirm` requests; the thresholds and when to stop confirming are keep_rule's).
- `TranslatePhase.judge`: verify a translation (`Verify`; `RepairRound` from the verifier's report
  while rounds are left), benchmark it and the backend training uses now (`Bench`), then both side
  by side in one process (`BenchPair`), keep it when verified and faster beyond that benchmark's
  noise (the one-sided 95% bound of its per-round ratios above 1).
"""
from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Generator, Optional

from envs_fast.protocol import translation_files, translation_path
from envs_fast.verify.report import report_lines

from .artifacts import TRAIN_SCRIPT, log_tail
from .daemon import log
from .keep_rule import (FUTILITY_T, LOOK_SHARES, PRIOR_SD_RATIO, Noise, ScoredRun, best_evidence, candidate_alpha,
                        confirmation_seed, got_past_first_look, look, night_noise)
from .results import RunFolder, Row, read_json
from .runners.base import Measurement, Slot
from .workspace import compile_errors, disallowed

# candidate/train.py's largest size: the shipped one is ~80 KB; weights smuggled in as literals are MBs
MAX_TRAIN_SCRIPT_BYTES = 256 * 1024


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


class TrainPhase(Phase):
    """Edit candidate/train.py; train under the budget; score the artifact; keep if better by more
    than the measured seed-to-seed noise (orchestrator/keep_rule.py)."""

    name = "train"

    def allowed_paths(self, env_id: str) -> list[str]:
        return [TRAIN_SCRIPT]

    def check(self, worktree: Path, env_id: str, changed: list[str]) -> Optional[str]:
        """Besides the paths: a train.py past MAX_TRAIN_SCRIPT_BYTES carries more than a PPO's code
        (weights or rollouts as literals, to warm-start every run)."""
        size = (worktree / TRAIN_SCRIPT).stat().st_size if (worktree / TRAIN_SCRIPT).is_file() else 0
        if size > MAX_TRAIN_SCRIPT_BYTES:
            return (f"{TRAIN_SCRIPT} is {size / 1024:.0f} KB, over {MAX_TRAIN_SCRIPT_BYTES // 1024} KB: it may hold code, "
                    "not trained weights or data")
        return super().check(worktree, env_id, changed)

    def judge_round(self, measured: list[Measurement], incumbent: Incumbent,
                    exps: Optional[list[int]] = None) -> Judgement:
        """One verdict per candidate (exps: their experiment numbers), each with its evidence in
        `decision`. Yields `Confirm(i, k, seed)` to have candidate i retrained with confirmation
        seed k (1, 2, ...), answered with that run's Measurement; the candidate's runs join the
        noise estimate for the rest of the round."""
        exps = exps or list(range(1, len(measured) + 1))
        verdicts: list[Optional[Verdict]] = [None] * len(measured)
        for i, m in enumerate(measured):
            if m.status:
                verdicts[i] = verdict_of(m, m.status)
        best, noise = incumbent.score, incumbent.noise
        kept: Optional[int] = None
        entered = incumbent.entered
        ranked = sorted((i for i, m in enumerate(measured) if not m.status), key=lambda i: -measured[i].score)
        for i in ranked:
            m = measured[i]
            first = ScoredRun(f"exp {exps[i]}", incumbent.seeds[0], m.score, _se(m), f"exp {exps[i]}",
                              artifact=_artifact(m))
            record = {"exp": exps[i], "best": best, "best_runs": incumbent.runs, "incumbent": incumbent.commit,
                      "stretch": incumbent.stretch,
                      "rule": {"look_shares": list(LOOK_SHARES), "futility_t": list(FUTILITY_T),
                               "prior_sd_ratio": PRIOR_SD_RATIO, "welch": True,
                               "best_own_spread": True}, "looks": []}
            if kept is not None:
                verdicts[i] = verdict_of(m, "discard", f"exp {exps[kept]} of the same round was kept "
                                                       f"({verdicts[kept].score:.3f})")
                record["looks"].append({"runs": [asdict(first)], "action": "discard", "note": verdicts[i].note})
            else:
                # its share of the night's level: lower for each candidate since the last keep that got past its first look
                record.update(entered_since_keep=entered, alpha=candidate_alpha(entered + 1))
                verdicts[i], noise = yield from self._judge(i, m, first, noise, incumbent, record)
                entered += got_past_first_look(record["looks"])
            verdicts[i].decision = record
            if verdicts[i].status == "keep":
                kept = i
        return verdicts

    def _judge(self, index: int, first: Measurement, run: ScoredRun, noise: Noise, incumbent: Incumbent,
               record: dict) -> Judgement:
        """One candidate: looks after its first run and after each confirmation run, until the rule
        keeps or discards it. Returns the verdict (score: the mean of its runs) and the estimate
        with its runs."""
        runs, measurements = [run], [first]
        while True:
            # the night's noise without this candidate's runs (look() weighs their own spread), its
            # floor over their evaluation standard errors too
            night = noise.including(extra_se=[r.se for r in runs])
            decision = look([r.score for r in runs], incumbent.score, night, incumbent.runs, record["alpha"],
                            artifacts=[r.artifact for r in runs])
            record["looks"].append({"runs": [asdict(r) for r in runs], "noise": night.evidence(),
                                    **decision.evidence()})
            if decision.action != "confirm":
                break
            k = len(runs)
            seed = confirmation_seed(incumbent.seeds[1], k)
            again = yield Confirm(index, k, seed)
            measurements.append(again)
            if again.status:
                why = "stopped during" if again.status == "interrupted" else f"{again.status} in"
                record["looks"].append({"confirmation": k, "status": again.status, "note": again.note})
                spent = replace(first, wall_s=sum(x.wall_s for x in measurements),
                                compute_usd=sum(x.compute_usd for x in measurements), budget_s=first.budget_s)
                v = verdict_of(spent, "interrupted" if again.status == "interrupted" else "discard",
                               f"{why} confirmation run {k}" + (f": {again.note}" if again.note else ""))
                v.failure = again.failure or first.failure
                return v, noise.including(runs)
            runs.append(ScoredRun(run.code, seed, again.score, _se(again),
                                  f"{run.label} confirm {k}", artifact=_artifact(again)))
        combined = Measurement(score=sum(r.score for r in runs) / len(runs), env_steps=first.env_steps, sps=first.sps,
                               wall_s=sum(x.wall_s for x in measurements),
                               compute_usd=sum(x.compute_usd for x in measurements), budget_s=first.budget_s)
        return verdict_of(combined, decision.action, decision.note), noise.including(runs)


def _artifact(m: Measurement) -> str:
    """The sha256 of the run's policy artifact, as the loop recorded it ("" unknown): copies share one."""
    return str(m.evaluation.get("policy_sha256") or "")


def _se(m: Measurement) -> float:
    try:
        return float(m.evaluation.get("se") or 0.0)
    except (TypeError, ValueError):
        return 0.0


@dataclass
class Repair:
    """What the loop made of one repair round (the agent edited, the change was checked and committed)."""
    status: str                           # "ok", "stopped", "no more", "unchanged", "invalid"
    commit: Optional[str] = None
    cost_usd: float = 0.0
    problem: str = ""


@dataclass
class TranslateTrial:
    """One translate experiment, as the translate phase sees it."""
    slot: Slot
    commit: str
    previous_best: str
    env_id: str
    repair_rounds: int
    spec: str = ""                         # the translation the candidate wrote (.py or .rs); "" = JAX's
    stop_requested: Callable[[], bool] = lambda: False


def translate_languages(choice: str) -> tuple[str, ...]:
    """The languages a translate experiment may write for `--translate-lang CHOICE`. Raises
    ValueError for "rust" without rustc; "auto" offers Rust only where rustc is installed."""
    if choice not in ("jax", "rust", "auto"):
        raise ValueError(f"--translate-lang must be jax, rust or auto, not {choice!r}")
    if choice == "jax":
        return ("jax",)
    if shutil.which("rustc"):
        return ("rust",) if choice == "rust" else ("jax", "rust")
    if choice == "rust":
        raise ValueError("--translate-lang rust: rustc is not on PATH (install the Rust toolchain: rustup.rs)")
    return ("jax",)


class TranslatePhase(Phase):
    """Write or repair a translation of the env (JAX `envs_fast/translations/<slug>.py` or Rust
    `envs_fast/translations/<slug>.rs` with its state-sync companion `envs_fast/translations/<slug>_sync.py`); verify L1-L3
    (with repair rounds); benchmark; keep when verified and faster, as train.py would train on it,
    than the backend training uses now, measured side by side beyond the measurement's noise."""

    name = "translate"

    def __init__(self, languages: tuple[str, ...] = ("jax",)):
        self.languages = languages

    def translation(self, env_id: str, lang: str = "jax") -> str:
        """The translation's repo-relative path: envs_fast/translations/<slug>.py or <slug>.rs."""
        return translation_path(env_id, ".", lang).as_posix()

    def files(self, env_id: str, lang: str) -> list[str]:
        if lang == "rust":
            return translation_files(self.translation(env_id, "rust"))
        return [self.translation(env_id, "jax")]

    def allowed_paths(self, env_id: str) -> list[str]:
        return [path for lang in self.languages for path in self.files(env_id, lang)]

    def incumbent_spec(self, resolved: str, env_id: str) -> str:
        """What the previous best trains on, as a pair benchmark names it: one of this env's
        translations by its repo-relative path (`resolved` is its path in the benchmark's snapshot),
        else the package `resolved` names (gymnax, envpool, reference, ...)."""
        for lang in ("jax", "rust"):
            relative = self.translation(env_id, lang)
            if resolved == relative or resolved.endswith("/" + relative):
                return relative
        return resolved

    def language_of(self, env_id: str, changed: list[str]) -> str:
        """Which translation a change writes: Rust if it touches the Rust files."""
        return "rust" if set(changed) & set(self.files(env_id, "rust")) else "jax"

    def check(self, worktree: Path, env_id: str, changed: list[str]) -> Optional[str]:
        problem = super().check(worktree, env_id, changed)
        if problem is None and len(self.languages) > 1 and set(changed) & set(self.files(env_id, "jax")) \
                and set(changed) & set(self.files(env_id, "rust")):
            return "a translate experiment writes one language: change the JAX file or the Rust files, not both"
        return problem

    def spec_for(self, env_id: str, changed: list[str]) -> str:
        return self.translation(env_id, self.language_of(env_id, changed))

    def wants_turn(self, rows: list[Row], folder: RunFolder, target_speedup: float, patience: int) -> bool:
        kept = [r for r in rows if r.phase == self.name and r.status == "keep"]
        if kept:
            record = read_json(folder.exp(kept[-1].exp).translate)
            if record.get("ratio", 0.0) >= target_speedup:
                return False
        since_gain = [r for r in rows if r.phase == self.name and r.status not in ("keep", "interrupted")
                      and (not kept or r.exp > kept[-1].exp)]
        return len(since_gain) < patience

    def judge(self, trial: TranslateTrial) -> Judgement:
        """Yields Verify, RepairRound and Bench requests; returns the Verdict."""
        path, commit, cost = trial.spec or self.translation(trial.env_id), trial.commit, 0.0

        def verdict(status: str, **kw) -> Verdict:
            return Verdict(status, commit=commit, agent_cost_usd=cost, **kw)

        for round_ in range(trial.repair_rounds + 1):
            label = trial.slot.label + (f" repair {round_}" if round_ else "")
            log.info("%s: verifying %s at L1-L3", label, path)
            outcome = yield Verify(commit, path, round_)
            if outcome.interrupted:
                return verdict("interrupted", note="stopped during verification")
            log.info("%s: verification %s", label, "passed" if outcome.passed else "FAILED")
            if outcome.passed:
                break
            failure = outcome.report or "the verifier produced no report"
            if outcome.returncode != 1:  # bad input: a file that does not import, protocol missing, timeout
                failure = f"verification could not run (exit {outcome.returncode}):\n{failure}"
            if round_ == trial.repair_rounds:
                return verdict("discard", note=f"verification failed after {round_} repair round(s): "
                                               f"{_first_line(failure)}", failure=failure)
            repair = yield RepairRound(failure, round_ + 1)
            cost += repair.cost_usd
            commit = repair.commit or commit
            if repair.status == "stopped":
                return verdict("interrupted", note="stopped during a repair round")
            if repair.status == "no more":
                return verdict("discard", note=f"verification failed: {_first_line(failure)}", failure=failure)
            if repair.status == "unchanged":
                return verdict("discard", note=f"repair round {round_ + 1} changed nothing; verification "
                                               f"failed: {_first_line(failure)}", failure=failure)
            if repair.status == "invalid":
                return verdict("invalid", note=f"repair round {round_ + 1}: {repair.problem}",
                               failure=f"the repair was rejected: {repair.problem}")
        verified = "verified L1-L3" + (f" after {round_} repair round(s)" if round_ else "")
        folder = trial.slot.folder

        def failed_bench(log_of: Path) -> Verdict:
            stopped = trial.stop_requested()
            return verdict("interrupted" if stopped else "crash",
                           note="stopped during the benchmark" if stopped else f"{verified}; the benchmark failed",
                           failure=log_tail(log_of.with_suffix(".log")))

        new = yield Bench(commit, path, folder.bench)  # its own figures (x the reference env)
        # The incumbent: what make_vec_env(backend="auto") chose in the previous best commit.
        old = yield Bench(trial.previous_best, "auto", folder.bench_incumbent)
        if new is None or old is None:
            return failed_bench(folder.bench if new is None else folder.bench_incumbent)
        # The decision compares the two side by side: measured one after the other, a change in the
        # machine's load between the two processes reads as a speed-up or a slow-down.
        pair = yield BenchPair(commit, path, trial.previous_best, self.incumbent_spec(old["backend"], trial.env_id),
                               folder.bench_pair, PAIR_ROUNDS)
        if pair is None:
            return failed_bench(folder.bench_pair)
        # What training will see: train.py's end-to-end JAX path where it has one, else the adapter.
        new_sps, old_sps = _train_sps(pair[0]), _train_sps(pair[1])
        speedup, lower, rounds = speedup_evidence(pair[0], pair[1])
        name = _spec_name(old["backend"])
        how = "end to end" if pair[0].get("e2e_sps") else f"at {pair[0]['adapter_num_envs']} envs"
        record = {"spec": path, "incumbent": name, "ratio": new["ratio"], "speedup": speedup,
                  "speedup_lower_bound": lower, "rounds": rounds,
                  "train_sps": new_sps, "incumbent_train_sps": old_sps, "measured": how + ", side by side",
                  "adapter_sps": new["adapter_sps"], "incumbent_adapter_sps": old["adapter_sps"],
                  "backend_sps": new["backend_sps"], "reference_sps": new["reference_sps"],
                  "num_envs": new["adapter_num_envs"], "previous_best": trial.previous_best}
        folder.translate.write_text(json.dumps(record, indent=1) + "\n")
        figures = (f"{verified}; {new['ratio']:.0f}x the reference env; training {how} "
                   f"{new_sps:,.0f} sps vs {old_sps:,.0f} ({name}) side by side = {speedup:.2f}x "
                   f"(95% lower bound {lower:.2f}x over {rounds} rounds)")
        if lower > 1.0:  # faster beyond the measurement's noise: a tie kept by luck would be no gain
            return verdict("keep", measured=Measurement(sps=new["backend_sps"]), note=figures)
        return verdict("discard", measured=Measurement(sps=new["backend_sps"]), note=f"{figures}: not faster than the current backend",
                       failure=f"Your translation passed verification but is not faster than the backend "
                               f"training uses now: {figures}. Make it faster.")


def _train_sps(bench: dict) -> float:
    return float(bench.get("train_sps") or bench["adapter_sps"])


def speedup_evidence(new: dict, old: dict, confidence: float = 0.95) -> tuple[float, float, int]:
    """(speed-up, its one-sided `confidence` lower bound, rounds) of a translation over the incumbent
    from a side-by-side benchmark: the geometric mean of their per-round train_sps ratios (paired by
    round, so the load of each round cancels) and Student's t over the rounds' log ratios. Without
    per-round figures: the ratio of the totals, with no margin."""
    import math

    from scipy import stats

    ratios = [a / b for a, b in zip(new.get("round_train_sps") or [], old.get("round_train_sps") or [])
              if a > 0 and b > 0]
    if len(ratios) < 2:
        ratio = _train_sps(new) / max(_train_sps(old), 1e-9)
        return ratio, ratio, len(ratios)
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    margin = stats.t.ppf(confidence, len(logs) - 1) * sd / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - margin), len(ratios)


def _spec_name(spec: str) -> str:
    if spec.endswith(".py"):
        return "the kept translation"  # the best commit's file, verified in this run
    if spec.endswith(".rs"):
        return "the kept Rust translation"
    return {"reference": "gymnasium vector env"}.get(spec, spec)



def _first_line(text: str) -> str:
    lines = report_lines(text)
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
