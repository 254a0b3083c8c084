"""The anthropic agent, driven by the real anthropic client against a fake Messages API on 127.0.0.1."""
from __future__ import annotations

import json
import time
from argparse import Namespace

import anthropic
import pytest

from orchestrator.agents.anthropic_agent import DEFAULT_MODEL, AnthropicAgent, RetrySettings
from orchestrator.agents.base import AgentError, Outcome
from orchestrator.agents.errors import AgentConfigError
from orchestrator.agents.pricing import PriceTable
from tests.agent_workspace import EVALUATE_PY, TRAIN_PY, make_context
from tests.fake_anthropic import (FakeAnthropic, error, overloaded, rate_limited, result_text,
                                  slow, text_turn, tool_results, tool_turn, usage)

TOOL_NAMES = ["read_file", "list_files", "write_file", "edit_file", "run", "submit"]


def make_agent(server: FakeAnthropic, sdk_retries: int = 2, timeout_s: float = 10.0, **kwargs):
    client = anthropic.Anthropic(api_key="sk-test-key", base_url=server.url,
                                 max_retries=sdk_retries, timeout=timeout_s)
    retry = kwargs.pop("retry", RetrySettings(outage_wait_s=0.05, outage_max_wait_s=0.2))
    return AnthropicAgent(client, retry=retry, **kwargs)


def transcript_events(ctx) -> list[dict]:
    return [json.loads(line) for line in (ctx.exp_dir / "agent.jsonl").read_text().splitlines()]


