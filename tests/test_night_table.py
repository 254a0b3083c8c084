"""The night benchmark's reading of a night: the full budgets spent until its final best was kept,
and the drawn-detune target counted from it (orchestrator/benchmark: nights.py, night_table.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from orchestrator.benchmark.night_table import TARGET_BUDGETS, NightRow, paired_curves, summarize
from orchestrator.benchmark.nights import budgets_to_best, full_budget_equivalents, kept_changes


def _night(run_dir: Path, runs: dict[int, list[str]]) -> None:
    """exp number -> the folders of its runs, each leaving a train.log as the runner does."""
    for exp, folders in runs.items():
        for folder in folders:
            log = run_dir / f"exp-{exp:04d}" / folder / "train.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("env_steps: 1\n")


def test_budgets_to_best_counts_every_run_until_the_last_keep(tmp_path):
    # 4 baselines; exp 1 discarded on its first run; exp 2 kept after 2 confirmations; exp 3
    # screened at a quarter and stopped; exp 4 confirmed once and discarded.
    _night(tmp_path, {0: [".", "run-2", "run-3", "run-4"], 1: ["."], 2: [".", "confirm", "confirm-2"],
                      3: ["screen"], 4: [".", "confirm"]})
    rows = pd.DataFrame({"exp": [0, 0, 0, 0, 1, 2, 3, 4], "phase": ["train"] * 8,
                         "status": ["baseline"] * 4 + ["discard", "keep", "screened", "discard"]})
    assert full_budget_equivalents(tmp_path, 0.25) == 4 + 1 + 3 + 0.25 + 2
    assert budgets_to_best(tmp_path, rows, 0.25) == 4 + 1 + 3
    # nothing kept: the best is the start, paid for by the baselines
    assert budgets_to_best(tmp_path, rows.assign(status=["baseline"] * 4 + ["discard"] * 4), 0.25) == 4


def test_a_nights_keeps_are_recorded_with_their_change_and_score():
    # the clone goes at the night's end: the row is the only record of what was kept
    rows = pd.DataFrame({"exp": [0, 1, 2, 3, 4], "phase": ["train"] * 4 + ["translate"],
                         "status": ["baseline", "keep", "discard", "keep", "keep"],
                         "score": [-80.0, 240.4, -91.9, 260.0, 250.0],
                         "description": ["baseline seed 1",
                                         "optuna trial 1: UPDATE_EPOCHS 480->30 [confirmed over 2 seeds: 270.0, 274.9]",
                                         "optuna trial 2: GAMMA 0.99->0.95 [not above best 240.4]",
                                         "optuna trial 3: NUM_ENVS 32->64", "port: Rust backend"]})
    assert kept_changes(rows) == [{"exp": 1, "score": 240.4, "change": "optuna trial 1: UPDATE_EPOCHS 480->30"},
                                  {"exp": 3, "score": 260.0, "change": "optuna trial 3: NUM_ENVS 32->64"}]
    assert kept_changes(rows.assign(status=["baseline"] + ["discard"] * 4)) == []


def _row(recovered: float, budgets_to_best: float | None, searcher: str = "optuna") -> NightRow:
    return NightRow("drawn-pendulum-1", searcher, None, 1, [-900.0], [-200.0], 700.0, 0.01, True, 1, 0, 16, False,
                    26.0, 400.0, recovered, {"env_id": "Pendulum-v1"}, code="abc1234", budgets_to_best=budgets_to_best)


def test_the_target_counts_nights_that_recovered_80_percent_within_16_budgets():
    rows = [_row(0.95, 12.0), _row(0.9, TARGET_BUDGETS + 5.0), _row(0.5, 8.0), _row(0.85, None),
            _row(1.0, 9.0, "random")]
    optuna = next(s for s in summarize(rows) if s["problem"] == "drawn (all draws)" and s["searcher"] == "optuna")
    assert optuna["nights_recovering_80pct"] == 3
    # late (21 budgets), short of 80%, or of unknown timing do not count towards the target
    assert optuna[f"nights_recovering_80pct_within_{TARGET_BUDGETS}"] == 1
    assert abs(optuna["gap_recovered_per_budget"] - (0.95 + 0.9 + 0.5 + 0.85) / (4 * 26.0)) < 1e-12
    # at equal spending: what each night had recovered by its 16th budget (late or unknown: nothing yet)
    assert abs(optuna[f"gap_recovered_by_{TARGET_BUDGETS}_budgets"] - (0.95 + 0.5) / 4) < 1e-12
    # the same at every mark of the curve: by 8 budgets nothing yet, by 24 the late night's too
    curve = optuna["gap_recovered_by_budgets"]
    assert curve["8"] == 0.125 and abs(curve["12"] - (0.95 + 0.5) / 4) < 1e-12
    assert abs(curve["24"] - (0.95 + 0.9 + 0.5) / 4) < 1e-12


def test_draws_of_two_envs_are_summed_per_env_and_over_both():
    rows = [_row(1.0, 10.0), _row(0.5, 12.0),
            NightRow("drawn-cartpole-3", "optuna", None, 1, [20.0], [500.0], 480.0, 0.01, True, 1, 0, 16, False,
                     20.0, 300.0, 0.9, {"env_id": "CartPole-v1"}, code="abc1234", budgets_to_best=6.0)]
    by_family = {s["problem"]: s for s in summarize(rows) if s["problem"].startswith("drawn ")}
    assert by_family["drawn Pendulum-v1"]["nights"] == 2 and by_family["drawn CartPole-v1"]["nights"] == 1
    assert by_family["drawn (all draws)"]["nights"] == 3
    assert abs(by_family["drawn CartPole-v1"]["gap_recovered_per_budget"] - 0.9 / 20.0) < 1e-12
    assert abs(by_family["drawn (all draws)"]["gap_recovered_per_budget"] - 2.4 / 72.0) < 1e-12
    # a searcher with nights on one env's draws only has no row for the other env
    rows.append(_row(0.7, 9.0, "random"))
    assert [(s["problem"], s["searcher"]) for s in summarize(rows) if s["problem"].startswith("drawn ")] == [
        ("drawn Pendulum-v1", "optuna"), ("drawn Pendulum-v1", "random"), ("drawn CartPole-v1", "optuna"),
        ("drawn (all draws)", "optuna"), ("drawn (all draws)", "random")]
    rows.pop()
    # one env: no per-env row beside the whole family's
    assert [s["problem"] for s in summarize(rows[:2])] == ["drawn-pendulum-1", "drawn (all draws)"]


def test_a_draw_costs_its_mean_gap_in_sigma_pooled_over_both_groups():
    from orchestrator.benchmark.drawn_detunes import cost_figures

    # two runs a side: each pair's difference / sqrt 2, pooled (the figures of Pendulum's draw 1)
    two = cost_figures([-601.596, -787.211], [-156.521, -243.785])
    assert abs(two["sigma"] - 102.552345) < 1e-5 and abs(two["cost_sigmas"] - 4.8195) < 1e-4
    # four a side: the two groups' squares over 6 degrees of freedom
    four = cost_figures([-80.0, -84.0, -82.0, -78.0], [-83.0, -85.0, -84.0, -80.0])
    squares = (1 + 9 + 1 + 9) + (0 + 4 + 1 + 9)     # about the means -81 and -83
    assert abs(four["sigma"] - (squares / 6) ** 0.5) < 1e-12 and abs(four["cost"] - (-2.0)) < 1e-12


def test_a_discrete_env_is_never_drawn_a_constant_only_continuous_actions_read():
    from orchestrator.benchmark.drawn_detunes import drawable

    continuous = [name for name, _ in drawable("jax-e2e", "Pendulum-v1")]
    discrete = [name for name, _ in drawable("jax-e2e", "Acrobot-v1")]
    assert "INIT_LOG_STD" in continuous and "INIT_LOG_STD" not in discrete
    assert discrete == [name for name in continuous if name != "INIT_LOG_STD"]


def test_a_draw_whose_start_the_daemon_refuses_is_recorded_and_drawn_again(tmp_path, monkeypatch):
    """Pendulum's JAX_LEARNING_RATE 0.002 -> 0.048 once crashed its baseline (the export check):
    the benchmark records that draw as refused and goes on to the next, not down with it."""
    from types import SimpleNamespace

    from orchestrator.benchmark import nights

    checked = []

    def draw_cost(root, problem, timeout_s):
        checked.append(problem.name)
        if len(checked) == 1:
            raise RuntimeError("the detuned start failed (exit 1): train.py failed its baseline run")
        return {"detuned": [-900.0] * 2, "shipped": [-150.0] * 2, "sigma": 10.0, "cost": 750.0, "cost_sigmas": 75.0}

    monkeypatch.setattr(nights, "draw_cost", draw_cost)
    args = SimpleNamespace(drawn=1, envs="Pendulum-v1", draw_seed=0, drawn_budget=10.0, drawn_path="jax-e2e", json=None)
    draws: list[dict] = []
    problems = list(nights.drawn_problems(args, tmp_path, draws, [], {}))
    assert [d["index"] for d in draws] == [0, 1] and len(problems) == 1 and problems[0][1]["index"] == 1
    assert draws[0]["accepted"] is False and "failed its baseline run" in draws[0]["refused"]
    assert draws[1]["accepted"] is True


def test_the_searchers_are_compared_draw_by_draw_at_equal_spending():
    """Per draw, the gap by each mark of the budget curve averaged (the area under it); the agent
    minus random search, paired over the draws both searched, with the draws each one led."""
    def night(problem: str, searcher: str, recovered: float, budgets: float) -> NightRow:
        return NightRow(problem, searcher, None, 1, [-900.0], [-200.0], 700.0, 0.01, True, 1, 0, 16, False,
                        26.0, 400.0, recovered, {"env_id": "Pendulum-v1"}, code="abc1234", budgets_to_best=budgets)
    rows = [night("drawn-pendulum-1", "optuna", 1.0, 7.0), night("drawn-pendulum-1", "random", 1.0, 20.0),
            night("drawn-pendulum-2", "optuna", 0.0, 4.0), night("drawn-pendulum-2", "random", 0.5, 10.0),
            night("drawn-pendulum-3", "optuna", 1.0, 30.0)]            # random never searched it: unpaired
    paired = paired_curves(summarize(rows))
    assert paired["draws"] == 2 and paired["led"] == [1, 1]
    # draw 1: optuna 1.0 at every mark (8..32), random from 24 on: 3/5 ahead; draw 2: random 0.5 from 12 on
    assert abs(paired["mean_difference"] - (3 / 5 - 0.5 * 4 / 5) / 2) < 1e-12
    assert paired["ci95"][0] < paired["mean_difference"] < paired["ci95"][1]
    assert paired_curves(summarize(rows[:1])) is None


BURN = ("import time, sys, pathlib\n"
        "while time.process_time() < 1.0: pass\n"
        "pathlib.Path(sys.argv[1]).write_text('burnt')\n"
        "time.sleep(float(sys.argv[2]))\n")
# the benchmark's own tree: a process that, once told to go (argv[3] exists), runs a burner and waits
# for it, then idles
OWN_TREE = ("import pathlib, subprocess, sys, time\n"
            "while not pathlib.Path(sys.argv[3]).exists(): time.sleep(0.01)\n"
            "subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2], '0'], check=True)\n"
            "time.sleep(60)\n")


def _wait_for(path, seconds: float = 60) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), path


def test_a_nights_conditions_tell_its_own_cpu_from_what_else_ran(tmp_path):
    """A burner of one CPU second in the benchmark's tree (run and reaped by its child) is its own; one
    started outside that tree is another's, whether it ends or not while measured."""
    import subprocess
    import sys

    from orchestrator.benchmark.machine_load import MachineLoad

    own = subprocess.Popen([sys.executable, "-c", OWN_TREE, BURN, str(tmp_path / "own"), str(tmp_path / "go")])
    try:
        load = MachineLoad(root_pid=own.pid)
        (tmp_path / "go").write_text("")   # its burner starts after the first read, whatever the machine's load
        other = subprocess.Popen([sys.executable, "-c", BURN, str(tmp_path / "other"), "60"])
        try:
            _wait_for(tmp_path / "own")
            _wait_for(tmp_path / "other")
            conditions = load.stop()
        finally:
            other.kill()
            other.wait()
    finally:
        own.kill()
        own.wait()
    assert conditions["cpus"] >= 1 and conditions["load1_max"] >= 0 and conditions["busy_cpu_s"] >= 1.8
    assert 0.9 <= conditions["own_cpu_s"] < 1.9      # the burner's second (and its interpreter's start)
    assert conditions["other_cpu_s"] >= 0.9          # the other burner's second, whatever else ran too


