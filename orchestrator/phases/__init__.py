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

One module per phase (train.py, translate.py); judging.py holds what they share. A new phase
joins PHASES below.
"""
from __future__ import annotations

from typing import Optional

from .judging import (INCUMBENT_FOLDER, PAIR_BENCH_FACTOR, PAIR_ROUNDS, Bench, BenchPair, Confirm, Incumbent,  # noqa: F401
                      Judgement, Phase, Repair, RepairRound, Verdict, Verify, concluding_order, decision_record,
                      incumbent_of, judge, verdict_of)
from .train import MAX_TRAIN_SCRIPT_BYTES, TrainPhase  # noqa: F401
from .translate import TranslatePhase, TranslateTrial, speedup_evidence, translate_languages  # noqa: F401

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
