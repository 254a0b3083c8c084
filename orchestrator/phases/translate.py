"""The translate phase: a translation of the env written or repaired, verified L1-L3, benchmarked
against the backend training uses now (side by side, in one process) and kept when verified and
faster beyond that benchmark's noise."""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from envs_fast.protocol import translation_files, translation_path
from envs_fast.verify.report import report_lines

from ..artifacts import log_tail
from ..daemon import log
from ..results import Row, RunFolder, read_json
from ..runners.base import Measurement, Slot
from .judging import PAIR_ROUNDS, Bench, BenchPair, Judgement, Phase, RepairRound, Verdict, Verify


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
