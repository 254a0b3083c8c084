"""The keep rule: its error rates by simulation (synthetic scores of known seed noise), the noise
estimate pooled over the night's same-code pairs, and the decisions on the cases that matter."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest

from orchestrator.config import FIRST_CONFIRM_SEED
from orchestrator.keep_rule import (LOOK_SHARES, MAX_LOST_START_RUNS, MAX_RUNS, NIGHT_ALPHA, PRIOR_SD_RATIO,
                                    START_RUNS_FACTOR, best_evidence, ScoredRun, candidate_alpha, estimate, look,
                                    night_noise, start_needs_run, t_quantile, welch_df)
from orchestrator.keep_rule_simulation import simulate_nights
from orchestrator.ledger import Ledger
from orchestrator.loop import Run
from orchestrator.results import ExpFolder, ResultsFile, Row, RunFolder


@pytest.mark.slow
def test_a_null_night_keeps_something_in_at_most_5_percent_of_nights_however_noisy_its_candidates():
    """12 candidates as good as the start, each with a seed-to-seed sd 1x, 3x or 8x the start's
    (a change that makes training bimodal is such a candidate), judged through the loop's own
    round and bookkeeping: with one sigma pooled over all code, the 8x night kept something in 29%
    of nights; each candidate now weighs its own spread (and a prior of 3 sigma before it has any).
    Candidates 10x quieter than the start (the fixes of a detune that makes training unstable):
    judged against the pooled sigma their confirmations pulled down, 7% of nights kept something;
    the best now weighs its own runs' spread too."""
    for ratio, trials in ((0.1, 300), (1.0, 300), (3.0, 300), (8.0, 600)):
        null = simulate_nights([0.0] * 12, trials, seed=int(ratio), sigma=7.0, se=0.5, candidate_sd=ratio)
        assert null.false_keep_nights <= NIGHT_ALPHA, (ratio, null)
        assert 1.0 < null.runs_per_candidate < 2.5, null   # most are discarded on their first run, free
    assert [candidate_alpha(k) / NIGHT_ALPHA for k in (1, 2, 3)] == pytest.approx([1 / 4, 1 / 12, 1 / 24])


def test_a_real_gain_is_still_found_first_after_worse_candidates_and_in_parallel_rounds():
    one_gain = simulate_nights([4.0] + [0.0] * 11, 300, seed=7, sigma=7.0, se=0.5)
    assert one_gain.found >= 0.85 and one_gain.false_keep_nights <= NIGHT_ALPHA, one_gain
    # The benchmark's night: five candidates clearly worse than the start, then a real gain. They
    # were discarded on their first run, free, so the gain is judged at the stretch's full level.
    after_worse = simulate_nights([-3.0, -2.0, -4.0, -2.5, -3.0, 5.0] + [-2.0] * 6, 200, seed=9, sigma=7.0, se=0.5)
    assert after_worse.found >= 0.85, after_worse
    # Two successive gains: the second is judged as the first of a new stretch.
    climb = simulate_nights([5.0, 10.0] + [0.0] * 10, 200, seed=8, sigma=7.0, se=0.5)
    assert climb.gain > 8.0, climb
    # --parallel 3: rounds of three judged together, the keep's round mates never charged to its stretch.
    parallel_null = simulate_nights([0.0] * 12, 300, seed=10, sigma=7.0, se=0.5, parallel=3)
    assert parallel_null.false_keep_nights <= NIGHT_ALPHA, parallel_null
    parallel_gain = simulate_nights([0.0, 4.0, 0.0] + [0.0] * 9, 200, seed=11, sigma=7.0, se=0.5, parallel=3)
    assert parallel_gain.found >= 0.8, parallel_gain


def test_simulation_is_scale_free_and_its_gains_and_noise_are_independent_streams():
    assert simulate_nights([0.0] * 6, 60, seed=5, sigma=1.0).keeps == simulate_nights([0.0] * 6, 60, seed=5, sigma=1000.0).keeps
    # Gains drawn per night from their own generator: the same seed gives the same gains whatever the
    # noise consumed, and the noise is not the gains' generator replayed.
    drawn = []

    def gains(draw):
        values = [draw.random() for _ in range(3)]
        drawn.append(values)
        return [0.0] * 3

    simulate_nights(gains, 2, seed=3, candidate_sd=1.0)
    first = list(drawn)
    drawn.clear()
    simulate_nights(gains, 2, seed=3, candidate_sd=8.0)   # other noise draws, same gains
    assert drawn == first and first[0] != first[1]


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
    assert look([180.0], 180.0, noise, best_runs=2).action == "discard"
    lucky = look([205.0], 180.0, noise, best_runs=2)
    # one run: the candidate's sd is the prior, 3 sigma; the best's, sigma over its 2 runs
    assert lucky.action == "confirm" and lucky.threshold == pytest.approx(
        180 + t_quantile(1 - NIGHT_ALPHA * LOOK_SHARES[0], 1) * 4.0 * math.sqrt(PRIOR_SD_RATIO ** 2 + 1 / 2))
    assert "3 x sigma (prior)" in lucky.note


