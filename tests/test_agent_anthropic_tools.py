"""The tools of the LLM agents, on a real git worktree with real subprocesses."""
from __future__ import annotations

import os
import time


from orchestrator.agents.tools import MAX_OUTPUT_CHARS, Toolbox
from tests.agent_workspace import make_worktree
from tests.conftest import unique_sleep, wait_until_gone


def test_run_has_no_secrets_and_works_in_the_worktree(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORL_CANARY_SECRET", "canary-7f3a")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-canary-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/canary")
    worktree = make_worktree(tmp_path)
    scratch = tmp_path / "scratch"
    toolbox = Toolbox(worktree, ["candidate/train.py"], scratch_dir=scratch,
                      extra_env={"AUTORL_ENV_ID": "CartPole-v1"})
    result = toolbox.call("run", {"command": "pwd; env; echo $AUTORL_OUTPUT_DIR", "timeout_s": 20})
    assert not result.is_error
    assert str(worktree.resolve()) in result.content
    assert "AUTORL_ENV_ID=CartPole-v1" in result.content
    for secret in ("canary-7f3a", "sk-canary-key", "9/canary"):
        assert secret not in result.content
    assert f"AUTORL_OUTPUT_DIR={scratch}" in result.content   # training output stays out of the diff

    failed = toolbox.call("run", {"command": "echo oops >&2; exit 3"})
    assert failed.is_error and "exit code 3" in failed.content and "oops" in failed.content


def test_run_kills_the_whole_process_group_at_its_timeout(tmp_path):
    worktree = make_worktree(tmp_path)
    sleep_arg = unique_sleep()
    toolbox = Toolbox(worktree, [])
    started = time.monotonic()
    result = toolbox.call("run", {
        "command": f"(sleep {sleep_arg} & echo started; wait) ; echo never", "timeout_s": 1})
    assert time.monotonic() - started < 10
    assert result.is_error and "timed out after 1 s" in result.content and "started" in result.content
    wait_until_gone(sleep_arg)


def test_run_output_is_truncated_keeping_the_tail(tmp_path):
    toolbox = Toolbox(make_worktree(tmp_path), [])
    result = toolbox.call("run", {"command": "seq 1 100000"})
    assert len(result.content) < MAX_OUTPUT_CHARS + 200
    assert result.content.rstrip().endswith("100000") and "characters cut" in result.content


def test_allowed_paths_may_name_directories_and_patterns(tmp_path):
    worktree = make_worktree(tmp_path)
    toolbox = Toolbox(worktree, ["envs_fast/cartpole/", "envs_fast/cartpole_*.py"])
    assert not toolbox.call("write_file", {"path": "envs_fast/cartpole/step.py", "content": "x"}).is_error
    assert not toolbox.call("write_file", {"path": "envs_fast/cartpole_jax.py", "content": "x"}).is_error
    refused = toolbox.call("write_file", {"path": "envs_fast/registry.py", "content": "x"})
    assert refused.is_error and "envs_fast/cartpole/" in refused.content
    assert not (worktree / "envs_fast/registry.py").exists()
    # Reading the rest of the worktree is fine.
    assert "TIME_BUDGET" in toolbox.call("read_file", {"path": "evaluate.py"}).content


def test_list_files_skips_git_and_reports_sizes(tmp_path):
    worktree = make_worktree(tmp_path)
    listing = Toolbox(worktree, []).call("list_files", {"path": "."}).content
    lines = listing.splitlines()
    assert f"candidate/train.py  {os.path.getsize(worktree / 'candidate/train.py')}" in lines
    assert not any(line.startswith(".git/") for line in lines)


def test_a_stop_signal_during_run_leaves_no_process_behind(tmp_path):
    # The daemon's SIGTERM handler raises inside the agent's turn; the command must die with it.
    import signal

    class Stopped(Exception):
        pass

    def on_alarm(signum, frame):
        raise Stopped()

    worktree = make_worktree(tmp_path)
    sleep_arg = unique_sleep()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        Toolbox(worktree, []).call("run", {
            "command": f"(sleep {sleep_arg} & echo started > started.flag; wait)", "timeout_s": 60})
        raise AssertionError("the stop did not interrupt the command")
    except Stopped:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert (worktree / "started.flag").exists(), "the command had started"
    wait_until_gone(sleep_arg)
