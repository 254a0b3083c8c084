"""bench/gpu_table.py: the GPU table's script, run for real at --quick sizes on the CPU so that it cannot
rot between GPU runs; the lock that keeps background verifications off the GPU while a figure is timed."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from bench import gpu_table, gpu_table_report
from bench.gpu_locking import GpuLock, Pausable

REPO = Path(__file__).resolve().parent.parent
SCRIPT = ["-m", "bench.gpu_table"]  # as the README runs it: from the repository root


@pytest.mark.slow
def test_quick_table_measures_every_part_and_prints_each_figure(tmp_path):
    proc = subprocess.run([sys.executable, *SCRIPT, str(tmp_path), "--quick"], cwd=REPO, capture_output=True, text=True,
                          timeout=480)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = json.loads((tmp_path / "gpu_table.json").read_text())
    assert table["finished"]
    assert {(r["env_id"], r["num_envs"]) for r in table["raw"]} == {
        (e, n) for e in ("CartPole-v1", "Pendulum-v1") for n in (4, 16)}
    for row in table["raw"]:
        assert row["sps"] > 0 and row["compile_wall_s"] > 0 and row["device"] == "cpu", row
    trained = {r["env_id"]: r for r in table["training"]}
    assert set(trained) == {"CartPole-v1", "Pendulum-v1"}
    for row in trained.values():
        assert row["path"] == "jax-e2e" and row["env_steps"] > 0 and row["eval_episodes"] == 5, row
    assert trained["CartPole-v1"]["verdict"] == "verified here"
    assert trained["Pendulum-v1"]["verdict"] == "carried from CPU"
    assert trained["Pendulum-v1"]["constants"] == {"JAX_NUM_ENVS": "64"}
    levels = {(r["env_id"], r["level"]): r["result"] for r in table["verification"]}
    assert levels == {(e, f"L{k}"): "pass" for e in ("CartPole-v1", "Pendulum-v1") for k in (1, 2, 3)}
    assert [t["status"] for t in table["targets"]] == ["pending"] * 3  # nothing of the GPU's targets at --quick
    # each figure is its own line as it comes, with the time it came at
    figure_lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(figure_lines) >= len(table["raw"]) + len(table["training"]) + len(table["verification"])
    assert any("raw CartPole-v1 cartpole_v1.py @16:" in line and "steps/s" in line for line in figure_lines)
    markdown = (tmp_path / "gpu_table.md").read_text()
    assert "| CartPole-v1 | cartpole_v1.py | 16 |" in markdown and "finished" in markdown.splitlines()[-1]


def test_a_run_cut_short_leaves_the_figures_it_had(tmp_path):
    proc = subprocess.Popen([sys.executable, *SCRIPT, str(tmp_path), "--quick", "--parts", "raw"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first = ""
        deadline = time.time() + 240
        while time.time() < deadline and not first.startswith("["):
            first = proc.stdout.readline()
        assert first.startswith("["), "no figure within 240 s"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    table = json.loads((tmp_path / "gpu_table.json").read_text())
    assert not table["finished"]
    assert table["raw"] and "sps" in table["raw"][0]
    assert "cut short" in (tmp_path / "gpu_table.md").read_text()


def test_background_process_is_stopped_while_the_gpu_is_timed(tmp_path):
    ticks = tmp_path / "ticks"
    writer = subprocess.Popen([sys.executable, "-c", "import time,sys\nf=open(sys.argv[1],'a')\nwhile True:\n"
                               " f.write(f'{time.time()}\\n'); f.flush(); time.sleep(0.005)", str(ticks)],
                              start_new_session=True)
    pauser = Pausable(tmp_path / "gpu.lock")
    try:
        pauser.add(writer)
        time.sleep(0.3)
        with GpuLock(tmp_path / "gpu.lock"):
            held_from = time.time()
            time.sleep(0.8)
            held_to = time.time()
        time.sleep(0.3)
        paused = pauser.paused_between(writer, held_from - 0.1, held_to + 0.2)
    finally:
        pauser.remove(writer)
        pauser.close()
        writer.kill()
        writer.wait()
    stamps = [float(line) for line in ticks.read_text().split()]
    assert not [t for t in stamps if held_from + 0.15 < t < held_to], "it ran while the lock was held"
    assert any(t > held_to for t in stamps), "it was not continued after the lock was released"
    assert 0.6 < paused < 1.0


def test_full_plan_is_the_issues_table():
    plan = gpu_table.make_plan(quick=False)
    raw = {(r.env_id, Path(r.spec).name, r.num_envs) for r in plan.raw}
    assert raw == {(e, s, n) for e, s in [("BipedalWalker-v3", "bipedalwalker_v3.py"), ("HalfCheetah-v5", "mjx"),
                                          ("Hopper-v5", "mjx"), ("CartPole-v1", "cartpole_v1.py"),
                                          ("Pendulum-v1", "pendulum_v1.py")] for n in (1024, 4096, 16384)}
    assert [(t.env_id, t.budget) for t in plan.trainings] == [("BipedalWalker-v3", 120.0), ("CartPole-v1", 20.0),
                                                              ("Pendulum-v1", 20.0)]
    assert plan.episodes == 100
    timed = [v for v in plan.verifications if not v.feeds_training]
    assert [(v.env_id, Path(v.spec).name) for v in timed] == [("BipedalWalker-v3", "bipedalwalker_v3.py")]


def test_targets_are_judged_against_the_figures():
    data = {"raw": [{"env_id": "BipedalWalker-v3", "sps": 400_000}, {"env_id": "BipedalWalker-v3", "sps": 1_300_000},
                    {"env_id": "HalfCheetah-v5", "error": "exit 1"}],
            "training": [{"env_id": "BipedalWalker-v3", "env_steps": 40 * gpu_table_report.HOST_120S["env_steps"]}]}
    found = gpu_table_report.targets(data)
    assert [t["status"] for t in found] == ["met", "met", "pending"]
    assert found[0]["figure"] == 1_300_000 and found[1]["figure"] == pytest.approx(40.0)
    data["training"][0]["env_steps"] = 10 * gpu_table_report.HOST_120S["env_steps"]
    assert gpu_table_report.targets(data)[1]["status"] == "missed"


def test_every_wheel_to_carry_is_pinned_to_an_installed_version():
    for name in gpu_table.WHEELS:
        assert metadata.version(name), name  # raises PackageNotFoundError for a name pip could not pin