# the benchmark's own tree, orphaning: once told to go, it starts a grandchild that waits for its
# parent to end, then burns a CPU second as an orphan (reaped by whatever init reaps orphans)
ORPHANING = ("import pathlib, subprocess, sys, time\n"
             "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.01)\n"
             "subprocess.Popen([sys.executable, '-c', sys.argv[1], str(__import__('os').getpid()), sys.argv[3]])\n"
             "time.sleep(0.5)\n")
ORPHAN = ("import os, pathlib, sys, time\n"
          "while os.getppid() == int(sys.argv[1]): time.sleep(0.01)\n"
          "start = time.process_time()\n"
          "while time.process_time() - start < 1.0: pass\n"
          "pathlib.Path(sys.argv[2]).write_text('burnt')\n")


def test_an_orphans_cpu_stays_the_benchmarks_and_is_taken_from_no_one(tmp_path, monkeypatch):
    """A night's processes outlive their parents: an orphan seen as the benchmark's counts as its
    own, and its end takes nothing back from the other side."""
    import subprocess
    import sys
    import time

    from orchestrator.benchmark import machine_load

    monkeypatch.setattr(machine_load, "SAMPLE_S", 0.1)
    own = subprocess.Popen([sys.executable, "-c", ORPHANING, ORPHAN, str(tmp_path / "go"), str(tmp_path / "own")])
    try:
        load = machine_load.MachineLoad(root_pid=own.pid)
        (tmp_path / "go").write_text("")
        own.wait(timeout=60)
        _wait_for(tmp_path / "own")
        time.sleep(0.5)   # the orphan exits and is reaped
        conditions = load.stop()
    finally:
        own.kill()
    assert 0.9 <= conditions["own_cpu_s"] < 1.9
    assert conditions["other_cpu_s"] > -0.05


