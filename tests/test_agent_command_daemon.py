"""End to end: `python -m orchestrator run --agent command` with a script standing in for the CLI."""
from __future__ import annotations

import json
import sys

from tests.conftest import CODING_AGENT_WALLS, FAST, read_results, run_daemon, tiny_train_py

CANARY = "canary-c0ffee"
FAKE_CLI = """\
import json, os, sys
prompt = open(sys.argv[1]).read()
assert "candidate/train.py" in prompt and "BIAS = 5.0" in prompt
json.dump(dict(os.environ), open(sys.argv[2], "w"))
path = "candidate/train.py"
text = open(path).read().replace("BIAS = 5.0", "BIAS = 0.0")
open(path, "w").write(text)
print("I set the bias to zero so the controller balances.")
print("DESCRIPTION: bias 5.0 -> 0.0")
"""


def test_a_command_agent_experiment_is_judged_by_its_diff_and_kept(autorl_repo, tmp_path):
    repo = autorl_repo(train_py=tiny_train_py(BIAS=5.0))
    cli = tmp_path / "fake_cli.py"
    cli.write_text(FAKE_CLI)
    cli_env = tmp_path / "cli_env.json"
    done = run_daemon(
        repo, "run", "--env", "CartPole-v1", "--tag", "cli", "--agent", "command",
        "--agent-cmd", f"{sys.executable} {cli} {{prompt_file}} {cli_env}", "--agent-timeout", "60", "--phases", "train",
        "--budget", "3", "--max-experiments", "1", *FAST, *CODING_AGENT_WALLS, "--grace", "10",  # (torch's import on a loaded machine)
        env={"AUTORL_TEST_SECRET": CANARY, "ANTHROPIC_API_KEY": f"sk-{CANARY}"}, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr

    rows = read_results(repo, "cli")
    (row,) = rows[rows["exp"] > 0].itertuples()
    assert row.status == "keep" and row.description.startswith("bias 5.0 -> 0.0")
    assert row.cost_usd == 0
    assert CANARY not in cli_env.read_text()
    assert json.loads(cli_env.read_text())["PWD"].endswith("runs/cli")
    exp_dir = repo / "results" / "cli" / "exp-0001"
    assert "DESCRIPTION: bias" in (exp_dir / "agent.log").read_text()
    assert "BIAS = 5.0" in (exp_dir / "prompt.md").read_text()
