"""The noise rule (confirmation by a second seed), agent failures with backoff, the cost cap,
and the small pieces: results.tsv torn lines, the scrubbed environment, tags, --until, schedules."""
from __future__ import annotations

import json
import math
from argparse import Namespace
from datetime import datetime

import pandas as pd
import pytest

from orchestrator import artifacts, processes
from orchestrator.agents.base import AgentError
from orchestrator.agents.replay import ReplayAgent
from orchestrator.config import FIRST_CONFIRM_SEED, Limits, Options, RunError, check_tag, default_tag, parse_until
from orchestrator.keep_rule import MAX_RUNS, first_confirmation_seed
from orchestrator.setup import start
from orchestrator.phases import parse_schedule
from orchestrator.results import HEADER, ResultsFile, Row
from tests.conftest import read_results, run_daemon, tiny_train_py, write_replay


def seed_dependent(bias_by_seed: dict[int, float]) -> str:
    """A train.py whose policy depends on AUTORL_SEED: a noisy learner with a known outcome."""
    return tiny_train_py().replace(
        "Controller(bias)", f"Controller({bias_by_seed!r}[int(os.environ['AUTORL_SEED'])])")


def confirmations(exp: int, bias: float) -> dict[int, float]:
    """About `bias` on every confirmation seed of experiment `exp` (keep_rule.first_confirmation_seed):
    each seed's policy its own (1e-6 apart: the same play, another artifact), as a train.py that
    seeds from AUTORL_SEED exports (the keep rule counts runs that export the same policy as one)."""
    first = first_confirmation_seed(FIRST_CONFIRM_SEED, exp)
    return {first + k: bias + 1e-6 * (k + 1) for k in range(MAX_RUNS - 1)}


class FlakyAgent:
    """A replay agent whose first turn fails after spending money (an API outage mid-turn)."""

    name = "flaky-replay"

    def __init__(self, replay: ReplayAgent):
        self.replay = replay
        self.calls = 0

    def propose(self, ctx):
        self.calls += 1
        if self.calls == 1:
            error = AgentError("overloaded (529)")
            error.cost_usd = 0.25
            raise error
        return self.replay.propose(ctx)

    def tell(self, ctx, outcome):
        self.replay.tell(ctx, outcome)


