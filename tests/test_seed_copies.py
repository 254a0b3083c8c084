"""A score no candidate can forge: runs of one candidate that copy each other (a train.py that
ignores AUTORL_SEED) count as one run, and confirmation seeds are fresh (orchestrator/keep_rule.py)."""
from __future__ import annotations

import json
import math

import pytest
from scipy import stats

from orchestrator.config import BASELINE_RUNS, FIRST_CONFIRM_SEED
from orchestrator.keep_rule import (MAX_RUNS, START_RUNS_FACTOR, ScoredRun, confirmation_seed, estimate, first_confirmation_seed,
                                    independent_runs, start_seed)
from orchestrator.seed_copies import COPY_ALPHA, seed_copies
from orchestrator.phases import Incumbent, TrainPhase, judge
from orchestrator.runners.base import Measurement
from tests.conftest import FAST, read_results, run_daemon, tiny_train_py, write_replay

SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "c" * 64


# ------------------------------------------------------------------ detection (pure)
def test_runs_that_exported_the_same_policy_are_one_run():
    # whatever their scores say: the same artifact is the same run
    why = seed_copies([-150.0, -120.0, -170.0], 44.0, artifacts=[SHA_A] * 3)
    assert why == f"train.py ignores AUTORL_SEED: 3 runs exported the same policy (policy.pt sha256 {SHA_A[:12]})"
    assert "only 2 different policies" in seed_copies([-150.0, -120.0, -170.0], 44.0, artifacts=[SHA_A, SHA_B, SHA_A])
    runs = [ScoredRun("exp 3", seed, score, 2.0, f"run {seed}", SHA_A) for seed, score in ((1, -150.0), (10008, -120.0))]
    assert independent_runs(runs, 44.0) == runs[:1]
    # distinct artifacts and an honest spread: every run counts
    honest = [ScoredRun("exp 3", s, x, 2.0, "", sha) for s, x, sha in ((1, -150.0, SHA_A), (2, -120.0, SHA_B),
                                                                       (3, -170.0, SHA_C))]
    assert seed_copies([r.score for r in honest], 44.0, artifacts=[r.artifact for r in honest]) is None
    assert independent_runs(honest, 44.0) == honest


def test_a_seed_pinned_pendulum_candidate_is_flagged_by_its_spread():
    """The measured case: a wall-clock budget lets each run make a slightly different number of
    updates, so the copies differ a little; the start's seeds differ by 44."""
    assert seed_copies([-138.3, -137.3, -138.3], 44.0) == \
        "train.py ignores AUTORL_SEED: 3 runs within 1 of each other where seeds differ by 44"


@pytest.mark.parametrize("scores", [[-31.2, 52.7, 8.9], [120.4, 71.0], [-12.0, -40.5, 3.3, 61.8, -20.1]])
def test_honest_spreads_are_not_flagged(scores):
    # draws of N(0, 44)
    assert seed_copies(scores, 44.0, [3.0] * len(scores)) is None


def test_a_candidate_far_quieter_than_a_noisy_start_is_not_a_copy():
    # Pendulum's JAX_NUM_STEPS 64 -> 1: the start's seeds spread over 750 points, its fix's runs at
    # sd ~10, as far apart as the evaluation (se 5) resolves; copies agree well inside it
    assert seed_copies([-839.0, -826.0, -818.0], 300.0, [5.0] * 3) is None
    assert seed_copies([-826.0, -825.9, -826.0], 300.0, [5.0] * 3) is not None


def test_the_spread_test_flags_at_copy_alpha_exactly():
    # three runs -d, 0, d: (n - 1) s^2 / sigma^2 = 2 d^2 / sigma^2, flagged below chi2(2)'s COPY_ALPHA quantile
    sigma, edge = 44.0, stats.chi2.ppf(COPY_ALPHA, 2)
    d = sigma * math.sqrt(edge / 2)
    assert seed_copies([-0.99 * d, 0.0, 0.99 * d], sigma) is not None
    assert seed_copies([-1.01 * d, 0.0, 1.01 * d], sigma) is None