def _conditions_over(monkeypatch, tables: list[dict]) -> dict:
    """A recorder (root pid 10) run over scripted /proc tables: the first read, two more, the stop's."""
    from orchestrator.benchmark import machine_load

    tables = iter(tables)
    monkeypatch.setattr(machine_load, "SAMPLE_S", 1e6)   # reads only when asked
    monkeypatch.setattr(machine_load, "_processes", lambda: next(tables))
    load = machine_load.MachineLoad(root_pid=10)
    load._read()
    load._read()
    return load.stop()


def test_a_group_that_dies_at_once_takes_back_no_cpu_its_reaper_never_added(monkeypatch):
    """A killed run's group ends between two reads, parent and child together: the child's reaper is
    then no process that was read, and an init that ignores SIGCHLD adds none of its CPU. Taking the
    child's CPU back from the other side all the same recorded a night's other processes at -30 CPU s;
    what was read of the group stays counted, once, and nothing goes negative."""
    from orchestrator.benchmark import machine_load

    tick = machine_load.os.sysconf("SC_CLK_TCK")
    start = machine_load._boot_ticks_now()
    conditions = _conditions_over(monkeypatch, [
        {1: (0, 1, 500, 0), 10: (1, start - 5, 0, 0)},                                   # the first read
        {1: (0, 1, 500, 0), 10: (1, start - 5, 0, 0), 11: (10, start + 5, 3 * tick, 0)},  # the run burns 3 s
        {1: (0, 1, 500, 0)},                                                            # the group is killed
        {1: (0, 1, 500, 0)},
    ])
    assert conditions["own_cpu_s"] == 3.0 and conditions["other_cpu_s"] == 0.0


