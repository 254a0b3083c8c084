"""`--sandbox auto` fails closed for a coding agent: where bubblewrap cannot run (here: none on PATH), a
night with the anthropic or command agent refuses to start, in one line naming `--sandbox off`, and
creates nothing; the offline optuna agent, which edits constants only, goes on unwalled and says so;
`--sandbox off` is the user's explicit acceptance of the risk."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import FAST, run_daemon, tiny_train_py

COMMAND = f"{sys.executable} -c pass {{prompt_file}}"  # a coding CLI that edits nothing


@pytest.fixture
def no_bwrap_env(tmp_path):
    """PATH with git alone (GitPython needs it; the daemon's python is sys.executable): no bwrap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(shutil.which("git"))
    return {"PATH": str(bin_dir)}


def started(repo: Path, tag: str) -> bool:
    return (repo / "results" / tag / "run.json").exists() or (repo / "runs" / tag).exists()


@pytest.mark.parametrize("agent", [["--agent", "command", "--agent-cmd", COMMAND],
                                   ["--agent", "anthropic"]])
def test_a_coding_agent_without_a_sandbox_refuses_to_start(autorl_repo, no_bwrap_env, agent):
    repo = autorl_repo(tiny_train_py())
    env = {**no_bwrap_env, "ANTHROPIC_API_KEY": "sk-test-not-used"}
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "walls", *agent, "--budget", "2",
                      "--max-experiments", "1", *FAST, env=env, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stdout + proc.stderr
    assert f"no sandbox for the {agent[1]} agent's code: bwrap not found" in lines[0]
    assert "--sandbox off" in lines[0]
    assert not started(repo, "walls")


@pytest.mark.slow
def test_the_optuna_agent_goes_on_unwalled_and_sandbox_off_is_accepted(autorl_repo, no_bwrap_env):
    repo = autorl_repo(tiny_train_py())
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "offline", "--agent", "optuna", "--budget", "2",
                      "--max-experiments", "0", "--no-setup-verify", *FAST, "--grace", "10", env=no_bwrap_env,
                      timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no sandbox: bwrap not found" in (repo / "results" / "offline" / "daemon.log").read_text()
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "accepted", "--agent", "command", "--agent-cmd",
                      COMMAND, "--sandbox", "off", "--budget", "2", "--max-experiments", "0", "--no-setup-verify", *FAST,
                      "--grace", "10",
                      env=no_bwrap_env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sandbox off (--sandbox off)" in (repo / "results" / "accepted" / "daemon.log").read_text()