def test_whole_experiment_through_the_tools(tmp_path):
    ctx = make_context(tmp_path)
    script = [
        tool_turn(("read_file", {"path": "candidate/train.py"}), ("list_files", {"path": "."}),
                  text="Let me look.", usage_fields=usage(2000, 100, cache_write=5000)),
        tool_turn(("edit_file", {"path": "candidate/train.py", "old": "LEARNING_RATE = 3e-4",
                                 "new": "LEARNING_RATE = 1e-3"}),
                  ("write_file", {"path": "notes.md", "content": "- tried lr 1e-3\n"}),
                  usage_fields=usage(300, 200, cache_read=7000)),
        tool_turn(("run", {"command": "python -m py_compile candidate/train.py && echo compiled",
                           "timeout_s": 30}), usage_fields=usage(100, 50, cache_read=7500)),
        tool_turn(("submit", {"description": "raise the learning rate\tto 1e-3\nfor speed"}),
                  usage_fields=usage(100, 30, cache_read=7600)),
    ]
    with FakeAnthropic(script) as server:
        proposal = make_agent(server, model="claude-sonnet-4-6").propose(ctx)
    requests = [request["body"] for request in server.message_requests]

    assert "LEARNING_RATE = 1e-3" in (ctx.worktree / "candidate/train.py").read_text()
    assert ctx.notes_path.read_text() == "- tried lr 1e-3\n"
    assert not (ctx.worktree / "notes.md").exists()
    assert proposal.description == "raise the learning rate to 1e-3 for speed"

    # Cost from the usage fields at claude-sonnet-4-6 prices (3 / 15 / 3.75 / 0.30 per Mtok).
    expected = (2500 * 3 + 380 * 15 + 5000 * 3.75 + 22100 * 0.30) / 1e6
    assert proposal.cost_usd == pytest.approx(expected)
    assert (proposal.input_tokens, proposal.output_tokens) == (2500, 380)
    assert (proposal.cache_write_tokens, proposal.cache_read_tokens) == (5000, 22100)

    # The request: exact tool names, the stable prefix under prompt caching, the experiment prompt.
    first = requests[0]
    assert [tool["name"] for tool in first["tools"]] == TOOL_NAMES
    assert first["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert first["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "PROGRAM-MARKER" in first["system"][0]["text"]
    assert "Phase: train" in first["system"][0]["text"]
    prompt = first["messages"][0]["content"][0]["text"]
    for marker in ("LEARNING_RATE = 3e-4", "RESULTS-MARKER", "FAILURE-MARKER", "candidate/train.py"):
        assert marker in prompt
    assert first["model"] == "claude-sonnet-4-6"
    # The stable prefix is byte-identical from turn to turn, so the cache can hit.
    assert all(body["system"] == first["system"] and body["tools"] == first["tools"]
               for body in requests)

    # Tool results went back in order, none an error, with the real outputs.
    read, listing = tool_results(requests[1])
    assert not read["is_error"] and "LEARNING_RATE = 3e-4" in result_text(read)
    assert "candidate/train.py" in result_text(listing) and ".git/" not in result_text(listing)
    assert not any(block["is_error"] for block in tool_results(requests[2]))
    (ran,) = tool_results(requests[3])
    assert not ran["is_error"] and "exit code 0" in result_text(ran) and "compiled" in result_text(ran)
    assert len(requests) == 4   # submit ends the experiment without another call

    events = transcript_events(ctx)
    assert events[0]["event"] == "start" and events[-1]["event"] == "end"
    assert events[-1]["reason"] == "submit"
    assert [e["name"] for e in events if e["event"] == "tool"] == [
        "read_file", "list_files", "edit_file", "write_file", "run", "submit"]
    assert proposal.transcript == ctx.exp_dir / "agent.jsonl"


def test_each_experiment_is_a_fresh_conversation_with_the_notes(tmp_path):
    ctx1 = make_context(tmp_path, exp=1)
    script = [tool_turn(("write_file", {"path": "notes.md", "content": "NOTE-FROM-EXP-1"}),
                        ("submit", {"description": "first"})),
              tool_turn(("submit", {"description": "second"}))]
    with FakeAnthropic(script) as server:
        agent = make_agent(server)
        agent.propose(ctx1)
        agent.tell(ctx1, Outcome(status="discard", score=20.0, best=21.5))
        ctx2 = make_context(tmp_path, exp=2, worktree=ctx1.worktree)
        agent.propose(ctx2)
    second = server.message_requests[1]["body"]
    assert len(second["messages"]) == 1
    assert "NOTE-FROM-EXP-1" in second["messages"][0]["content"][0]["text"]
    assert transcript_events(ctx1)[-1] == {**transcript_events(ctx1)[-1], "event": "outcome",
                                           "status": "discard"}


def test_path_escapes_and_forbidden_writes_are_refused(tmp_path):
    ctx = make_context(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("SECRET-OUTSIDE")
    (ctx.worktree / "candidate" / "link_out").symlink_to(outside)
    (ctx.worktree / "candidate" / "link_eval.py").symlink_to(ctx.worktree / "evaluate.py")
    ctx.allowed_paths = ["candidate/train.py", "candidate/link_eval.py", "candidate/link_out"]
    attacks = [
        ("read_file", {"path": "../outside.txt"}),
        ("read_file", {"path": str(outside)}),
        ("read_file", {"path": "candidate/link_out"}),
        ("list_files", {"path": ".."}),
        ("write_file", {"path": "evaluate.py", "content": "TIME_BUDGET = 1e9\n"}),
        ("edit_file", {"path": "evaluate.py", "old": "720", "new": "1"}),
        ("write_file", {"path": "candidate/link_eval.py", "content": "hacked\n"}),
        ("write_file", {"path": "candidate/link_out", "content": "hacked\n"}),
        ("write_file", {"path": "candidate/../evaluate.py", "content": "hacked\n"}),
        ("write_file", {"path": "/tmp/autorl-escape.txt", "content": "hacked\n"}),
        ("edit_file", {"path": "candidate/train.py", "old": "print", "new": "pass"}),
        ("edit_file", {"path": "candidate/train.py", "old": "NO SUCH TEXT", "new": "x"}),
        ("no_such_tool", {}),
        ("write_file", {"path": "candidate/train.py"}),
    ]
    script = [tool_turn(*attacks), tool_turn(("submit", {"description": "tried"}))]
    with FakeAnthropic(script) as server:
        make_agent(server).propose(ctx)
    results = tool_results(server.message_requests[1]["body"])
    assert len(results) == len(attacks)
    refused = [(name, args, block) for (name, args), block in zip(attacks, results)]
    for name, args, block in refused:
        assert block["is_error"], (name, args, result_text(block))
        assert "SECRET-OUTSIDE" not in result_text(block)
    # The refusal of a forbidden write says which paths are allowed.
    assert "candidate/train.py" in result_text(results[4]) and "notes.md" in result_text(results[4])
    assert "2 times" in result_text(results[10]) and "not found" in result_text(results[11])
    assert (ctx.worktree / "evaluate.py").read_text() == EVALUATE_PY
    assert (ctx.worktree / "candidate/train.py").read_text() == TRAIN_PY
    assert outside.read_text() == "SECRET-OUTSIDE"
    assert not (tmp_path.parent / "autorl-escape.txt").exists()
    assert not __import__("pathlib").Path("/tmp/autorl-escape.txt").exists()


def test_retries_after_529_and_after_429_honouring_retry_after(tmp_path):
    ctx = make_context(tmp_path)
    script = [overloaded(), rate_limited(1.0), tool_turn(("submit", {"description": "ok"}))]
    with FakeAnthropic(script) as server:
        proposal = make_agent(server, sdk_retries=2).propose(ctx)
    first, second, third = server.message_requests
    assert proposal.description == "ok"
    assert third["time"] - second["time"] >= 1.0          # retry-after: 1 was honoured
    assert second["time"] - first["time"] < 1.0            # 529: the SDK's short backoff
    assert [r["headers"].get("x-stainless-retry-count") for r in server.message_requests] == ["0", "1", "2"]
    assert not any(e["event"] == "outage" for e in transcript_events(ctx))


def test_a_long_outage_is_waited_out_and_logged(tmp_path, caplog):
    ctx = make_context(tmp_path)
    script = [overloaded() for _ in range(6)] + [tool_turn(("submit", {"description": "after"}))]
    waits = []

    def sleep(seconds):
        waits.append(seconds)
        time.sleep(seconds)

    with FakeAnthropic(script) as server:
        agent = make_agent(server, sdk_retries=1, sleep=sleep,
                           retry=RetrySettings(outage_wait_s=0.02, outage_max_wait_s=0.05))
        with caplog.at_level("WARNING"):
            proposal = agent.propose(ctx)
    assert proposal.description == "after"
    assert len(server.message_requests) == 7
    assert len(waits) == 3 and all(0.01 <= wait <= 0.05 for wait in waits)
    outages = [e for e in transcript_events(ctx) if e["event"] == "outage"]
    assert [e["status"] for e in outages] == [529, 529, 529]
    assert "waiting" in caplog.text


def test_a_request_that_times_out_is_retried(tmp_path):
    ctx = make_context(tmp_path)
    script = [slow(tool_turn(("submit", {"description": "too late"})), 2.0),
              tool_turn(("submit", {"description": "in time"}))]
    with FakeAnthropic(script) as server:
        proposal = make_agent(server, timeout_s=0.5).propose(ctx)
    assert proposal.description == "in time"


def test_max_turns_without_submit_returns_what_was_done(tmp_path):
    ctx = make_context(tmp_path)
    script = [tool_turn(("edit_file", {"path": "candidate/train.py", "old": "NUM_ENVS = 8",
                                       "new": "NUM_ENVS = 16"}), text="Doubling the envs."),
              tool_turn(("read_file", {"path": "candidate/train.py"}))]
    with FakeAnthropic(script) as server:
        proposal = make_agent(server, max_turns=2).propose(ctx)
    assert len(server.message_requests) == 2
    assert "max-turns 2" in proposal.description and "Doubling the envs." in proposal.description
    assert proposal.extra["end_reason"] == "max_turns"
    assert "NUM_ENVS = 16" in (ctx.worktree / "candidate/train.py").read_text()


def test_a_model_that_only_talks_is_nudged_then_stopped(tmp_path):
    ctx = make_context(tmp_path)
    script = [text_turn("Should I change the learning rate?"), text_turn("Shall I?"),
              text_turn("I would raise it.")]
    with FakeAnthropic(script) as server:
        proposal = make_agent(server).propose(ctx)
    second = server.message_requests[1]["body"]["messages"]
    assert second[-1]["role"] == "user" and "submit" in second[-1]["content"][0]["text"]
    assert proposal.extra["end_reason"] == "no_tool_use"
    assert "I would raise it." in proposal.description


def test_spending_stops_at_max_cost_within_an_experiment(tmp_path):
    ctx = make_context(tmp_path)
    ctx.run_dir.mkdir(parents=True, exist_ok=True)
    (ctx.run_dir / "results.tsv").write_text(
        "exp\tstatus\tcost_usd\tdescription\n0\tbaseline\t\tbaseline\n1\tdiscard\t0.25\tx\n2\tkeep\t0.")
    # Each turn costs 1 Mtok input = $3; the run already spent $0.25 (the torn last row is ignored).
    turn = lambda: tool_turn(("list_files", {"path": "."}), usage_fields=usage(1_000_000, 0))
    with FakeAnthropic([turn(), turn(), turn()]) as server:
        proposal = make_agent(server, model="claude-sonnet-4-6", max_cost_usd=5.0).propose(ctx)
    assert len(server.message_requests) == 2
    assert proposal.cost_usd == pytest.approx(6.0)
    assert proposal.extra["end_reason"] == "max_cost" and "--max-cost" in proposal.description


def test_api_errors_that_retrying_cannot_fix(tmp_path):
    ctx = make_context(tmp_path)
    with FakeAnthropic([error(400, "invalid_request_error", "bad model")]) as server:
        with pytest.raises(AgentError, match="bad model"):
            make_agent(server).propose(ctx)
    with FakeAnthropic([error(401, "authentication_error", "invalid x-api-key")]) as server:
        with pytest.raises(AgentConfigError, match="ANTHROPIC_API_KEY"):
            make_agent(server).propose(ctx)
    # Later in a conversation (e.g. the context window is full) the edits so far are judged.
    script = [tool_turn(("list_files", {"path": "."})),
              error(400, "invalid_request_error", "prompt is too long")]
    with FakeAnthropic(script) as server:
        proposal = make_agent(server).propose(ctx)
    assert proposal.extra["end_reason"] == "api_error"


def test_from_args_needs_an_api_key_and_reads_the_base_url(tmp_path, monkeypatch):
    args = Namespace(model=None, max_turns=None, price_table=None, max_cost=None)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(AgentConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicAgent.from_args(args, tmp_path)

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-from-env")
    monkeypatch.setenv("AUTORL_AGENT_SDK_RETRIES", "0")
    ctx = make_context(tmp_path)
    with FakeAnthropic([tool_turn(("submit", {"description": "via env"}))]) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        agent = AnthropicAgent.from_args(args, tmp_path)
        assert (agent.model, agent.max_turns) == (DEFAULT_MODEL, 40)
        assert agent.propose(ctx).description == "via env"
    (request,) = server.message_requests
    assert request["path"] == "/v1/messages"
    assert request["headers"]["authorization"] == "Bearer sk-from-env"
    assert request["body"]["model"] == "claude-sonnet-5-5"

    with pytest.raises(AgentConfigError, match="no price known for model 'gpt-5'"):
        AnthropicAgent.from_args(Namespace(model="gpt-5", max_turns=3), tmp_path)
    with pytest.raises(AgentConfigError, match="--max-turns"):
        AnthropicAgent.from_args(Namespace(max_turns=-1), tmp_path)


def test_a_user_price_table_overrides_and_extends_the_prices(tmp_path, monkeypatch):
    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"my-proxy-model": {"input": 1.0, "output": 2.0},
                                 "claude-sonnet-4-5": {"input": 10.0, "output": 20.0,
                                                       "cache_write": 0.0, "cache_read": 0.0}}))
    prices = PriceTable.load(table)
    assert prices.price_for("my-proxy-model").cache_read == pytest.approx(0.1)
    assert prices.price_for("claude-sonnet-4-5-20250929").input == 10.0
    assert PriceTable.load().price_for("claude-sonnet-4-5-20250929").input == 3.0

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    agent = AnthropicAgent.from_args(Namespace(model="my-proxy-model", price_table=str(table)), tmp_path)
    ctx = make_context(tmp_path)
    with FakeAnthropic([tool_turn(("submit", {"description": "x"}),
                                  usage_fields=usage(1_000_000, 1_000_000))]) as server:
        agent.client = agent.client.with_options(base_url=server.url)
        assert agent.propose(ctx).cost_usd == pytest.approx(3.0)

    table.write_text(json.dumps({"m": {"input": "cheap", "output": 1}}))
    with pytest.raises(AgentConfigError, match="non-negative number"):
        AnthropicAgent.from_args(Namespace(model="m", price_table=str(table)), tmp_path)
    with pytest.raises(AgentConfigError, match="does not exist"):
        AnthropicAgent.from_args(Namespace(price_table=str(tmp_path / "nope.json")), tmp_path)