def test_draws_only_checks_and_records_the_draws_and_runs_no_night(tmp_path, monkeypatch):
    """`--drawn N --draws-only`: an hour's slot spent on the draws' cost checks, recorded in the JSON
    that a later `--resume` runs the nights of."""
    import json
    import sys

    from orchestrator.benchmark import nights

    def no_night(*args, **kwargs):
        raise AssertionError("a night ran")

    monkeypatch.setattr(nights, "run_night", no_night)
    monkeypatch.setattr(nights, "draw_cost", lambda root, problem, timeout_s: {
        "detuned": [-900.0] * 4, "shipped": [-150.0] * 4, "sigma": 10.0, "cost": 750.0, "cost_sigmas": 75.0})
    out = tmp_path / "nights.json"
    monkeypatch.setattr(sys, "argv", ["nights", "--drawn", "1", "--envs", "Pendulum-v1", "--draws-only",
                                      "--json", str(out)])
    assert nights.main() == 0
    written = json.loads(out.read_text())
    assert written["nights"] == [] and [d["index"] for d in written["draws"]] == [0]
    assert written["draws"][0]["accepted"] is True and written["draws"][0]["path"] == "jax-e2e"


def test_a_failed_night_is_recorded_and_the_benchmark_goes_on(tmp_path, monkeypatch):
    """A night that fails (here the real daemon refusing a wrong env id) costs that night, not the
    hours of nights around it: each is recorded in the JSON with its error and kept folder, and the
    next one runs."""
    import json
    import sys
    import tempfile

    from orchestrator.benchmark import nights

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(nights, "PROBLEMS", {"wrong-env": nights.Problem("wrong-env", "NoSuchEnv-v0", 10)})
    out = tmp_path / "nights.json"
    monkeypatch.setattr(sys, "argv", ["nights", "--problems", "wrong-env", "--searchers", "optuna,random",
                                      "--repeats", "1", "--experiments", "1", "--json", str(out)])
    assert nights.main() == 0
    written = json.loads(out.read_text())
    assert written["nights"] == []
    assert [(f["problem"], f["searcher"]) for f in written["failures"]] == [("wrong-env", "optuna"),
                                                                          ("wrong-env", "random")]
    for failure in written["failures"]:
        assert "the night failed" in failure["error"] and "NoSuchEnv-v0" in failure["error"]
        assert (Path(failure["folder"]) / "checkout" / "candidate" / "train.py").is_file()
    # --resume keeps what failed and runs those nights again (they failed again here: two more)
    monkeypatch.setattr(sys, "argv", ["nights", "--problems", "wrong-env", "--searchers", "optuna",
                                      "--repeats", "1", "--experiments", "1", "--resume", str(out)])
    assert nights.main() == 0
    assert len(json.loads(out.read_text())["failures"]) == 3


