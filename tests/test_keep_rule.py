"""The keep rule: its error rates by simulation (synthetic scores of known seed noise), the noise
estimate pooled over the night's same-code pairs, and the decisions on the cases that matter."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from orchestrator.keep_rule import (LOOK_SHARES, MAX_RUNS, NIGHT_ALPHA, best_evidence, ScoredRun, candidate_alpha, estimate, look, simulate,
                                    simulate_night, t_quantile)
from orchestrator.ledger import Ledger
from orchestrator.loop import Run
from orchestrator.results import ExpFolder, ResultsFile, Row, RunFolder


def test_simulated_error_rates_and_cost(capsys):
    """Thousands of candidates against a best that is itself the mean of the 2 baseline runs, seed
    noise sigma known to the simulation only."""
    table = []
    for pairs, power in ((1, 0.60), (3, 0.75), (10, 0.90)):
        null = simulate(0.0, pairs, 4000, seed=pairs, sigma=7.0, se=0.5, best_runs=2)
        gain = simulate(4.0, pairs, 4000, seed=1000 + pairs, sigma=7.0, se=0.5, best_runs=2)
        table.append((pairs, null, gain))
        # No real improvement: the first candidate of a stretch is kept at most at its level, 1.25%,
        # the best's own noise counted, however few pairs the night has.
        assert null.kept <= candidate_alpha(1) + 0.004, (pairs, null)
        # A true gain of 4 sigma, the first candidate of a stretch: kept 60% of the time with the
        # baselines' pair alone, 75% with 3 pairs, 90% with 10.
        assert gain.kept >= power, (pairs, gain)
        # The cost, confirmations counted: runs per candidate.
        assert 1.0 < null.runs < 2.0 and 1.0 < gain.runs < MAX_RUNS, (pairs, null, gain)
    by_pairs = {pairs: (null, gain) for pairs, null, gain in table}
    # More pairs, a sharper sigma: more real gains kept, and for fewer runs.
    assert by_pairs[1][1].kept < by_pairs[3][1].kept < by_pairs[10][1].kept
    assert by_pairs[1][1].runs > by_pairs[3][1].runs > by_pairs[10][1].runs
    # What counting the best's noise fixes: judged as if the baselines' mean were exact, 4-8% of
    # equal candidates were kept at a nominal 1.25%.
    blind = simulate(0.0, 3, 4000, seed=3, sigma=7.0, se=0.5, best_runs=2, rule_sees_best_runs=False)
    assert blind.kept > 2 * candidate_alpha(1), blind
    with capsys.disabled():
        print("\nkeep rule, simulated (4000 candidates each): pairs | no gain: kept, runs | 4 sigma: kept, runs")
        for pairs, null, gain in table:
            print(f"  {pairs:2d} | {null.kept:.3f} {null.runs:.2f} | {gain.kept:.3f} {gain.runs:.2f}")


def test_a_night_with_nothing_to_gain_keeps_something_in_at_most_5_percent_of_nights():
    """The night's level is shared by the candidates that get past their first look (1/4, 1/12,
    1/24, ... of 5%; a discard at the first look is free): 12 or 30 candidates no better than the
    start keep one in <= 5% of nights, where 5% per candidate kept one in up to half of them; a
    real gain among them is still found, after worse candidates too, and a keep renews the level."""
    for length in (12, 30):
        null = simulate_night([0.0] * length, 1500, seed=length, sigma=7.0, se=0.5)
        assert null.false_keep_nights <= NIGHT_ALPHA, (length, null)
    assert [candidate_alpha(k) / NIGHT_ALPHA for k in (1, 2, 3)] == pytest.approx([1 / 4, 1 / 12, 1 / 24])
    one_gain = simulate_night([5.0] + [0.0] * 11, 1500, seed=7, sigma=7.0, se=0.5)
    assert one_gain.keeps >= 0.80 and one_gain.false_keep_nights <= NIGHT_ALPHA, one_gain
    # The benchmark's night: five candidates clearly worse than the start, then a real gain. They
    # were discarded on their first run, free, so the gain is judged at the stretch's full level.
    after_worse = simulate_night([-3.0, -2.0, -4.0, -2.5, -3.0, 5.0] + [-2.0] * 6, 1500, seed=9, sigma=7.0, se=0.5)
    assert after_worse.keeps >= 0.75, after_worse
    # Two successive gains: the second is judged as the first of a new stretch.
    climb = simulate_night([5.0, 10.0] + [0.0] * 10, 1500, seed=8, sigma=7.0, se=0.5)
    assert climb.gain > 8.0, climb


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
    assert lucky.action == "confirm" and lucky.threshold == pytest.approx(180 + t_quantile(1 - NIGHT_ALPHA * LOOK_SHARES[0], 1) * 4.0)
    # A candidate far beyond anything the noise explains is kept without confirmation.
    assert look([1000.0], 180.0, noise).action == "keep"
    # The confirmation: the pair (205, 203) joins the estimate; the 2-seed mean must clear
    # best + t(1 - alpha_2, 2) * sigma / sqrt 2 (~201.6 here).
    candidate = [ScoredRun("cand", 1, 205.0, 4.0), ScoredRun("cand", 2, 203.0, 4.0)]
    after = noise.including(candidate)
    second = look([205.0, 203.0], 180.0, after)
    assert after.df == 2 and second.action == "keep"
    assert second.threshold == pytest.approx(180 + t_quantile(1 - NIGHT_ALPHA * LOOK_SHARES[1], 2) * after.sigma / math.sqrt(2))
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
    # Bonferroni over the looks: the shares of a candidate's level sum to one.
    assert sum(LOOK_SHARES) == pytest.approx(1.0) and len(LOOK_SHARES) == MAX_RUNS


def test_the_best_is_measured_too_and_its_runs_widen_the_threshold():
    """The best to beat is the mean of its own runs: 2 baselines put sqrt(1/n + 1/2) in the
    spread, and a lower level (a later candidate of the stretch) a higher quantile."""
    noise = estimate([ScoredRun("base", 1, 100.0), ScoredRun("base", 2, 110.0),
                      ScoredRun("x", 1, 50.0), ScoredRun("x", 2, 60.0)])       # sigma sqrt(50), 2 df
    exact, measured = look([120.0], 105.0, noise), look([120.0], 105.0, noise, best_runs=2)
    assert measured.threshold - 105.0 == pytest.approx((exact.threshold - 105.0) * math.sqrt(1.5))
    later = look([120.0], 105.0, noise, best_runs=2, alpha=candidate_alpha(5))
    assert later.threshold > measured.threshold
    assert "sqrt(1/1+1/2)" in look([5000.0], 105.0, noise, best_runs=2).note   # the row says what it beat


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
    # What the best's score is the mean of, and where the stretch stands, from the same rows: the
    # last re-baseline (exp 9) is one run; no train keep since exp 5, and no candidate judged since.
    assert best_evidence(rows, folder) == (1, 0)
    # Before the translation of exp 8: exp 5's three runs, judged since: none (crash and invalid are not judged).
    assert best_evidence(rows[:9], folder) == (3, 0)
    assert best_evidence(rows[:2], folder) == (2, 0)                       # the two baselines
    assert best_evidence(rows[:3], folder) == (2, 0)                       # exp 1: no decision.json, not judged
    folder.exp(1).decision.write_text(json.dumps({"alpha": 0.0125, "looks": [{"action": "discard"}]}))
    assert best_evidence(rows[:3], folder) == (2, 0)                       # discarded on its first run: free
    folder.exp(1).decision.write_text(json.dumps({"alpha": 0.0125, "looks": [{"action": "confirm"},
                                                                             {"action": "discard"}]}))
    assert best_evidence(rows[:3], folder) == (2, 1)                       # confirmed, then discarded: it spent
    # A candidate discarded because another of its round was kept spent nothing (no level).
    folder.exp(2).decision.write_text(json.dumps({"looks": [{"action": "discard"}]}))
    assert best_evidence(rows[:2] + [Row(2, "train", "discard", score=150.0)], folder) == (2, 0)
    assert best_evidence(rows[:4], folder) == (1, 0)                       # exp 2 kept outright: a new stretch
