"""The command agent, with small scripts standing in for a coding CLI (real subprocesses)."""
from __future__ import annotations

import json
import sys
import time
from argparse import Namespace

import psutil
import pytest

from orchestrator.agents.base import AgentError
from orchestrator.agents.command import CommandAgent, render
from orchestrator.agents.errors import AgentConfigError
from tests.agent_workspace import make_context

FAKE_CLI = """\
import json, os, sys
prompt = open(sys.argv[1]).read() if len(sys.argv) > 1 else sys.stdin.read()
with open(os.environ["RECORD"], "w") as record:
    json.dump({"cwd": os.getcwd(), "env": dict(os.environ), "prompt": prompt}, record)
path = "candidate/train.py"
text = open(path).read().replace("LEARNING_RATE = 3e-4", "LEARNING_RATE = 1e-3")
open(path, "w").write(text)
print("Reading the file...")
print("DESCRIPTION: raise the learning rate to 1e-3")
print("Done.")
"""


def write_script(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_cli_edits_the_worktree_from_the_prompt_file(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTORL_CANARY_SECRET", "canary-91b2")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary-openai")
    record = tmp_path / "record.json"
    monkeypatch.setenv("RECORD", str(record))
    cli = write_script(tmp_path, "fake_cli.py", FAKE_CLI)
    ctx = make_context(tmp_path)
    agent = CommandAgent.from_args(
        Namespace(agent_cmd=f"{sys.executable} {cli} {{prompt_file}}", agent_timeout=60), ctx.run_dir)
    proposal = agent.propose(ctx)

    assert "LEARNING_RATE = 1e-3" in (ctx.worktree / "candidate/train.py").read_text()
    assert proposal.description == "raise the learning rate to 1e-3"
    assert proposal.cost_usd == 0.0 and proposal.extra["exit_code"] == 0
    seen = json.loads(record.read_text())
    assert seen["cwd"] == str(ctx.worktree.resolve())
    assert "AUTORL_CANARY_SECRET" not in seen["env"] and "OPENAI_API_KEY" not in seen["env"]
    for marker in ("PROGRAM-MARKER", "RESULTS-MARKER", "FAILURE-MARKER", "LEARNING_RATE = 3e-4",
                   "candidate/train.py", str(ctx.notes_path)):
        assert marker in seen["prompt"]
    assert seen["prompt"] == (ctx.exp_dir / "prompt.md").read_text()
    assert "DESCRIPTION: raise" in (ctx.exp_dir / "agent.log").read_text()
    assert proposal.transcript == ctx.exp_dir / "agent.log"


def test_the_prompt_placeholder_is_shell_quoted(tmp_path, monkeypatch):
    record = tmp_path / "argv.json"
    monkeypatch.setenv("RECORD", str(record))
    cli = write_script(tmp_path, "argv_cli.py",
                       "import json, os, sys\njson.dump(sys.argv[1:], open(os.environ['RECORD'], 'w'))\n"
                       "print('done')\n")
    ctx = make_context(tmp_path, program="Try $(touch PWNED) and `touch PWNED2`; it's \"quoted\"\n")
    for template in (f"{sys.executable} {cli} {{prompt}}", f'{sys.executable} {cli} "{{prompt}}"'):
        proposal = CommandAgent(template, timeout_s=60).propose(ctx)
        (argument,) = json.loads(record.read_text())
        assert argument == (ctx.exp_dir / "prompt.md").read_text()
        assert "$(touch PWNED)" in argument
        assert not (ctx.worktree / "PWNED").exists() and not (ctx.worktree / "PWNED2").exists()
        assert proposal.description == "done"


def test_a_cli_past_its_timeout_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    marker = str(time.time_ns() % 10**9)
    cli = write_script(tmp_path, "slow_cli.sh", f"""
sed -i 's/NUM_ENVS = 8/NUM_ENVS = 4/' candidate/train.py
echo "DESCRIPTION: fewer envs"
sleep 300.{marker} &
echo started > {pid_file}
wait
""")
    ctx = make_context(tmp_path)
    started = time.monotonic()
    proposal = CommandAgent(f"bash {cli} {{prompt_file}}", timeout_s=1).propose(ctx)
    assert time.monotonic() - started < 10
    assert proposal.extra["timed_out"]
    assert proposal.description.startswith("[agent command timed out after 1 s]")
    assert "fewer envs" in proposal.description
    assert "NUM_ENVS = 4" in (ctx.worktree / "candidate/train.py").read_text()   # the loop judges it
    assert pid_file.read_text().strip() == "started"

    def children_left():  # found by their unique argument: inside the sandbox's PID namespace $! is no real pid
        left = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            if proc.info["cmdline"] == ["sleep", f"300.{marker}"] and proc.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(proc)
        return left
    deadline = time.monotonic() + 5
    while children_left():
        assert time.monotonic() < deadline, "the CLI's child survived the timeout"
        time.sleep(0.05)


def test_claude_code_json_output_gives_description_and_cost(tmp_path):
    result = {"type": "result", "subtype": "success", "is_error": False, "num_turns": 7,
              "result": "I widened the MLP.\n\nDESCRIPTION: hidden size 64 -> 128",
              "total_cost_usd": 0.4231, "session_id": "abc"}
    cli = write_script(tmp_path, "claude_like.sh", f"cat > /dev/null\necho '{json.dumps(result)}'\n")
    ctx = make_context(tmp_path)
    proposal = CommandAgent(f"bash {cli} < {{prompt_file}}", timeout_s=60).propose(ctx)
    assert proposal.description == "hidden size 64 -> 128"
    assert proposal.cost_usd == pytest.approx(0.4231)


def test_a_failing_cli_that_changed_nothing_is_an_agent_error(tmp_path):
    cli = write_script(tmp_path, "broken.sh", "echo 'error: not logged in' >&2\nexit 2\n")
    ctx = make_context(tmp_path)
    with pytest.raises(AgentError, match="not logged in"):
        CommandAgent(f"bash {cli} {{prompt_file}}", timeout_s=60).propose(ctx)


def test_templates_are_checked_before_anything_starts(tmp_path):
    with pytest.raises(AgentConfigError, match="--agent-cmd"):
        CommandAgent.from_args(Namespace(agent_cmd=None), tmp_path)
    with pytest.raises(AgentConfigError, match="neither"):
        CommandAgent.from_args(Namespace(agent_cmd="claude -p 'do research'"), tmp_path)
    with pytest.raises(AgentConfigError, match="not on PATH"):
        CommandAgent.from_args(Namespace(agent_cmd="no-such-coding-cli {prompt_file}"), tmp_path)
    with pytest.raises(AgentConfigError, match="not a valid shell command"):
        CommandAgent.from_args(Namespace(agent_cmd="bash -c 'unterminated {prompt}"), tmp_path)
    assert render("cat {prompt_file} | x '{prompt}'", tmp_path / "a b.md", "it's") == \
        f"cat '{tmp_path}/a b.md' | x 'it'\"'\"'s'"