def test_a_candidate_is_judged_by_its_own_spread_once_it_has_runs():
    base = [ScoredRun("base", s, 180.0 + d, 0.5) for s, d in zip(range(1, 5), (-4.0, 4.0, -3.0, 3.0))]
    noise = estimate(base + [ScoredRun("x", s, 150.0 + d, 0.5) for s, d in zip(range(1, 8), (-5, 5, -3, 3, -4, 4, 0))])
    assert noise.df == 9 and 3.0 < noise.sigma < 5.0
    # Far beyond anything the night's noise explains, even 3 sigma of it: kept on its first run.
    assert look([300.0], 180.0, noise, best_runs=4).action == "keep"
    # A steady +25 (about 6 sigma) is confirmed, then kept on the mean of its runs.
    assert look([205.0], 180.0, noise, best_runs=4).action == "confirm"
    assert look([205.0, 203.0], 180.0, noise, best_runs=4).action == "confirm"
    kept = look([205.0, 203.0, 206.0], 180.0, noise, best_runs=4)
    assert kept.action == "keep" and "confirmed over 3 seeds" in kept.note and "candidate sd sigma" in kept.note
    # A bimodal candidate (one seed learns, one does not) with the same mean: its own spread decides.
    bimodal = look([240.0, 170.0], 180.0, noise, best_runs=4)
    assert bimodal.action == "discard" and "(its own)" in bimodal.note
    # With the pooled sigma alone the same pair would have been confirmed, and a lucky third run kept.
    pooled = math.sqrt(noise.sigma ** 2 / 2 + noise.sigma ** 2 / 4)
    assert (205.0 - 180.0) / pooled > 1.0 > (205.0 - 180.0) / math.sqrt(2450.0 / 2 + noise.sigma ** 2 / 4)


def test_a_noisy_start_is_judged_by_its_own_spread_however_quiet_the_pooled_candidates():
    """Pendulum's JAX_NUM_STEPS 64 -> 1: the start's 4 baselines spread over 750 points, its
    candidates' confirmations far less. The start's own spread stays in the comparison however far
    they pull the pooled sigma down."""
    base = [ScoredRun("exp 0", s, v, 5.0) for s, v in zip(range(1, 5), (-494.2, -1147.0, -959.7, -392.7))]
    best = sum(r.score for r in base) / 4
    quiet = [ScoredRun("exp 3", s, -830.0 + d, 5.0) for s, d in zip(range(1, 6), (-9, 4, 12, -3, -4))]
    noise = estimate(base + quiet, best_code="exp 0").including(extra_se=[5.0] * 5)
    s_b2, df_b = noise.wider_spread_of("exp 0")               # F test: far wider than the others'
    assert df_b == 3 and noise.sigma ** 2 < s_b2 / 2          # the quiet group pulled sigma down
    # A quiet candidate exactly as good as the start, after a low draw of the start: judged with
    # the pooled sigma for the best it is kept; with the start's own spread it is not.
    null = [best + 650.0 + d for d in (-8.0, 5.0, 11.0, -6.0, -2.0)]      # pooled: kept above +498; own: +850
    fair = look(null, best, noise, best_runs=4, alpha=candidate_alpha(1))
    assert fair.action == "discard" and "sd_B^2/4, sd_B" in fair.note and "(the best's own)" in fair.note
    pooled = look(null, best, replace(noise, best_code=None), best_runs=4, alpha=candidate_alpha(1))
    assert pooled.action == "keep" and "+ sigma^2/4" in pooled.note
    # Welch's df from the start's own 3 and the candidate's 4 (its spread is the night's sigma)
    parts = [(noise.sigma ** 2 / 5, 4), (s_b2 / 4, 3)]
    assert fair.df == pytest.approx(welch_df(parts))
    assert fair.threshold == pytest.approx(best + t_quantile(1 - candidate_alpha(1) * LOOK_SHARES[4], welch_df(parts))
                                           * math.sqrt(sum(v for v, _ in parts)))
    # A best quieter than the pool keeps sigma, as before; so does one whose 4 runs spread wider
    # than the others' by no more than chance allows (equal noise: a night loses no power to it).
    calm = estimate([ScoredRun("exp 0", s, 100.0 + d, 0.5) for s, d in zip(range(1, 5), (-1, 1, -1, 1))]
                    + [ScoredRun("exp 2", s, 50.0 + d, 0.5) for s, d in zip(range(1, 4), (-20, 0, 20))],
                    best_code="exp 0")
    assert calm.wider_spread_of("exp 0") is None and "+ sigma^2/4" in look([160.0, 150.0], 100.0, calm, best_runs=4).note
    chance = estimate([ScoredRun("exp 0", s, 100.0 + d, 0.5) for s, d in zip(range(1, 5), (-15, 15, -15, 15))]
                      + [ScoredRun("exp 2", s, 50.0 + d, 0.5) for s, d in zip(range(1, 6), (-10, 10, -10, 10, 0))],
                      best_code="exp 0")
    assert chance.wider_spread_of("exp 0") is None                 # sd 17 against 10: F 3.0 < F(0.95; 3, 4) = 6.6