def test_equal_scores_at_a_ceiling_are_left_to_the_artifacts():
    # CartPole balanced on every episode (se 0): independent seeds tie too; only the artifacts tell
    assert seed_copies([500.0, 500.0, 500.0], 30.0, [0.0] * 3) is None
    assert seed_copies([500.0, 500.0, 500.0], 30.0, [0.0] * 3, [SHA_A, SHA_B, SHA_C]) is None
    assert "same policy" in seed_copies([500.0, 500.0, 500.0], 30.0, [0.0] * 3, [SHA_A] * 3)
    # equal scores from evaluations that do vary: copies
    assert seed_copies([143.2, 143.2], 30.0, [4.1, 4.1]) is not None


EXPORT_CONTROLLER = """
import sys

import torch


class Controller(torch.nn.Module):
    def __init__(self, bias: float):
        super().__init__()
        self.bias = bias

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return (obs[:, 2] + self.bias > 0).long()


torch.jit.save(torch.jit.script(Controller(float(sys.argv[1]))), "policy.pt")
"""


def _export(folder, bias: float) -> str:
    """policy.pt as a train.py in a snapshot folder of its own saves it, in a process of its own."""
    import subprocess
    import sys

    folder.mkdir(parents=True)
    (folder / "train.py").write_text(EXPORT_CONTROLLER)
    subprocess.run([sys.executable, "train.py", str(bias)], cwd=folder, check=True, timeout=120)
    return str(folder / "policy.pt")


def test_two_exports_of_one_policy_from_two_snapshots_have_one_hash(tmp_path):
    from orchestrator.seed_copies import policy_sha256

    first, again, other = _export(tmp_path / "run-1", 0.5), _export(tmp_path / "run-2", 0.5), _export(tmp_path / "run-3", 0.7)
    assert open(first, "rb").read() != open(again, "rb").read()   # the file's path and a save id differ
    assert policy_sha256(first) == policy_sha256(again)
    assert policy_sha256(first) != policy_sha256(other)


# ------------------------------------------------------------------ the decision (the loop's judge)
BASELINES = [-200.0, -150.0, -260.0, -190.0]    # the start's 4 seeds: sd 45
BEST = sum(BASELINES) / len(BASELINES)
EVAL_SE = 9.0   # Pendulum's: a policy's returns spread ~90 over 100 episodes


def _judged(scores: list[float]) -> tuple[str, str, list[dict]]:
    """A candidate judged by TrainPhase.judge_round as the loop judges it (the night: the start's 4
    baselines), its runs scoring `scores` in turn; returns its status, note and decision looks."""
    noise = estimate([ScoredRun("exp 0", seed, x, EVAL_SE, f"exp 0 run {seed}") for seed, x in enumerate(BASELINES, 1)],
                     best_code="exp 0")
    incumbent = Incumbent(BEST, "best", noise, (1, first_confirmation_seed(FIRST_CONFIRM_SEED, 1)), len(BASELINES))
    runs = iter(scores[1:])

    def confirm(request):
        return Measurement(score=next(runs), evaluation={"se": EVAL_SE})

    [verdict] = judge(TrainPhase().judge_round([Measurement(score=scores[0], evaluation={"se": EVAL_SE})], incumbent, [1]),
                      confirm)
    return verdict.status, verdict.note, verdict.decision["looks"]


def test_copies_that_differ_a_little_wait_for_more_runs_and_are_then_judged_as_one():
    """Copies whose scores stray by a third of the evaluation's se (a wall-clock budget's extra
    updates) pass COPY_ALPHA on two runs; such closeness is no ground for a keep: one more run first,
    and copies stay close."""
    margin = 200.0
    status, note, looks = _judged([BEST + margin, BEST + margin + 3.0, BEST + margin + 1.0, BEST + margin + 2.5,
                                   BEST + margin + 0.5])
    assert status == "discard" and note.startswith("train.py ignores AUTORL_SEED: "), note
    assert "judged as one run" in note
    deferred = [look for look in looks if "confirm before keeping" in look["note"]]
    assert deferred and all(look["action"] == "confirm" for look in deferred), [look["note"] for look in looks]
    # an honest candidate as far above: kept, its spread far above what copies show
    honest, honest_note, honest_looks = _judged([BEST + margin + 30.0, BEST + margin - 35.0, BEST + margin + 5.0])
    assert honest == "keep", honest_note
    assert not any("confirm before keeping" in look["note"] for look in honest_looks)