def test_an_orphan_whose_parent_ended_in_the_same_read_is_taken_back_from_init(monkeypatch):
    """A run's child outlives its killed parent by less than a read: init reaps it and adds its CPU
    up (this machine's does: 271 CPU s of a night's orphans in one probe). Read as the benchmark's
    while it ran, that CPU is not counted again as another's when init's total grows."""
    from orchestrator.benchmark import machine_load

    tick = machine_load.os.sysconf("SC_CLK_TCK")
    start = machine_load._boot_ticks_now()
    conditions = _conditions_over(monkeypatch, [
        {1: (0, 1, 500, 0), 10: (1, start - 5, 0, 0)},                                      # the first read
        {1: (0, 1, 500, 0), 10: (1, start - 5, 0, 0), 11: (10, start + 5, tick, 0),
         12: (11, start + 6, 3 * tick, 0)},                                                 # a run and its child
        {1: (0, 1, 500, 3 * tick), 10: (1, start - 5, 0, 2 * tick)},   # both end: init reaps the child
        {1: (0, 1, 500, 3 * tick), 10: (1, start - 5, 0, 2 * tick)},
    ])
    # the run: 1 s read and a 1 s tail its reaper (the root) adds; the child: its 3 s, read
    assert conditions["own_cpu_s"] == 5.0 and conditions["other_cpu_s"] == 0.0