def test_confirming_stops_on_a_falling_mean_and_after_max_runs():
    noise = estimate([ScoredRun("base", 1, 100.0), ScoredRun("base", 2, 120.0)])   # sigma ~14, 1 df
    falling = look([125.0, 95.0], 110.0, noise)                                   # mean 110: t 0
    assert falling.action == "discard" and "stopped confirming" in falling.note
    assert look([135.0, 132.0], 110.0, noise).action == "confirm"                 # t ~2.4: worth a third run
    # The last look: a mean above the best but short of the threshold is a discard, not another run.
    last = (125.0, 112.0, 123.0, 116.0, 119.0)[:MAX_RUNS]
    final = look(list(last), 110.0, noise)
    assert final.action == "discard" and f"{MAX_RUNS} runs at most" in final.note
    # Bonferroni over the looks: the shares of a candidate's level sum to one.
    assert sum(LOOK_SHARES) == pytest.approx(1.0) and len(LOOK_SHARES) == MAX_RUNS


def test_the_best_is_measured_too_and_its_runs_widen_the_threshold():
    """The best to beat is the mean of its own runs: 2 baselines put sigma^2/2 in the spread, and
    a lower level (a later candidate of the stretch) a higher quantile."""
    noise = estimate([ScoredRun("base", 1, 100.0), ScoredRun("base", 2, 110.0),
                      ScoredRun("x", 1, 50.0), ScoredRun("x", 2, 60.0)])       # sigma sqrt(50), 2 df
    exact, measured = look([120.0], 105.0, noise), look([120.0], 105.0, noise, best_runs=2)
    assert measured.threshold - 105.0 == pytest.approx(
        (exact.threshold - 105.0) * math.sqrt(PRIOR_SD_RATIO ** 2 + 1 / 2) / PRIOR_SD_RATIO)
    # two runs each side of its own: Welch-Satterthwaite's df (here the candidate's spread is its own)
    two = look([150.0, 120.0], 105.0, noise, best_runs=2)
    parts = [(450.0 / 2, 1), (50.0 / 2, 2)]
    assert two.threshold - 105.0 == pytest.approx(
        t_quantile(1 - NIGHT_ALPHA * LOOK_SHARES[1], welch_df(parts)) * math.sqrt(sum(v for v, _ in parts)))
    assert measured.threshold > exact.threshold
    later = look([120.0], 105.0, noise, best_runs=2, alpha=candidate_alpha(5))
    assert later.threshold > measured.threshold
    assert "sqrt(sd^2/1 + sigma^2/2)" in look([5000.0], 105.0, noise, best_runs=2).note   # the row says what it beat


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
    _eval(folder.exp(5).confirmation(1), 170.0)     # kept after two confirmations (its own seeds, from FIRST_CONFIRM_SEED + 16)
    _eval(folder.exp(5).confirmation(2), 175.0)
    _eval(folder.exp(7), 999.0)
    _eval(folder.exp(7).confirmation(1), 0.0)       # an invalid experiment's runs never count
    _eval(folder.exp(9), 168.0)                     # re-baseline of exp 5: groups with its confirmations
    run = Run.__new__(Run)
    run.config, run.folder, run.ledger = SimpleNamespace(train_seeds=[1, 2], confirm_seed=FIRST_CONFIRM_SEED), folder, Ledger(results)
    noise = run.noise_estimate()
    assert [[r.label for r in g] for g in noise.groups] == [
        ["exp 0 run 1", "exp 0 run 2"], ["exp 1", "exp 1 confirm 1"],
        ["exp 9 re-baseline", "exp 5 confirm 1", "exp 5 confirm 2"]]
    assert [r.seed for r in noise.groups[2]] == [1, FIRST_CONFIRM_SEED + 16, FIRST_CONFIRM_SEED + 17]  # exp 5's own
    assert noise.df == 4  # 1 + 1 + 2
    assert noise.pooled == pytest.approx(math.sqrt((10 ** 2 / 2 + 20 ** 2 / 2 + (3 ** 2 + 1 ** 2 + 4 ** 2)) / 4))
    assert run.noise == noise.sigma
    # The best's own group (the keep rule weighs its spread when wider): exp 5 with its re-baseline.
    assert noise.best_code == "exp 5" and noise.including(extra_se=[1.0]).best_code == "exp 5"
    # What the best's score is the mean of, and where the stretch stands, from the same rows: the
    # last re-baseline (exp 9) is one run; no train keep since exp 5, and no candidate judged since.
    assert best_evidence(rows, folder) == (1, 0, 5)
    # Before the translation of exp 8: exp 5's three runs, judged since: none (crash and invalid are not judged).
    assert best_evidence(rows[:9], folder) == (3, 0, 5)
    assert best_evidence(rows[:2], folder) == (2, 0, 0)                       # the two baselines
    assert best_evidence(rows[:3], folder) == (2, 0, 0)                       # exp 1: no decision.json, not judged
    folder.exp(1).decision.write_text(json.dumps({"alpha": 0.0125, "looks": [{"action": "discard"}]}))
    assert best_evidence(rows[:3], folder) == (2, 0, 0)                       # discarded on its first run: free
    folder.exp(1).decision.write_text(json.dumps({"alpha": 0.0125, "looks": [{"action": "confirm"},
                                                                             {"action": "discard"}]}))
    assert best_evidence(rows[:3], folder) == (2, 1, 0)                       # confirmed, then discarded: it spent
    # A candidate discarded because another of its round was kept spent nothing (no level).
    folder.exp(2).decision.write_text(json.dumps({"looks": [{"action": "discard"}]}))
    assert best_evidence(rows[:2] + [Row(2, "train", "discard", score=150.0)], folder) == (2, 0, 0)
    assert best_evidence(rows[:4], folder) == (1, 0, 2)                       # exp 2 kept outright: a new stretch