def test_thinking_blocks_go_back_to_the_api_unchanged(tmp_path):
    # Current models think adaptively; their thinking blocks must be returned with their signature.
    ctx = make_context(tmp_path)
    thinking = {"type": "thinking", "thinking": "The lr is low.", "signature": "sig-abc123"}
    first = tool_turn(("read_file", {"path": "candidate/train.py"}))
    first.body["content"].insert(0, thinking)
    with FakeAnthropic([first, tool_turn(("submit", {"description": "x"}))]) as server:
        make_agent(server).propose(ctx)
    assistant = server.message_requests[1]["body"]["messages"][1]
    assert assistant["role"] == "assistant" and assistant["content"][0] == thinking


def test_an_outage_given_up_on_reports_what_was_spent(tmp_path):
    ctx = make_context(tmp_path)
    script = [tool_turn(("list_files", {"path": "."}), usage_fields=usage(1_000_000, 0)),
              overloaded(), overloaded(), overloaded(), overloaded()]
    with FakeAnthropic(script) as server:
        agent = make_agent(server, model="claude-sonnet-4-6", sdk_retries=1,
                           retry=RetrySettings(outage_wait_s=0.01, max_outage_waits=1))
        with pytest.raises(AgentError, match="still unavailable") as raised:
            agent.propose(ctx)
    assert raised.value.cost_usd == pytest.approx(3.0)   # the loop adds it to the run's cost
    assert transcript_events(ctx)[-1]["event"] == "aborted"


def test_a_model_about_to_retire_is_warned_about(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    with caplog.at_level("WARNING"):
        AnthropicAgent.from_args(Namespace(model="claude-sonnet-4-5"), tmp_path)
    assert "claude-sonnet-4-5 is deprecated and retires on November 30th, 2026" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        AnthropicAgent.from_args(Namespace(model=DEFAULT_MODEL), tmp_path)
    assert "deprecated" not in caplog.text
