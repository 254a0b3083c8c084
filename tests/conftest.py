"""Shared fixtures: a real temporary checkout of autorl to run the daemon against.

`autorl_repo(train_py=None, files=None)` builds a git repository in a temp dir holding a copy
of the real evaluate.py, program.md, envs_fast/ (when present) and either the real
candidate/train.py or the given text, committed on branch main. `daemon_cmd`/`run_daemon`
run `python -m orchestrator ...` in it as a real subprocess (the orchestrator package comes
from this checkout through PYTHONPATH). The checkout itself is orchestrator/benchmark/scratch_checkout.py.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# the scratch checkout's helpers live with the benchmarks that use them too; the tests import them from here
from orchestrator.benchmark.scratch_checkout import (  # noqa: F401
    AUTORL_ROOT, daemon_cmd, daemon_env, make_checkout, read_results, write_replay)

PYTHON = sys.executable

# A train.py that trains nothing: it exports a CartPole controller whose quality is set by BIAS
# (0.0 balances for all 500 steps, 0.5 about 260, 1.0 about 145, 5.0 about 9 - always left). Its seeds
# differ as a training run's do: AUTORL_SEED moves the bias by up to SEED_SPREAD (at BIAS 1.0 about
# +-5 points, 4x the evaluation's se over 10 episodes; at 0.5 about +-30), so the keep rule takes its
# runs as independent (tiny_train_py(SEED_SPREAD=0.0): a train.py that ignores its seed).
TINY_TRAIN_PY = textwrap.dedent('''\
    import os
    import sys
    import time
    from pathlib import Path

    import torch

    # >>> hyperparameters
    BIAS = 1.0  # 0.0 balances the pole, 5.0 always pushes left
    SLEEP = 0.0  # seconds to idle before exporting
    NUM_ENVS = 8  # unused; a power of two for the optuna agent
    USE_X = True  # unused
    BACKEND = "auto"  # unused, never tuned
    # <<< hyperparameters
    SEED_SPREAD = 0.05  # how far AUTORL_SEED moves the bias
    SEED = int(os.environ.get("AUTORL_SEED", "1"))


    class Controller(torch.nn.Module):
        def __init__(self, bias: float):
            super().__init__()
            self.bias = bias

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            s = 0.1 * obs[:, 0] + 0.5 * obs[:, 1] + 10.0 * obs[:, 2] + 2.0 * obs[:, 3]
            return (s + self.bias > 0).long()


    out = Path(os.environ.get("AUTORL_OUTPUT_DIR", "out"))
    out.mkdir(parents=True, exist_ok=True)
    time.sleep(SLEEP)
    bias = BIAS + SEED_SPREAD * ((SEED * 7919) % 201 - 100) / 100
    torch.jit.save(torch.jit.script(Controller(bias)), str(out / "policy.pt"))
    print("---")
    print("env_steps: 1000")
    print("sps: 500")
''')


def tiny_train_py(**constants) -> str:
    """TINY_TRAIN_PY with some hyperparameter values replaced, e.g. tiny_train_py(BIAS=0.0)."""
    text = TINY_TRAIN_PY
    for name, value in constants.items():
        start = text.index(f"\n{name} = ") + 1
        end = text.index("  #", start)
        text = text[:start] + f"{name} = {value!r}" + text[end:]
    return text


def pytest_configure(config):
    config.addinivalue_line("markers", "long: a whole night of the daemon or more (30 s to 4 min on 2 cores); "
                                       "collected first, see pytest_collection_modifyitems")
    config.addinivalue_line("markers", "slow: over ~30 s (a night end to end, a long verification): `make test` "
                                       "leaves it out to finish within 15 min; `make test-slow` and CI run it")


def pytest_collection_modifyitems(items):
    """Long tests first: pytest-xdist's workers take tests from the front of their queues and steal
    from the back of each other's (`--dist worksteal`), so the long ones start early and the short
    ones fill the end, rather than one worker running a long test alone while the other idles."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture(scope="session", autouse=True)