@pytest.mark.long
@pytest.mark.slow
def test_confirmation_agent_failure_and_cost_cap(autorl_repo, tmp_path, restore_signals, capsys):
    # Baseline: seed 1 scores ~143, seed 2 ~168: best is their mean (~155); one pair: sigma ~18.
    repo = autorl_repo(seed_dependent({1: 1.0, 2: 0.8}))
    replay = write_replay(tmp_path / "replay", {
        # ~186 with seed 1: a win inside the noise; seed 2 gives ~110, so the mean is below the best:
        # discarded after one confirmation (and the pair 186/110 raises sigma to ~40 over 2 pairs).
        1: {"candidate/train.py": seed_dependent({1: 0.7, **confirmations(1, 1.5)}), "DESCRIPTION": "lucky seed",
            "COST_USD": "0.5"},
        # 500 with every seed: above the best but inside the noise of 2 pairs at the second
        # candidate's level, so confirmed run by run until the mean clears
        # best + t(1 - alpha_2 s_n, df) * sigma * sqrt(1/n + 1/2) (the best is the mean of 2 runs).
        2: {"candidate/train.py": seed_dependent({1: 0.0, **confirmations(2, 0.0)}), "DESCRIPTION": "real gain",
            "COST_USD": "0.5"},
        3: {"candidate/train.py": seed_dependent({1: 0.0, 2: 0.0}), "DESCRIPTION": "never run"},
    })
    agents = []

    def factory(args, run_dir):
        agents.append(FlakyAgent(ReplayAgent(args.replay_dir)))
        return agents[-1]

    options = Options(env_id="CartPole-v1", tag="noisy", agent="replay", budget_s=2, grace_s=5, export_margin_s=30,
                      rescore_seeds=0, eval_episodes=10,
                      eval_workers=1, baselines=2, limits=Limits(max_cost=1.0, backoff_base_s=0.1), repo=repo,
                      agent_args=Namespace(replay_dir=replay))
    assert start(options, factory, environ={}) == 0

    rows = read_results(repo, "noisy")
    assert rows["status"].tolist() == ["baseline", "baseline", "discard", "keep"]
    base1, base2 = rows["score"][:2]
    assert base2 - base1 > 15
    assert rows["best"][1] == pytest.approx((base1 + base2) / 2, abs=1e-3)
    lucky, real = rows.iloc[2], rows.iloc[3]
    assert "not confirmed over 2 seeds" in lucky["description"] and lucky["score"] < rows["best"][1]
    run_dir = repo / "results" / "noisy"
    # The evidence: every same-code pair of the night so far, sigma, thresholds, each look's decision.
    lucky_decision = json.loads((run_dir / "exp-0001" / "decision.json").read_text())
    assert lucky_decision["status"] == "discard"
    assert [look["action"] for look in lucky_decision["looks"]] == ["confirm", "discard"]
    # each look weighs the night's noise (without the candidate's runs: 1 df from the baselines) and,
    # once it has two runs, the candidate's own spread: here larger than the night's
    assert [look["noise"]["df"] for look in lucky_decision["looks"]] == [1, 1]
    lucky_pair = [run["score"] for run in lucky_decision["looks"][-1]["runs"]]
    assert lucky_decision["looks"][-1]["candidate_sd"] == pytest.approx(abs(lucky_pair[0] - lucky_pair[1]) / math.sqrt(2))
    decision = json.loads((run_dir / "exp-0002" / "decision.json").read_text())
    looks = decision["looks"]
    assert decision["status"] == "keep" and looks[-1]["action"] == "keep"
    assert all(look["action"] == "confirm" for look in looks[:-1]) and len(looks) >= 2
    n = len(looks)  # runs it took; the night's estimate it is judged against holds the lucky pair too
    assert [look["noise"]["df"] for look in looks] == [2] * n
    assert f"confirmed over {n} seeds" in real["description"]
    assert real["score"] == 500.0 and real["best"] == real["score"]
    assert (run_dir / "exp-0002" / "confirm" / "train.log").exists()
    assert [p.name for p in sorted((run_dir / "exp-0002").glob("confirm*"))] == \
        ["confirm"] + [f"confirm-{k}" for k in range(2, n)]
    groups = looks[-1]["noise"]["groups"]
    assert [[run["label"] for run in group] for group in groups] == [
        ["exp 0 run 1", "exp 0 run 2"], ["exp 1", "exp 1 confirm 1"]]
    assert looks[-1]["candidate_sd"] == pytest.approx(looks[-1]["noise"]["sigma"])  # 500 every time: the night's
    assert [run["seed"] for run in looks[-1]["runs"]] == [1] + [FIRST_CONFIRM_SEED + 4 + k for k in range(n - 1)]
    assert [run["score"] for run in looks[-1]["runs"]] == [500.0] * n
    assert decision["best"] == pytest.approx(rows["best"][1], abs=1e-3)
    lucky_runs = lucky_decision["looks"][-1]["runs"]
    assert looks[0]["noise"]["sigma"] == pytest.approx(
        math.sqrt(((base2 - base1) ** 2 / 2 + (lucky_runs[0]["score"] - lucky_runs[1]["score"]) ** 2 / 2) / 2),
        rel=1e-3)
    # The rule's thresholds, as the evidence states them: the keep cleared the last look's.
    assert 500.0 > looks[-1]["threshold"] and 500.0 <= looks[-2]["threshold"]
    # The failed turn's cost is charged to the experiment that followed; the cap ended the night.
    assert rows["cost_usd"].tolist() == [0.0, 0.0, 0.75, 0.5]
    assert agents[0].calls == 3
    log_text = (run_dir / "daemon.log").read_text()
    assert "the agent failed (AgentError: overloaded (529)); retrying" in log_text
    assert "--max-cost reached ($1.25 of $1.00)" in log_text
    assert not (run_dir / "exp-0003").exists()

    # An existing tag is refused without --resume.
    with pytest.raises(RunError, match="--resume"):
        start(options, factory, environ={})


