"""End to end: `python -m orchestrator run --agent anthropic` against the fake Messages API.

The daemon runs as a real subprocess in a temporary checkout, with ANTHROPIC_BASE_URL pointing at
the fake server: a scripted experiment edits candidate/train.py through the tools, is kept, and the
run stops at --max-cost. A canary secret in the daemon's environment must reach neither train.py
nor the agent's `run` tool.
"""
from __future__ import annotations

import json

import git
import pytest

from tests.conftest import CODING_AGENT_WALLS, FAST, read_results, run_daemon, tiny_train_py
from tests.fake_anthropic import (FakeAnthropic, overloaded, result_text, tool_results, tool_turn,
                                  usage)

CANARY = "canary-5e1d9"
DUMP_ENV = "\nimport json\nprint('ENVIRONMENT-DUMP ' + json.dumps(dict(os.environ)))\n"


@pytest.mark.long
@pytest.mark.slow
def test_an_anthropic_experiment_is_kept_and_the_run_stops_at_max_cost(autorl_repo):
    repo = autorl_repo(train_py=tiny_train_py(BIAS=5.0) + DUMP_ENV)   # BIAS 5.0: the pole falls
    evaluate_before = (repo / "evaluate.py").read_text()
    script = [
        overloaded(), overloaded(),   # the SDK's one retry is spent: the agent waits the outage out
        tool_turn(("read_file", {"path": "candidate/train.py"}),
                  ("run", {"command": "env", "timeout_s": 30}),
                  ("write_file", {"path": "evaluate.py", "content": "NUM_EVAL_EPISODES = 1\n"}),
                  usage_fields=usage(1000, 100)),
        tool_turn(("edit_file", {"path": "candidate/train.py", "old": "BIAS = 5.0",
                                 "new": "BIAS = 0.0"}), usage_fields=usage(1000, 100)),
        # The last turn is dear: $0.60 of input at claude-sonnet-4-6's $3 per million tokens.
        tool_turn(("submit", {"description": "balance the pole: bias 5.0 -> 0.0"}),
                  usage_fields=usage(200_000, 100)),
    ]
    with FakeAnthropic(script) as server:
        env = {"ANTHROPIC_API_KEY": f"sk-{CANARY}-key", "ANTHROPIC_BASE_URL": server.url,
               "AUTORL_TEST_SECRET": CANARY, "AUTORL_AGENT_SDK_RETRIES": "1",
               "AUTORL_AGENT_OUTAGE_WAIT": "0.1"}
        done = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "llm", "--agent", "anthropic",
                          "--model", "claude-sonnet-4-6", "--phases", "train", "--budget", "3", "--max-experiments", "3",
                          "--max-cost", "0.5", *FAST, *CODING_AGENT_WALLS, env=env, timeout=150)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "--max-cost reached" in output
    assert "anthropic API unavailable (HTTP 529)" in output

    rows = read_results(repo, "llm")
    experiments = rows[rows["exp"] > 0]
    assert list(experiments["status"]) == ["keep"]           # stopped at --max-cost, not at 3
    (row,) = experiments.itertuples()
    assert row.description.startswith("balance the pole: bias 5.0 -> 0.0")
    assert row.cost_usd == __import__("pytest").approx((202_000 * 3 + 300 * 15) / 1e6, rel=1e-3)
    assert row.score > rows[rows["status"] == "baseline"]["score"].max()

    # The kept commit is the branch tip and holds the agent's edit; evaluate.py is untouched.
    branch = git.Repo(repo).commit("autorl/llm")
    assert "BIAS = 0.0" in branch.tree["candidate/train.py"].data_stream.read().decode()
    assert branch.tree["evaluate.py"].data_stream.read().decode() == evaluate_before

    # The tools: the forbidden write refused, the secrets absent from the `run` tool's environment.
    requests = [request["body"] for request in server.message_requests][2:]
    assert len(requests) == 3
    read, ran, forbidden = tool_results(requests[1])
    assert "BIAS = 5.0" in result_text(read)
    assert not ran["is_error"] and "PATH=" in result_text(ran)
    assert CANARY not in result_text(ran) and server.url not in result_text(ran)
    assert forbidden["is_error"] and "candidate/train.py" in result_text(forbidden)

    # train.py ran (it dumped its environment) without the secrets.
    exp_dir = repo / "results" / "llm" / "exp-0001"
    train_logs = [path.read_text() for path in (repo / "results" / "llm").rglob("*.log")
                  if "ENVIRONMENT-DUMP" in path.read_text()]
    assert train_logs, "train.py's environment dump was not found in the run's logs"
    for log in train_logs:
        dumped = json.loads(log.split("ENVIRONMENT-DUMP ", 1)[1].splitlines()[0])
        assert CANARY not in json.dumps(dumped) and server.url not in json.dumps(dumped)
        assert "ANTHROPIC_API_KEY" not in dumped and "ANTHROPIC_BASE_URL" not in dumped

    events = [json.loads(line) for line in (exp_dir / "agent.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "start" and any(e["event"] == "end" for e in events)
    assert any(e["event"] == "outcome" and e["status"] == "keep" for e in events)