def test_a_keep_waits_on_close_runs_only_while_runs_remain():
    from orchestrator.seed_copies import KEEP_INDEPENDENCE, copy_evidence

    p, _ = copy_evidence([10.0, 10.5], 44.0, [9.0, 9.0])
    assert COPY_ALPHA <= p < KEEP_INDEPENDENCE   # close, not a copy by itself
    assert copy_evidence([10.0, 40.0], 44.0, [9.0, 9.0])[0] >= KEEP_INDEPENDENCE
    assert copy_evidence([10.0], 44.0)[0] == 1.0


def test_copies_above_the_best_by_a_keeping_margin_are_judged_as_one_run():
    margin = 200.0   # three independent runs at it are kept on their third look
    honest_status, honest_note, _ = _judged([BEST + margin + 30.0, BEST + margin - 35.0, BEST + margin + 5.0])
    assert honest_status == "keep" and "confirmed over 3 seeds" in honest_note
    status, note, looks = _judged([BEST + margin, BEST + margin + 1.0, BEST + margin, BEST + margin + 0.5,
                                   BEST + margin + 0.2])
    assert status == "discard"
    assert note.startswith("train.py ignores AUTORL_SEED: ")
    assert "judged as one run" in note and looks[-1]["action"] == "discard"


# ------------------------------------------------------------------ fresh confirmation seeds
def test_confirmation_seeds_are_never_a_start_seed_nor_another_candidates():
    train_seeds = list(range(1, BASELINE_RUNS + 1))
    start = {start_seed(k, train_seeds) for k in range(1, START_RUNS_FACTOR * BASELINE_RUNS + 1)}
    confirmations = [confirmation_seed(first_confirmation_seed(FIRST_CONFIRM_SEED, exp), k)
                     for exp in range(1, 2001) for k in range(1, MAX_RUNS)]
    assert len(set(confirmations)) == len(confirmations)
    assert not start & set(confirmations)


# ------------------------------------------------------------------ a real night
SEEDED = tiny_train_py(BIAS=0.5).replace(
    "Controller(bias)", "Controller(BIAS + 0.1 * (int(os.environ['AUTORL_SEED']) * 7919 % 5))")


@pytest.mark.long
@pytest.mark.slow
def test_a_night_with_a_seed_pinned_candidate(autorl_repo, tmp_path):
    """A candidate that ignores AUTORL_SEED (SEED_SPREAD 0: the same policy on every seed) is not kept
    on its copies (~260 against a start at ~145); an honest candidate after it is confirmed with seeds
    of its own, none a baseline's."""
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": tiny_train_py(BIAS=0.5, SEED_SPREAD=0.0), "DESCRIPTION": "pinned seed"},
        2: {"candidate/train.py": SEEDED, "DESCRIPTION": "seeded"}})
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "pinned", "--agent", "replay", "--replay-dir",
                      str(replay), "--budget", "5", "--max-experiments", "2", "--no-setup-verify", *FAST, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_results(repo, "pinned")
    pinned = rows[rows.exp == 1].iloc[-1]
    assert pinned["status"] == "discard" and pinned["score"] > rows["best"].iloc[1] + 50
    assert "train.py ignores AUTORL_SEED: 2 runs exported the same policy" in pinned["description"]
    run_dir = repo / "results" / "pinned"
    seeds = {exp: [r["seed"] for r in json.loads((run_dir / f"exp-{exp:04d}" / "decision.json").read_text())
                   ["looks"][-1]["runs"]] for exp in (1, 2)}
    confirmations = seeds[1][1:] + seeds[2][1:]
    assert seeds[1][1:] and seeds[2][1:]
    assert len(set(confirmations)) == len(confirmations) and not {1, 2} & set(confirmations)