def test_a_night_starts_with_four_baselines_by_default(autorl_repo, tmp_path, restore_signals):
    """Without --baselines a run trains the start 4 times (seeds 1-4): with 2, a 5%-per-night keep
    rule could not confirm a 3-sigma gain on a bimodal problem (bench/nights.py, README)."""
    repo = autorl_repo(seed_dependent({1: 1.0, 2: 0.8, 3: 0.9, 4: 0.7}))
    options = Options(env_id="CartPole-v1", tag="four", agent="replay", budget_s=2, grace_s=5, export_margin_s=30,
                      rescore_seeds=0, eval_episodes=10,
                      eval_workers=1, limits=Limits(max_experiments=0), repo=repo,
                      agent_args=Namespace(replay_dir=write_replay(tmp_path / "replay", {})))
    assert start(options, lambda args, run_dir: ReplayAgent(args.replay_dir), environ={}) == 0
    rows = read_results(repo, "four")
    assert rows["status"].tolist() == ["baseline"] * 4
    assert [d.split(" [")[0] for d in rows["description"]] == [f"baseline seed {k}" for k in range(1, 5)]
    assert rows["best"][3] == pytest.approx(rows["score"].mean(), abs=1e-3)


def test_more_baselines_make_the_best_a_mean_of_more_runs(autorl_repo, tmp_path, restore_signals):
    """--baselines 3: three runs of the start (seeds 1, 2, 3) before any experiment; the best is
    their mean, the keep rule counts three runs behind it, and a resume cannot change the count."""
    repo = autorl_repo(seed_dependent({1: 1.0, 2: 0.8, 3: 0.9}))
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": seed_dependent({1: 0.0, **confirmations(1, 0.0)}), "DESCRIPTION": "balanced"}})
    options = Options(env_id="CartPole-v1", tag="three", agent="replay", budget_s=2, grace_s=5, export_margin_s=30,
                      rescore_seeds=0, eval_episodes=10,
                      eval_workers=1, limits=Limits(max_experiments=1), repo=repo, baselines=3,
                      agent_args=Namespace(replay_dir=replay))
    assert start(options, lambda args, run_dir: ReplayAgent(args.replay_dir), environ={}) == 0
    rows = read_results(repo, "three")
    assert rows["status"].tolist() == ["baseline", "baseline", "baseline", "keep"]
    assert [d.split(" [")[0] for d in rows["description"][:3]] == ["baseline seed 1", "baseline seed 2", "baseline seed 3"]
    assert rows["best"][2] == pytest.approx(rows["score"][:3].mean(), abs=1e-3)
    decision = json.loads((repo / "results" / "three" / "exp-0001" / "decision.json").read_text())
    assert decision["best_runs"] == 3 and decision["entered_since_keep"] == 0
    assert decision["looks"][0]["noise"]["groups"][0] and len(decision["looks"][0]["noise"]["groups"][0]) == 3
    with pytest.raises(RunError, match="--baselines 3"):
        start(Options(**{**options.__dict__, "resume": True, "baselines": 2}), lambda *a: None, environ={})


