"""--parallel K: K candidates per round from the same best commit, trained at once, judged
together; and kill -9 mid-round + --resume records every candidate of the round interrupted."""
from __future__ import annotations

import json
import os
import signal
import time

import git
import pytest

from tests.conftest import FAST, all_dead, processes_of, read_results, run_daemon, start_daemon, tiny_train_py, write_replay

TAG = "wide"

TIMED = """
_out = Path(os.environ["AUTORL_OUTPUT_DIR"])
_out.mkdir(parents=True, exist_ok=True)
_started = time.time()
time.sleep(2.0)
print("TIMES " + json.dumps([_started, time.time()]), flush=True)
"""

HANG = """
import subprocess
_child = subprocess.Popen(["sleep", "600"])
Path(os.environ["AUTORL_OUTPUT_DIR"]).mkdir(parents=True, exist_ok=True)
(Path(os.environ["AUTORL_OUTPUT_DIR"]) / "pids").write_text(f"{os.getpid()} {_child.pid}")
time.sleep(600)
"""


def timed(bias: float) -> str:
    return tiny_train_py(BIAS=bias).replace("out = Path(", "import json\n" + TIMED + "\nout = Path(", 1)


def hanging(bias: float) -> str:
    return tiny_train_py(BIAS=bias).replace("out = Path(", HANG + "\nout = Path(", 1)


@pytest.mark.long
@pytest.mark.slow
def test_two_candidates_per_round_train_together_and_the_better_is_kept(autorl_repo, tmp_path):
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": timed(0.5), "DESCRIPTION": "less bias"},      # ~260
        2: {"candidate/train.py": timed(0.0), "DESCRIPTION": "no bias"},        # 500
        3: {"candidate/train.py": timed(5.0), "DESCRIPTION": "always left"},    # ~9
        4: {"candidate/train.py": timed(1.0), "DESCRIPTION": "back to 1.0"},    # ~145, below 500
    })
    result = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", TAG, "--agent", "replay", "--replay-dir",
                        str(replay), "--budget", "5", "--parallel", "2", *FAST, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr

    rows = read_results(repo, TAG)
    assert rows["exp"].tolist() == [0, 0, 2, 1, 3, 4]  # a round's keep is written first
    by_exp = rows.set_index("exp")
    assert [by_exp.loc[e, "status"] for e in (1, 2, 3, 4)] == ["discard", "keep", "discard", "discard"]
    assert by_exp.loc[2, "score"] == 500.0 and 100 < by_exp.loc[1, "score"] < 400
    assert "exp 2 of the same round was kept" in by_exp.loc[1, "description"]
    assert rows["best"].iloc[-1] == 500.0

    # The keep rule's levels: exp 1, discarded for its round's keep, was never judged; exp 4, below
    # the best on its first run, was discarded free of charge, so exp 3 is judged at the full level.
    run_dir = repo / "results" / TAG
    decisions = {e: json.loads((run_dir / f"exp-{e:04d}" / "decision.json").read_text()) for e in (1, 2, 3, 4)}
    assert "alpha" not in decisions[1] and decisions[2]["entered_since_keep"] == 0
    assert [decisions[e]["entered_since_keep"] for e in (4, 3)] == [0, 0]
    assert decisions[3]["alpha"] == decisions[2]["alpha"] == pytest.approx(0.0125)

    # The two candidates of each round trained at the same time.
    spans = {e: json.loads(next(line[6:] for line in (run_dir / f"exp-{e:04d}" / "train.log").read_text().splitlines()
                                 if line.startswith("TIMES "))) for e in (1, 2, 3, 4)}
    for a, b in ((1, 2), (3, 4)):
        assert spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1], f"exps {a} and {b} did not overlap: {spans}"

    # Both candidates of a round start from the same best commit; tip = best; refs for the rest.
    main = git.Repo(repo)
    tip = main.commit(f"autorl/{TAG}")
    assert tip.hexsha.startswith(by_exp.loc[2, "commit"]) and tip.message.strip() == "no bias"
    parents = {e: main.commit(by_exp.loc[e, "commit"]).parents[0].hexsha for e in (1, 2, 3, 4)}
    assert parents[1] == parents[2] == main.commit("main").hexsha
    assert parents[3] == parents[4] == tip.hexsha
    refs = {r.path for r in main.refs if r.path.startswith(f"refs/autorl/{TAG}/")}
    assert refs == {f"refs/autorl/{TAG}/exp-{e:04d}" for e in (1, 3, 4)}
    assert json.loads((run_dir / "run.json").read_text())["parallel"] == 2


def wait_for_round(run_dir, exps, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        state = json.loads((run_dir / "state.json").read_text()) if (run_dir / "state.json").exists() else {}
        stages = {r["exp"]: r.get("stage") for r in state.get("in_flight") or []}
        pids = [run_dir / f"exp-{e:04d}" / "out" / "pids" for e in exps]
        if all(stages.get(e) == "train" for e in exps) and all(p.exists() for p in pids):
            return [proc for p in pids for proc in processes_of(p.parent)]
        time.sleep(0.2)
    raise AssertionError(f"exps {exps} never trained together")


@pytest.mark.slow
def test_kill_9_mid_round_then_resume(autorl_repo, tmp_path):
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    run_dir = repo / "results" / TAG
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": hanging(0.5), "DESCRIPTION": "hangs A"},
        2: {"candidate/train.py": hanging(0.0), "DESCRIPTION": "hangs B"},
        3: {"candidate/train.py": tiny_train_py(BIAS=0.0), "DESCRIPTION": "no bias"},
        4: {"candidate/train.py": tiny_train_py(BIAS=5.0), "DESCRIPTION": "always left"},
    })
    daemon = start_daemon(repo, "run", "--env", "CartPole-v1", "--tag", TAG, "--agent", "replay", "--replay-dir",
                          str(replay), "--budget", "120", "--parallel", "2", *FAST)
    pids = wait_for_round(run_dir, (1, 2), daemon)
    status = run_daemon(repo, "status", "--tag", TAG, timeout=60).stdout
    assert "in flight: exp 1 (train, train)" in status and "in flight: exp 2 (train, train)" in status
    os.kill(daemon.pid, signal.SIGKILL)
    daemon.wait(timeout=10)
    assert len(pids) >= 4

    resumed = run_daemon(repo, "run", "--tag", TAG, "--resume", "--max-experiments", "4", timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert all_dead(pids), "the orphans of both candidates are killed"
    rows = read_results(repo, TAG)
    assert rows["exp"].tolist() == [0, 0, 1, 2, 3, 4]
    assert rows["status"].tolist() == ["baseline", "baseline", "interrupted", "interrupted", "keep", "discard"]
    main = git.Repo(repo)
    assert main.commit(f"refs/autorl/{TAG}/exp-0001").message.strip() == "hangs A"
    assert main.commit(f"refs/autorl/{TAG}/exp-0002").message.strip() == "hangs B"
    assert main.commit(f"autorl/{TAG}").message.strip() == "no bias"
