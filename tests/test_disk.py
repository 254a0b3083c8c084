"""A full disk does not stall the night: an experiment that writes too much is stopped and
recorded, its ballast removed; a disk filled from outside is waited out and the night goes on.
results/ lives on a small real tmpfs (mounted as root; skipped with the reason otherwise)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from orchestrator.results import COLUMNS
from tests.conftest import FAST, read_results, run_daemon, start_daemon, tiny_train_py, write_replay

TAG = "disk"

BALLAST = """
_out = Path(os.environ["AUTORL_OUTPUT_DIR"])
_out.mkdir(parents=True, exist_ok=True)
_chunk = b"x" * 2**20
for _i in range(10_000):  # checkpoints every update, forever: until something stops it
    try:
        (_out / f"ckpt-{_i:05d}.bin").write_bytes(_chunk)
    except OSError:
        time.sleep(0.05)
"""

SLOW = "\ntime.sleep(4)\n"


def with_code(code: str, bias: float) -> str:
    return tiny_train_py(BIAS=bias).replace("out = Path(", code + "\nout = Path(", 1)


@pytest.fixture
def small_results(autorl_repo):
    """A checkout whose results/ is a 96 MB tmpfs."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs for results/ needs root")
    repo = autorl_repo(tiny_train_py(BIAS=1.0))
    results = repo / "results"
    results.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(results)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield repo
    subprocess.run(["umount", "-l", str(results)], capture_output=True)


def whole_lines(path) -> bool:
    text = path.read_text()
    return text.endswith("\n") and all(len(line.split("\t")) == len(COLUMNS) for line in text.splitlines())


@pytest.mark.long
@pytest.mark.slow
def test_an_experiment_that_writes_too_much_is_stopped_and_its_ballast_removed(small_results, tmp_path):
    repo = small_results
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": with_code(BALLAST, 0.0), "DESCRIPTION": "a checkpoint every update"},
        2: {"candidate/train.py": tiny_train_py(BIAS=0.0), "DESCRIPTION": "no bias"},
    })
    result = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", TAG, "--agent", "replay", "--replay-dir",
                        str(replay), "--budget", "30", "--max-output-mb", "16", *FAST, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_results(repo, TAG)
    assert rows["status"].tolist() == ["baseline", "baseline", "crash", "keep"]
    assert "wrote more than 16 MB" in rows["description"].iloc[2]
    assert rows["score"].iloc[3] == 500.0
    run_dir = repo / "results" / TAG
    assert whole_lines(run_dir / "results.tsv")
    assert list((run_dir / "exp-0001" / "out").iterdir()) == [], "the ballast is gone"
    assert "wrote more than 16 MB" in (run_dir / "exp-0001" / "failure.txt").read_text()


def wait_for(predicate, proc, timeout=120, what=""):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.long
@pytest.mark.slow
def test_a_disk_filled_from_outside_is_waited_out(small_results, tmp_path):
    repo = small_results
    run_dir = repo / "results" / TAG
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": with_code(SLOW, 0.5), "DESCRIPTION": "slow, less bias"},
        2: {"candidate/train.py": tiny_train_py(BIAS=0.0), "DESCRIPTION": "no bias"},
    })
    daemon = start_daemon(repo, "run", "--env", "CartPole-v1", "--tag", TAG, "--agent", "replay", "--replay-dir",
                          str(replay), "--budget", "30", "--max-output-mb", "16", *FAST)

    def training(exp):
        state = json.loads((run_dir / "state.json").read_text()) if (run_dir / "state.json").exists() else {}
        return any(r["exp"] == exp and r.get("stage") == "train" for r in state.get("in_flight") or [])
    wait_for(lambda: training(1), daemon, what="exp 1 training")
    filler = repo / "results" / "someone-elses-file"
    with open(filler, "wb") as handle:  # the disk fills up (all but 2 MB) while exp 1 trains
        while shutil.disk_usage(filler.parent).free > 3 * 2**20:
            handle.write(b"\0" * 2**20)
            handle.flush()

    wait_for(lambda: "waiting for disk space" in (run_dir / "daemon.log").read_text(), daemon,
             what="the daemon to wait for disk space")
    assert "waiting for disk space" in run_daemon(repo, "status", "--tag", TAG, timeout=60).stdout
    time.sleep(6)  # it keeps waiting, writing nothing
    assert daemon.poll() is None and whole_lines(run_dir / "results.tsv")
    filler.unlink()  # space comes back: the night goes on by itself
    assert daemon.wait(timeout=240) == 0, daemon.stdout.read()
    log = (run_dir / "daemon.log").read_text()
    assert log.count("waiting for disk space") == 1, "said once"
    rows = read_results(repo, TAG)
    assert rows["exp"].tolist() == [0, 0, 1, 2] and rows["status"].tolist()[-1] == "keep"
    assert rows["status"].tolist()[2] in ("keep", "discard")
    assert whole_lines(run_dir / "results.tsv")


def test_a_stop_ends_the_wait_for_disk_space(tmp_path):
    from orchestrator.disk import DiskSpace

    said, sleeps = [], []
    disk = DiskSpace(tmp_path, said.append, should_stop=lambda: len(sleeps) >= 3,
                     sleep=lambda s: sleeps.append(s) or True, min_free_mb=10**12)  # never enough
    assert disk.wait() is False and len(sleeps) == 3
    assert said[0].startswith(f"waiting for disk space on {tmp_path}")


def test_prune_keeps_the_artifact_and_cuts_long_logs(tmp_path):
    from orchestrator.disk import prune
    from orchestrator.results import ExpFolder

    folder = ExpFolder(tmp_path / "exp-0001")
    (folder.out / "ckpts").mkdir(parents=True)
    (folder.out / "ckpts" / "a.bin").write_bytes(b"x" * 1000)
    (folder.out / "video.mp4").write_bytes(b"x" * 1000)
    (folder.out / "policy.pt").write_bytes(b"policy")
    folder.train_log.write_text("".join(f"line {i}\n" for i in range(200_000)))
    assert prune(folder, log_cap_mb=0.1) > 2000
    assert [p.name for p in folder.out.iterdir()] == ["policy.pt"]
    text = folder.train_log.read_text()
    assert text.startswith("[autorl: the first") and text.endswith("line 199999\n")
    assert len(text) < 0.11 * 2**20