@pytest.mark.long
@pytest.mark.slow
def test_a_noisy_start_is_trained_again_before_the_next_candidate(autorl_repo, tmp_path, restore_signals):
    """A start whose seeds alternate between a balanced and a falling pole (returns ~500 and ~9)
    among a candidate that balances on every seed: once the candidate's confirmations show how much
    wider the start spreads, the start is trained again with seeds 5-8 (exp 0 rows), the best
    becomes the mean of its 8 runs, and the next candidate is judged against all 8."""
    alternating = {seed: (0.0 if seed % 2 == 0 else 5.0) for seed in range(1, 9)}
    repo = autorl_repo(seed_dependent(alternating))
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": tiny_train_py(BIAS=0.0).replace(   # each seed its own policy (same play)
            "Controller(bias)", "Controller(BIAS + 1e-9 * int(os.environ['AUTORL_SEED']))"), "DESCRIPTION": "balanced"},
        2: {"candidate/train.py": tiny_train_py(BIAS=5.0), "DESCRIPTION": "falls"}})
    options = Options(env_id="CartPole-v1", tag="noisy", agent="replay", budget_s=2, grace_s=5, export_margin_s=30,
                      rescore_seeds=0, eval_episodes=10,
                      eval_workers=1, limits=Limits(max_experiments=2), repo=repo,
                      agent_args=Namespace(replay_dir=replay))
    assert start(options, lambda args, run_dir: ReplayAgent(args.replay_dir), environ={}) == 0
    rows = read_results(repo, "noisy")
    assert rows["exp"].tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0, 2]
    assert rows["status"].tolist()[:5] == ["baseline"] * 4 + ["discard"]      # runs that agree, against a start over 490
    remeasured = rows[5:9]
    assert remeasured["status"].tolist() == ["baseline"] * 4
    assert [d.split(":")[0] for d in remeasured["description"]] == [f"baseline seed {s}" for s in (5, 6, 7, 8)]
    start_scores = pd.concat([rows["score"][:4], remeasured["score"]]).tolist()
    assert max(start_scores[1::2]) > 400 > 50 > max(start_scores[0::2])       # the seeds really alternate
    assert rows["best"][8] == pytest.approx(sum(start_scores) / 8, abs=1e-3)
    run_dir = repo / "results" / "noisy"
    assert (run_dir / "exp-0000" / "run-8" / "eval.json").exists()
    decision = json.loads((run_dir / "exp-0002" / "decision.json").read_text())
    assert decision["best_runs"] == 8 and decision["best"] == pytest.approx(rows["best"][8], abs=1e-3)
    assert [r["seed"] for r in decision["looks"][0]["noise"]["groups"][0]] == list(range(1, 9))


def test_results_file_tolerates_a_torn_last_line(tmp_path):
    results = ResultsFile(tmp_path / "results.tsv")
    results.create()
    results.append(Row(exp=0, phase="train", status="baseline", commit="abc1234", score=10.5, best=10.5,
                       description="tab\tand\nnewline"))
    with open(results.path, "a") as handle:
        handle.write("1\t2026-11-21T00:00:00Z\ttrain\tdef5678\tke")  # power cut mid-row
    assert [r.exp for r in results.read()] == [0]
    assert results.read()[0].description == "tab and newline"
    assert len(pd.read_csv(results.path, sep="\t")) == 2  # pandas still reads it
    assert results.repair_torn_tail().startswith("1\t")
    results.append(Row(exp=1, phase="train", status="crash", commit="def5678", best=10.5))
    frame = pd.read_csv(results.path, sep="\t")
    assert results.path.read_text().startswith(HEADER)
    assert frame["status"].tolist() == ["baseline", "crash"] and frame["score"].isna().tolist() == [False, True]
    with pytest.raises(ValueError, match="unknown status"):
        Row(exp=1, phase="train", status="great")