def user_verify_cache(tmp_path_factory, worker_id):
    """The user-level verdict cache of every run the tests start (never the real ~/.cache): one per
    test session, shared by its pytest-xdist workers (its records are written atomically, as for a
    user's concurrent runs), so the shipped translations are verified and benchmarked once, not by
    every test or every worker."""
    from orchestrator.usercache import USER_CACHE_ENV

    if worker_id == "master":
        path = tmp_path_factory.mktemp("user-verify-cache")
    else:  # each worker's base folder is pytest-N/popen-gwK: pytest-N is the session's
        path = tmp_path_factory.getbasetemp().parent / "user-verify-cache"
        path.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(USER_CACHE_ENV, str(path))
        yield path


@pytest.fixture
def private_cache(tmp_path, monkeypatch) -> Path:
    """A verdict cache of this test's own ($AUTORL_VERIFY_CACHE): no test reads another's verdicts or
    builds into the repository's. A module takes it for every test with
    `pytestmark = pytest.mark.usefixtures("private_cache")`."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("AUTORL_VERIFY_CACHE", str(folder))
    return folder


@pytest.fixture(scope="module")
def module_private_cache(tmp_path_factory) -> Path:
    """One verdict cache for a whole module: its Rust libraries built once, its ports verified once."""
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTORL_VERIFY_CACHE", str(folder))
        yield folder


@pytest.fixture
def autorl_repo(tmp_path):
    """Factory: autorl_repo(train_py=None, files=None) -> path of a committed temp checkout."""
    def make(train_py: str | None = None, files: dict[str, str] | None = None, name: str = "checkout") -> Path:
        return make_checkout(tmp_path / name, train_py, files)
    return make


# Small, fast settings for tests: few eval episodes in one process, and 2 baselines
# (the default 4 is for real nights; the keep scenarios here are written against a pair).
# A coding agent's night refuses to start where bubblewrap cannot run (--sandbox auto fails closed); there
# the tests of what such an agent does accept the risk as a user would, with --sandbox off
def _coding_agent_walls() -> tuple[str, ...]:
    from orchestrator.sandbox import probe

    return () if probe()[0] else ("--sandbox", "off")


CODING_AGENT_WALLS = _coding_agent_walls()
# --export-margin 30: the budget is exact, and on a loaded 2-core machine the real train.py's start-up and
# compile alone can outlast the seconds-long budgets of these tests (tests/test_budget.py holds the default)
# --grace 10: only the kill deadline of a run that hangs; a tiny train.py still imports torch, and under CI's
# load (two nights at once on 2 cores) its start-up, export and exit outlasted 2 s + 3 s
# --rescore 0: no end-of-night rescoring (tests/test_rescore.py has it)
FAST = ("--eval-episodes", "10", "--eval-workers", "1", "--grace", "10", "--export-margin", "30", "--backoff", "0.2",
        "--baselines", "2", "--rescore", "0")


def run_daemon(repo: Path, *args: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(daemon_cmd(*args), cwd=repo, env=daemon_env(env), capture_output=True, text=True,
                          timeout=timeout)


def start_daemon(repo: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(daemon_cmd(*args), cwd=repo, env=daemon_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def processes_of(out_dir: Path) -> list:
    """The live processes of a train run, found by the AUTORL_OUTPUT_DIR they inherit (inside the
    sandbox's PID namespace a train run cannot tell its real pids)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("AUTORL_OUTPUT_DIR") == str(out_dir) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def all_dead(procs: list) -> bool:
    import psutil

    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.Error:
            continue
    return True


def unique_sleep() -> str:
    """`sleep 300.<n>`: a child a test can find again by its command line (a pid printed inside the
    sandbox's PID namespace means nothing outside it)."""
    import time

    return f"300.{time.time_ns() % 10**9}"


def wait_until_gone(sleep_arg: str, timeout_s: float = 5.0) -> None:
    import time

    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in psutil.process_iter(["cmdline", "status"])
                if p.info["cmdline"] == ["sleep", sleep_arg] and p.info["status"] != psutil.STATUS_ZOMBIE]
        if not left:
            return
        assert time.monotonic() < deadline, f"sleep {sleep_arg} survived: {left}"
        time.sleep(0.05)


@pytest.fixture
def restore_signals():
    """For a test that runs the loop in-process: the SIGINT/SIGTERM handlers it installs are undone."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)
