"""The keep rule: its error rates by simulation (synthetic scores of known seed noise), the noise
estimate pooled over the night's same-code pairs, and the decisions on the cases that matter."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from orchestrator.keep_rule import LOOK_ALPHAS, MAX_RUNS, ScoredRun, estimate, look, simulate, t_quantile
from orchestrator.ledger import Ledger
from orchestrator.loop import Run
from orchestrator.results import ExpFolder, ResultsFile, Row, RunFolder


def test_simulated_error_rates_and_cost(capsys):
    """Thousands of candidates against the best, seed noise sigma known to the simulation only."""
    table = []
    for pairs in (1, 3, 10):
        null = simulate(0.0, pairs, 4000, seed=pairs, sigma=7.0, se=0.5)
        gain = simulate(2.0, pairs, 4000, seed=1000 + pairs, sigma=7.0, se=0.5)
        table.append((pairs, null, gain))
        # No real improvement: kept at most 5% of the time, however few pairs the night has.
        assert null.kept <= sum(LOOK_ALPHAS), (pairs, null)
        # A true gain of 2 sigma: kept >= 80% of the time from the night's first pair on.
        assert gain.kept >= 0.80, (pairs, gain)
        # The cost, confirmations counted: runs per candidate.
        assert 1.0 < null.runs < 2.0 and 1.0 < gain.runs < MAX_RUNS, (pairs, null, gain)
    by_pairs = {pairs: (null, gain) for pairs, null, gain in table}
    # More pairs, a sharper sigma: more real gains kept, and for fewer runs.
    assert by_pairs[1][1].kept < by_pairs[3][1].kept < by_pairs[10][1].kept
    assert by_pairs[1][1].runs > by_pairs[3][1].runs > by_pairs[10][1].runs
    with capsys.disabled():
        print("\nkeep rule, simulated (4000 candidates each): pairs | no gain: kept, runs | 2 sigma: kept, runs")
        for pairs, null, gain in table:
            print(f"  {pairs:2d} | {null.kept:.3f} {null.runs:.2f} | {gain.kept:.3f} {gain.runs:.2f}")


def test_simulation_is_scale_free_and_the_floor_only_tightens():
    assert simulate(0.0, 3, 1000, seed=5, sigma=1.0).kept == simulate(0.0, 3, 1000, seed=5, sigma=1000.0).kept
    assert simulate(0.0, 3, 2000, seed=6, sigma=1.0, se=2.0).kept <= simulate(0.0, 3, 2000, seed=6, sigma=1.0).kept


def test_noise_is_pooled_over_every_same_code_group():
    runs = [ScoredRun("base", 1, 100.0, 1.0), ScoredRun("base", 2, 110.0, 1.0),      # a pair: 1 df
            ScoredRun("a", 1, 50.0, 2.0),                                             # alone: nothing
            ScoredRun("b", 1, 10.0, 0.0), ScoredRun("b", 2, 14.0, 0.0), ScoredRun("b", 3, 12.0, 0.0),  # 2 df
            ScoredRun("c", 1, 70.0, 0.0), ScoredRun("c", 2, 90.0, 0.0), ScoredRun("c", 1, 80.0, 0.0)]  # seed 1 again
    noise = estimate(runs)
    squares = (5 ** 2 * 2) + (2 ** 2 + 2 ** 2 + 0) + (5 ** 2 * 2)  # c: the later seed-1 run (80) replaces 70
    assert noise.df == 1 + 2 + 1 and noise.pooled == pytest.approx(math.sqrt(squares / 4))
    assert [len(g) for g in noise.groups] == [2, 3, 2]
    assert noise.floor == pytest.approx(math.sqrt(2 / 7)) and noise.sigma == noise.pooled
    # No pair yet: the floor (the evaluation's standard error) is all there is.
    alone = estimate([ScoredRun("a", 1, 50.0, 2.0)]).including(extra_se=[2.0])
    assert alone.df == 0 and alone.pooled is None and alone.sigma == pytest.approx(2.0)
    assert json.loads(json.dumps(noise.evidence()))["groups"][0][1]["score"] == 110.0


def test_identical_runs_do_not_make_the_noise_zero():
    """CartPole's 0.000: two baseline runs with the same score. The floor (the evaluation's
    standard error) and one pair's t quantile still ask a small win to be confirmed."""
    noise = estimate([ScoredRun("base", 1, 180.0, 4.0), ScoredRun("base", 2, 180.0, 4.0)]).including(extra_se=[4.0])
    assert noise.pooled == 0.0 and noise.sigma == pytest.approx(4.0)
    assert look([180.0], 180.0, noise).action == "discard"
    lucky = look([205.0], 180.0, noise)
    assert lucky.action == "confirm" and lucky.threshold == pytest.approx(180 + t_quantile(1 - LOOK_ALPHAS[0], 1) * 4.0)
    # A candidate far beyond anything the noise explains is kept without confirmation.
    assert look([1000.0], 180.0, noise).action == "keep"
    # The confirmation: the pair (205, 203) joins the estimate; the 2-seed mean must clear
    # best + t(1 - alpha_2, 2) * sigma / sqrt 2 (~201.6 here).
    candidate = [ScoredRun("cand", 1, 205.0, 4.0), ScoredRun("cand", 2, 203.0, 4.0)]
    after = noise.including(candidate)
    second = look([205.0, 203.0], 180.0, after)
    assert after.df == 2 and second.action == "keep"
    assert second.threshold == pytest.approx(180 + t_quantile(1 - LOOK_ALPHAS[1], 2) * after.sigma / math.sqrt(2))
    assert "confirmed over 2 seeds: 205.000, 203.000" in second.note
    # A smaller 2-seed win (195, 193) is not yet evidence at this noise: one more run.
    smaller = [ScoredRun("cand", 1, 195.0, 4.0), ScoredRun("cand", 2, 193.0, 4.0)]
    assert look([195.0, 193.0], 180.0, noise.including(smaller)).action == "confirm"


