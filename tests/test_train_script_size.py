"""A train experiment changes candidate/train.py only, and only as code: a train.py past 256 KB (weights
or rollouts smuggled in as literals, to warm-start every run) is `invalid` and never trained."""
from __future__ import annotations

from tests.conftest import FAST, TINY_TRAIN_PY, read_results, run_daemon, write_replay

# 300 KB of "weights" in a literal: the trick the limit is for
SMUGGLED = TINY_TRAIN_PY + "WEIGHTS = [" + ", ".join(["0.123456789"] * 24_000) + "]\n"


def test_a_train_py_over_the_size_limit_is_invalid_and_not_trained(autorl_repo, tmp_path):
    from orchestrator.phases import MAX_TRAIN_SCRIPT_BYTES

    assert len(SMUGGLED.encode()) > MAX_TRAIN_SCRIPT_BYTES
    repo = autorl_repo(train_py=TINY_TRAIN_PY)
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": SMUGGLED, "DESCRIPTION": "pretrained weights as a literal"},
        2: {"candidate/train.py": TINY_TRAIN_PY.replace("BIAS = 1.0", "BIAS = 0.5"), "DESCRIPTION": "a smaller bias"},
    })
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "size", "--agent", "replay", "--replay-dir",
                      str(replay), "--budget", "2", "--max-experiments", "2", "--no-setup-verify", *FAST,
                      "--grace", "10", timeout=300)  # (torch's import on a loaded machine)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_results(repo, "size")
    smuggled, code = (rows[rows.exp == exp].iloc[-1] for exp in (1, 2))
    assert smuggled["status"] == "invalid" and smuggled["score"] != smuggled["score"]
    assert "over 256 KB" in smuggled["description"], smuggled["description"]
    assert not (repo / "results" / "size" / "exp-0001" / "train.log").exists()  # never trained
    assert code["status"] in ("keep", "discard")