def test_a_benchmark_run_gets_no_api_key_and_none_of_our_settings(monkeypatch):
    # a night, a demo run or a search measures the embedded agent: a key in the researcher's shell
    # must not turn it into paid calls, nor an AUTORL_ setting change what it measures
    from orchestrator.benchmark.rescoring import embedded_agent_env

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-real-looking")
    monkeypatch.setenv("AUTORL_TIME_BUDGET", "3")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = embedded_agent_env()
    assert "ANTHROPIC_API_KEY" not in env and not any(k.startswith("AUTORL_") for k in env)
    assert env["PYTHONPATH"] == "" and env["PATH"] == os.environ["PATH"]


def test_a_child_reaped_by_a_parent_that_ends_in_the_same_read_counts_once(monkeypatch):
    """A wrapper reaps its run and exits within one read: the run's CPU reaches the wrapper's own
    reaper (the root) inside the wrapper's reaped total. Taken back from init instead, which added
    none of it, it counted twice (a night's own CPU 3-6% above the machine's busy CPU)."""
    from orchestrator.benchmark import machine_load

    tick = machine_load.os.sysconf("SC_CLK_TCK")
    start = machine_load._boot_ticks_now()
    conditions = _conditions_over(monkeypatch, [
        {1: (0, 1, 500, 0), 10: (1, start - 5, 0, 0)},
        {1: (0, 1, 500, 0), 10: (1, start - 5, 0, 0), 11: (10, start + 5, tick, 0),
         12: (11, start + 6, 3 * tick, 0)},                                   # the wrapper and its run
        {1: (0, 1, 500, 0), 10: (1, start - 5, 0, 6 * tick)},   # the run ends, reaped by the wrapper, which ends
        {1: (0, 1, 500, 0), 10: (1, start - 5, 0, 6 * tick)},
    ])
    # the wrapper: 1 s read and a 1 s tail; the run: 3 s read and a 1 s tail; every second once
    assert conditions["own_cpu_s"] == 6.0 and conditions["other_cpu_s"] == 0.0


# the benchmark's own tree: once told to go, a wrapper runs the burner and exits the moment it is reaped
WRAPPING = ("import pathlib, subprocess, sys, time\n"
            "while not pathlib.Path(sys.argv[3]).exists(): time.sleep(0.01)\n"
            "wrapper = \"import subprocess, sys, os; subprocess.run(sys.argv[1:]); os._exit(0)\"\n"
            "subprocess.run([sys.executable, '-c', wrapper, sys.executable, '-c', sys.argv[1], sys.argv[2], '0'])\n"
            "time.sleep(60)\n")


def test_a_wrapped_runs_cpu_counts_once(tmp_path, monkeypatch):
    """The same with real processes: a burner of one CPU second, run by a wrapper that exits as soon as
    it has reaped it, is the benchmark's one second, not two."""
    import subprocess
    import sys
    import time

    from orchestrator.benchmark import machine_load

    monkeypatch.setattr(machine_load, "SAMPLE_S", 0.25)
    own = subprocess.Popen([sys.executable, "-c", WRAPPING, BURN, str(tmp_path / "own"), str(tmp_path / "go")])
    try:
        load = machine_load.MachineLoad(root_pid=own.pid)
        (tmp_path / "go").write_text("")
        _wait_for(tmp_path / "own")
        time.sleep(1.0)   # the burner and its wrapper end, and the root reaps the wrapper
        conditions = load.stop()
    finally:
        own.kill()
        own.wait()
    assert 0.9 <= conditions["own_cpu_s"] < 1.9   # the burner's second and two interpreters' starts