def test_confirming_stops_on_a_falling_mean_and_after_max_runs():
    noise = estimate([ScoredRun("base", 1, 100.0), ScoredRun("base", 2, 120.0)])   # sigma ~14, 1 df
    runs = [ScoredRun("c", 1, 125.0), ScoredRun("c", 2, 95.0)]                    # mean 110: t ~0.56 after 2 runs
    falling = look([125.0, 95.0], 110.0, noise.including(runs))
    assert falling.action == "discard" and "stopped confirming" in falling.note
    rising = [ScoredRun("c", 1, 135.0), ScoredRun("c", 2, 132.0)]                # t ~2.4: worth a third run
    assert look([135.0, 132.0], 110.0, noise.including(rising)).action == "confirm"
    # The last look: a mean above the best but short of the threshold is a discard, not a 5th run.
    last = [ScoredRun("c", s, score) for s, score in zip(range(1, MAX_RUNS + 1), (125.0, 112.0, 123.0, 116.0))]
    final = look([r.score for r in last], 110.0, noise.including(last))
    assert final.action == "discard" and f"{MAX_RUNS} runs at most" in final.note
    # Bonferroni over the looks: the levels sum to 5%, each a stricter quantile than one look at 5%.
    assert sum(LOOK_ALPHAS) == pytest.approx(0.05) and len(LOOK_ALPHAS) == MAX_RUNS


def _eval(folder: ExpFolder, mean: float, se: float = 1.0) -> None:
    folder.path.mkdir(parents=True, exist_ok=True)
    folder.eval_json.write_text(json.dumps({"mean": mean, "se": se, "returns": [mean]}))


def test_a_nights_pairs_baselines_confirmations_and_re_baselines(tmp_path):
    """Which runs count as the same code: read from results.tsv and the exp folders' eval.json."""
    folder = RunFolder(tmp_path)
    results = ResultsFile(folder.results)
    results.create()
    rows = [Row(0, "train", "baseline", score=100.0), Row(0, "train", "baseline", score=110.0),
            Row(1, "train", "discard", score=110.0), Row(2, "train", "keep", score=150.0),
            Row(3, "translate", "keep"), Row(4, "train", "baseline", score=140.0),
            Row(5, "train", "keep", score=165.0), Row(6, "train", "crash"), Row(7, "train", "invalid", score=999.0),
            Row(8, "translate", "keep"), Row(9, "train", "baseline", score=168.0)]
    for row in rows:
        results.append(row)
    _eval(folder.exp(0), 100.0)
    _eval(folder.exp(0).run(2), 110.0)
    _eval(folder.exp(1), 120.0)
    _eval(folder.exp(1).confirmation(1), 100.0)
    _eval(folder.exp(2), 150.0)                     # kept outright: one run
    _eval(folder.exp(4), 140.0)                     # its re-baseline: seed 1 again, replaces it
    _eval(folder.exp(5), 160.0)
    _eval(folder.exp(5).confirmation(1), 170.0)     # kept after two confirmations (seeds 2 and 3)
    _eval(folder.exp(5).confirmation(2), 175.0)
    _eval(folder.exp(7), 999.0)
    _eval(folder.exp(7).confirmation(1), 0.0)       # an invalid experiment's runs never count
    _eval(folder.exp(9), 168.0)                     # re-baseline of exp 5: groups with its confirmations
    run = Run.__new__(Run)
    run.config, run.folder, run.ledger = SimpleNamespace(train_seeds=[1, 2], confirm_seed=2), folder, Ledger(results)
    noise = run.noise_estimate()
    assert [[r.label for r in g] for g in noise.groups] == [
        ["exp 0 run 1", "exp 0 run 2"], ["exp 1", "exp 1 confirm 1"],
        ["exp 9 re-baseline", "exp 5 confirm 1", "exp 5 confirm 2"]]
    assert [r.seed for r in noise.groups[2]] == [1, 2, 3]
    assert noise.df == 4  # 1 + 1 + 2
    assert noise.pooled == pytest.approx(math.sqrt((10 ** 2 / 2 + 20 ** 2 / 2 + (3 ** 2 + 1 ** 2 + 4 ** 2)) / 4))
    assert run.noise == noise.sigma