def test_scrubbed_env_drops_secrets_by_name_and_by_value(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-123456789")
    monkeypatch.setenv("HARMLESS_NAME", "prefix-tok-123456789")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("DB_PASSWORD", "hunter22hunter")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    env = processes.scrubbed_env({"AUTORL_SEED": "3"})
    for name in ("MY_SERVICE_TOKEN", "HARMLESS_NAME", "ANTHROPIC_BASE_URL", "DB_PASSWORD"):
        assert name not in env
    assert env["OMP_NUM_THREADS"] == "1" and env["AUTORL_SEED"] == "3" and "PATH" in env


def test_parse_summary_reads_the_tail_after_the_last_separator():
    log = "---\nenv_steps: 1\nnoise\n---\nenv_steps: 12345\nsps: 4100\nepisode_return: 231.5\nenv_id: Foo-v1\n"
    assert artifacts.parse_summary(log) == {"env_steps": 12345, "sps": 4100, "episode_return": 231.5,
                                         "env_id": "Foo-v1"}
    assert artifacts.parse_summary("no summary\n") == {}


def test_tags_until_and_schedules():
    assert default_tag("BipedalWalker-v3", datetime(2026, 11, 21)) == "bipedalwalker_v3-nov21"
    assert default_tag("envs.connect_four.env:Env", datetime(2026, 11, 22)) == "connect_four-nov22"
    assert check_tag("my-run_2.a") == "my-run_2.a"
    for bad in ("a/b", "-x", "a..b", "x.lock", "a b"):
        with pytest.raises(RunError):
            check_tag(bad)
    evening = datetime(2026, 11, 21, 22, 0)
    assert parse_until("07:00", evening) == datetime(2026, 11, 22, 7, 0).timestamp()
    assert parse_until("23:30", evening) == datetime(2026, 11, 21, 23, 30).timestamp()
    for bad in ("25:00", "7", "07:60"):
        with pytest.raises(RunError, match="HH:MM"):
            parse_until(bad, evening)
    assert parse_schedule(None, None) == ["train"]
    assert parse_schedule("train", "train:2") == ["train", "train"]
    with pytest.raises(ValueError, match="bogus"):
        parse_schedule("bogus", None)
    with pytest.raises(ValueError, match="PHASE:COUNT"):
        parse_schedule(None, "train:x")


def test_cli_dispatch_and_argument_errors(autorl_repo):
    repo = autorl_repo(tiny_train_py())
    verify = run_daemon(repo, "verify", "--help", timeout=120)
    assert verify.returncode == 0 and "--backend" in verify.stdout
    assert run_daemon(repo, "status", timeout=60).stdout.startswith("no runs under")
    no_env = run_daemon(repo, "run", timeout=60)
    assert no_env.returncode == 1 and "--env ENV_ID is required" in no_env.stderr
    nothing = run_daemon(repo, "run", "--env", "CartPole-v1", "--resume", timeout=60)
    assert nothing.returncode == 1 and "no run to resume" in nothing.stderr
    assert len(nothing.stderr.strip().splitlines()) == 1, nothing.stderr  # one line: a first mistake
    bad_budget = run_daemon(repo, "run", "--env", "CartPole-v1", "--budget", "-3", timeout=60)
    assert bad_budget.returncode == 2 and "must be positive" in bad_budget.stderr


def test_stop_reasons_between_experiments(autorl_repo):
    import time

    from orchestrator.daemon import StopControl
    from orchestrator.config import RunConfig
    from orchestrator.inflight import InFlight
    from orchestrator.loop import Run
    from orchestrator.results import RunFolder
    from orchestrator.runners import RunnerSettings
    from orchestrator.runners.local import LocalRunner
    from orchestrator.workspace import Workspace

    repo = autorl_repo(tiny_train_py(), files={".gitignore": "__pycache__/\n"})
    workspace = Workspace(repo, "limits")
    base = workspace.create()
    run_dir = repo / "results" / "limits"
    run_dir.mkdir(parents=True)
    ResultsFile(run_dir / "results.tsv").create()
    config = RunConfig(tag="limits", env_id="CartPole-v1", budget_s=60, grace_s=5, eval_episodes=5, eval_seed=1,
                       train_seeds=[1, 2], confirm_seed=2, eval_timeout_s=60, eval_workers=1, schedule=["train"],
                       main_root=str(repo), worktree=str(workspace.path), branch=workspace.branch,
                       base_commit=base, harness_sha256="-", created="-", agent="replay")
    stop, journal = StopControl(run_dir), InFlight(run_dir)
    # a local runner: the daemon's own machine is billed nothing, so the rows' costs are the limits' whole story
    runner = LocalRunner(RunnerSettings(config, RunFolder(run_dir)), workspace, stop.requested, journal, b"")
    run = Run(config, RunFolder(run_dir), workspace, Limits(max_experiments=2, deadline=time.time() + 30,
                                                            max_cost=2.0),
              stop, runner=runner, journal=journal, agent=None, harness_bytes=b"")
    assert run.stop_reason() == "the deadline leaves no time for another experiment"  # 60 s do not fit
    run.limits.deadline = time.time() + 3600
    assert run.stop_reason() is None
    run.append(Row(exp=1, phase="train", status="crash", cost_usd=1.0))
    assert run.stop_reason() is None and run.ledger.next_exp() == 2
    run.append(Row(exp=2, phase="train", status="crash", cost_usd=1.5))
    assert run.stop_reason() == "--max-experiments 2 reached"
    run.limits.max_experiments = None
    assert run.stop_reason() == "--max-cost reached ($2.50 of $2.00)"
    run.limits.max_cost = None
    (run_dir / "STOP").write_text("")
    assert run.stop_reason() == "stopped (stop request)"
    runner.close()
    # The user's checkout stays clean although its .gitignore does not mention runs/ or results/.
    assert workspace.main.git.status("--porcelain") == ""
