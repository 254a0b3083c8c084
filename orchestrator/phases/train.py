"""The train phase: an edit of candidate/train.py, trained under the budget and kept when its score
beats the best by more than the night's seed-to-seed noise (the thresholds are keep_rule's)."""
from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Optional

from ..artifacts import TRAIN_SCRIPT
from ..keep_rule import (FUTILITY_T, LOOK_SHARES, PRIOR_SD_RATIO, Noise, ScoredRun, candidate_alpha,
                         confirmation_seed, got_past_first_look, look)
from ..runners.base import Measurement
from .judging import Confirm, Incumbent, Judgement, Phase, Verdict, verdict_of

# candidate/train.py's largest size: the shipped one is ~80 KB; weights smuggled in as literals are MBs
MAX_TRAIN_SCRIPT_BYTES = 256 * 1024


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