def test_the_stretch_a_candidate_is_charged_to_is_the_one_it_was_judged_in(tmp_path):
    """--parallel: exp 1 was confirmed and discarded in the round in which exp 2 was kept; its row
    comes after the keep's, yet the new stretch starts at the first level. A candidate interrupted
    while confirming spent its level all the same."""
    folder = RunFolder(tmp_path)
    for exp, looks in ((1, ["confirm", "discard"]), (3, ["confirm"])):
        folder.exp(exp).path.mkdir(parents=True)
        folder.exp(exp).decision.write_text(json.dumps({"alpha": 0.0125, "stretch": 0,
                                                        "looks": [{"action": a} for a in looks]}))
    folder.exp(2).path.mkdir(parents=True)
    rows = [Row(0, "train", "baseline", score=100.0), Row(0, "train", "baseline", score=110.0),
            Row(2, "train", "keep", score=150.0), Row(1, "train", "discard", score=130.0)]
    assert best_evidence(rows, folder) == (1, 0, 2)
    # The same discard judged in exp 2's stretch (a later round) is charged to it.
    folder.exp(1).decision.write_text(json.dumps({"alpha": 0.004, "stretch": 2,
                                                  "looks": [{"action": "confirm"}, {"action": "discard"}]}))
    assert best_evidence(rows, folder) == (1, 1, 2)
    # Interrupted during its confirmation (a stop, or a Modal call lost): it counts too.
    folder.exp(3).decision.write_text(json.dumps({"alpha": 0.004, "stretch": 2, "looks": [{"action": "confirm"}]}))
    assert best_evidence(rows + [Row(3, "train", "interrupted")], folder) == (1, 2, 2)


def test_a_noisy_start_is_re_measured_while_its_spread_is_what_the_verdicts_weigh(tmp_path):
    """The start's runs spread far wider than a candidate's confirmations: it is trained again with
    the seeds after its baselines' (5, 6, ...) up to twice its baselines, each run joining its
    group; not before another code has a group to compare with, not once anything is kept or
    re-baselined, not after a re-measure failed or was lost three times."""
    folder = RunFolder(tmp_path)
    seeds = [1, 2, 3, 4]
    start = (-494.2, -1147.0, -959.7, -392.7, -700.0, -900.0, -450.0, -1000.0)
    rows = [Row(0, "train", "baseline", score=v) for v in start[:4]]
    for k, v in enumerate(start, 1):
        _eval(folder.exp(0).run(k), v, 5.0)
    assert start_needs_run(rows, folder, seeds, 2) is None               # no other code to compare with
    rows.append(Row(1, "train", "discard", score=-170.0))
    for k, d in enumerate((-9, 4, 12, -3, -4)):
        _eval(folder.exp(1).confirmation(k) if k else folder.exp(1), -170.0 + d, 5.0)
    assert start_needs_run(rows, folder, seeds, 2) == 5
    while (seed := start_needs_run(rows, folder, seeds, 2)) is not None:
        assert seed == len([r for r in rows if r.exp == 0]) + 1
        rows.append(Row(0, "train", "baseline", score=start[seed - 1]))
    assert len([r for r in rows if r.exp == 0]) == START_RUNS_FACTOR * len(seeds) == 8
    noise = night_noise(rows, folder, seeds, 2)
    assert [r.seed for r in noise.groups[0]] == list(range(1, 9)) and noise.groups[0][-1].score == -1000.0
    assert best_evidence(rows, folder)[0] == 8                         # the best is the mean of all 8
    # A start as quiet as its candidates is not re-measured.
    calm = RunFolder(tmp_path / "calm")
    for k, v in enumerate((100.0, 112.0, 95.0, 104.0), 1):
        _eval(calm.exp(0).run(k), v, 1.0)
    for k, v in enumerate((90.0, 101.0, 86.0)):
        _eval(calm.exp(1).confirmation(k) if k else calm.exp(1), v, 1.0)
    assert start_needs_run(rows[:5], calm, seeds, 2) is None
    # What ends it: a keep, a re-baseline, a failed re-measure, three lost ones.
    assert start_needs_run(rows[:5] + [Row(2, "train", "keep", score=-160.0)], folder, seeds, 2) is None
    assert start_needs_run(rows[:5] + [Row(3, "train", "baseline", score=-800.0)], folder, seeds, 2) is None
    assert start_needs_run(rows[:5] + [Row(0, "train", "crash")], folder, seeds, 2) is None
    lost = [Row(0, "train", "interrupted")] * MAX_LOST_START_RUNS
    assert start_needs_run(rows[:5] + lost[:-1], folder, seeds, 2) == 5    # retried, with the same seed
    assert start_needs_run(rows[:5] + lost, folder, seeds, 2) is None
    # interrupted baselines before the first candidate (a resumed start) are not re-measures
    assert start_needs_run(lost + rows[:5], folder, seeds, 2) == 5


def test_a_candidate_the_daemon_died_confirming_has_spent_its_level_after_resume(tmp_path):
    """Its looks were in memory when the daemon died; `--resume` records that it got past its first
    look (state.json said it was confirming), so the rebuilt count spends where the night left off."""
    folder = RunFolder(tmp_path)
    results = ResultsFile(folder.results)
    results.create()
    for row in (Row(0, "train", "baseline", score=100.0), Row(0, "train", "baseline", score=110.0)):
        results.append(row)
    run = Run.__new__(Run)
    run.folder, run.ledger = folder, Ledger(results)
    run._spent_in_confirmation(1, "confirm 2")
    decision = json.loads(folder.exp(1).decision.read_text())
    assert decision["stretch"] == 0 and decision["status"] == "interrupted"
    rows = run.ledger.rows + [Row(1, "train", "interrupted")]
    assert best_evidence(rows, folder) == (2, 1, 0)
    # a decision the loop wrote before it died is left as it is
    folder.exp(2).path.mkdir(parents=True)
    folder.exp(2).decision.write_text(json.dumps({"alpha": 0.004, "stretch": 0, "looks": [{"action": "discard"}]}))
    run._spent_in_confirmation(2, "confirm 1")
    assert json.loads(folder.exp(2).decision.read_text())["looks"] == [{"action": "discard"}]
