"""`--agent anthropic`: a tool-use loop on the Messages API with the official anthropic SDK.

Each experiment is a fresh conversation: the stable prefix (tool definitions and the system prompt
with program.md and the phase's instructions) is under prompt caching, the experiment prompt
follows. The model works through the tools of tools.py until it calls submit, or until
--max-turns is reached (the loop then judges whatever diff it left).

Failures of the API: the SDK itself retries 408/409/429/5xx/529 and timeouts with exponential
backoff and jitter, honouring `retry-after`. When it gives up, a long outage is assumed: this
agent waits (doubling, with jitter, capped) and tries again, logging each wait, for as long as it
takes. The waits are set through the constructor or the AUTORL_AGENT_* environment variables.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import anthropic

from orchestrator.results import ExpFolder, RunFolder
from orchestrator.agents.base import AgentContext, AgentError, Outcome, Proposal
from orchestrator.agents.errors import AgentConfigError
from orchestrator.agents.pricing import PriceTable, PricingError, TokenUsage
from orchestrator.agents.prompt import experiment_prompt, one_line, system_prompt
from orchestrator.agents.tools import TOOL_DEFINITIONS, Toolbox, ToolResult

log = logging.getLogger(__name__)

DEFAULT_MODEL = "claude-sonnet-5-5"   # claude-sonnet-4-5 retires on 2026-11-30
DEFAULT_MAX_TURNS = 40
DEFAULT_MAX_TOKENS = 16_000
MAX_IDLE_TURNS = 3          # replies without any tool call before the experiment is ended
CACHE = {"type": "ephemeral"}
TRANSIENT_STATUS = {408, 409, 429}   # plus every 5xx (529 overloaded included)


@dataclass
class RetrySettings:
    sdk_max_retries: int = 4           # the SDK's own quick retries (0.5 s doubling to 8 s)
    request_timeout_s: float = 600.0   # one request; the SDK retries a timed-out request
    outage_wait_s: float = 10.0        # first wait once the SDK has given up
    outage_max_wait_s: float = 600.0   # the waits double up to this
    max_outage_waits: Optional[int] = None   # None: wait for as long as the outage lasts

    @classmethod
    def from_env(cls, env: Optional[dict] = None) -> "RetrySettings":
        env = os.environ if env is None else env
        settings = cls()
        for name, attribute, kind in (
            ("AUTORL_AGENT_SDK_RETRIES", "sdk_max_retries", int),
            ("AUTORL_AGENT_REQUEST_TIMEOUT", "request_timeout_s", float),
            ("AUTORL_AGENT_OUTAGE_WAIT", "outage_wait_s", float),
            ("AUTORL_AGENT_OUTAGE_MAX_WAIT", "outage_max_wait_s", float),
            ("AUTORL_AGENT_MAX_OUTAGE_WAITS", "max_outage_waits", int),
        ):
            if env.get(name):
                try:
                    value = kind(env[name])
                except ValueError:
                    raise AgentConfigError(f"{name}={env[name]!r} is not a number") from None
                if value < 0:
                    raise AgentConfigError(f"{name} must not be negative")
                setattr(settings, attribute, value)
        return settings


class AnthropicAgent:
    name = "anthropic"

    def __init__(self, client: anthropic.Anthropic, model: str = DEFAULT_MODEL,
                 max_turns: int = DEFAULT_MAX_TURNS, prices: Optional[PriceTable] = None,
                 retry: Optional[RetrySettings] = None, max_tokens: int = DEFAULT_MAX_TOKENS,
                 max_cost_usd: Optional[float] = None, run_timeout_s: float = 600,
                 sleep: Callable[[float], None] = time.sleep):
        if max_turns < 1:
            raise AgentConfigError(f"--max-turns must be at least 1, not {max_turns}")
        self.client = client
        self.model = model
        self.max_turns = max_turns
        self.prices = prices or PriceTable.load()
        try:
            self.prices.price_for(model)
        except PricingError as err:
            raise AgentConfigError(str(err)) from None
        self.retry = retry or RetrySettings()
        self.max_tokens = max_tokens
        self.max_cost_usd = max_cost_usd
        self.run_timeout_s = run_timeout_s
        self.sleep = sleep

    @classmethod
    def from_args(cls, args: Any, run_dir: Path) -> "AnthropicAgent":
        """Build from the `run` command's arguments; raises AgentConfigError before anything starts."""
        api_key = os.environ.get("ANTHROPIC_API_KEY", "").strip()
        if not api_key:
            raise AgentConfigError(
                "--agent anthropic needs ANTHROPIC_API_KEY in the environment "
                "(export ANTHROPIC_API_KEY=...; ANTHROPIC_BASE_URL optionally points at a proxy), "
                "or use --agent optuna, which runs offline"
            )
        try:
            prices = PriceTable.load(getattr(args, "price_table", None))
        except PricingError as err:
            raise AgentConfigError(str(err)) from None
        retry = RetrySettings.from_env()
        max_cost = getattr(args, "max_cost", None)
        model = getattr(args, "model", None) or DEFAULT_MODEL
        retirement = _retirement_date(model)
        if retirement:
            log.warning("model %s is deprecated and retires on %s; after that every request fails "
                        "(choose a current model with --model, e.g. %s)", model, retirement,
                        DEFAULT_MODEL)
        # ANTHROPIC_BASE_URL, when set, is read by the SDK itself.
        client = anthropic.Anthropic(api_key=api_key, max_retries=retry.sdk_max_retries,
                                     timeout=retry.request_timeout_s)
        return cls(client, model=model,
                   max_turns=int(getattr(args, "max_turns", None) or DEFAULT_MAX_TURNS),
                   prices=prices, retry=retry,
                   max_cost_usd=float(max_cost) if max_cost is not None else None)

    # -- the Agent interface --------------------------------------------------------------------

    def propose(self, ctx: AgentContext) -> Proposal:
        transcript = Transcript(ExpFolder(ctx.exp_dir).transcript)
        system = system_prompt(ctx.program, ctx.phase)
        prompt = experiment_prompt(ctx)
        transcript.write(event="start", exp=ctx.exp, phase=ctx.phase, model=self.model,
                         max_turns=self.max_turns, system=system, prompt=prompt,
                         tools=[tool["name"] for tool in TOOL_DEFINITIONS])
        conversation = Conversation(
            system=system,
            messages=[{"role": "user", "content": [{"type": "text", "text": prompt}]}],
            toolbox=Toolbox(ctx.worktree, ctx.allowed_paths, notes_path=ctx.notes_path,
                            scratch_dir=Path(ctx.exp_dir) / "agent_scratch",
                            max_run_timeout_s=self.run_timeout_s,
                            extra_env={"AUTORL_ENV_ID": ctx.env_id}, sandbox=ctx.sandbox,
                            hidden=tuple(p for p in (ctx.main_root, ctx.run_dir) if p)),
            transcript=transcript,
            spent_before=run_cost_so_far(ctx.run_dir),
        )
        try:
            self._converse(conversation)
        except BaseException as err:
            # An outage given up on, a stop signal: the loop still counts what was spent.
            err.cost_usd = conversation.cost
            transcript.write(event="aborted", error=f"{type(err).__name__}: {err}",
                             cost_usd=round(conversation.cost, 6))
            raise
        description = self._description(conversation)
        usage = conversation.usage
        transcript.write(event="end", reason=conversation.end_reason, description=description,
                         cost_usd=round(conversation.cost, 6), usage=_usage_dict(usage))
        log.info("agent: experiment %d ended (%s) after %d turns, cost $%.4f", ctx.exp,
                 conversation.end_reason, conversation.turns, conversation.cost)
        return Proposal(
            description=description, cost_usd=conversation.cost,
            input_tokens=usage.input_tokens, output_tokens=usage.output_tokens,
            cache_write_tokens=usage.cache_write_tokens, cache_read_tokens=usage.cache_read_tokens,
            transcript=transcript.path,
            extra={"end_reason": conversation.end_reason, "model": self.model,
                   "turns": conversation.turns},
        )

    def _converse(self, conv: "Conversation") -> None:
        """Model turns and tool calls until submit, --max-turns, the cost cap or an ending error."""
        idle_turns = 0
        for turn in range(1, self.max_turns + 1):
            if self.max_cost_usd is not None and conv.spent_before + conv.cost >= self.max_cost_usd:
                conv.end_reason = "max_cost"
                return
            try:
                response = self._create(conv.system, conv.messages, conv.transcript)
            except anthropic.APIStatusError as err:
                if turn == 1:
                    raise AgentError(f"the Messages API refused the request: {err}") from err
                # Typically a conversation grown past the context window: judge what is there.
                conv.transcript.write(event="api_error", turn=turn, error=str(err))
                conv.end_reason = "api_error"
                return
            conv.turns = turn
            turn_usage = TokenUsage.from_api(getattr(response, "usage", None))
            turn_cost = self.prices.cost_usd(self.model, turn_usage)
            conv.usage, conv.cost = conv.usage + turn_usage, conv.cost + turn_cost
            content = [block for block in map(_as_param, getattr(response, "content", None) or [])
                       if block is not None]
            stop_reason = getattr(response, "stop_reason", None)
            conv.transcript.write(event="response", turn=turn, stop_reason=stop_reason,
                                  content=content, usage=_usage_dict(turn_usage),
                                  cost_usd=round(turn_cost, 6))
            conv.messages.append({"role": "assistant",
                                  "content": content or [{"type": "text", "text": "(no reply)"}]})
            texts = [block["text"] for block in content if block.get("type") == "text"]
            if texts and texts[-1].strip():
                conv.last_text = texts[-1]
            tool_uses = [block for block in content if block.get("type") == "tool_use"]

            if not tool_uses:
                if stop_reason == "refusal":
                    conv.end_reason = "refusal"
                    return
                idle_turns += 1
                if idle_turns >= MAX_IDLE_TURNS:
                    conv.end_reason = "no_tool_use"
                    return
                conv.messages.append({"role": "user", "content": [{"type": "text", "text": (
                    "You ended your turn without calling submit. Continue with the tools; when "
                    "your change is ready, call submit with a one-line description.")}]})
                continue
            idle_turns = 0

            results = []
            for block in tool_uses:
                if stop_reason == "max_tokens":
                    # The reply was cut: this call's input may be incomplete, so it is not run.
                    result = ToolResult(
                        f"your reply hit the {self.max_tokens}-token output limit, so this "
                        f"{block['name']} call was not run; write smaller pieces (edit_file)",
                        is_error=True)
                else:
                    result = conv.toolbox.call(block["name"], block.get("input"))
                conv.transcript.write(event="tool", turn=turn, name=block["name"],
                                      input=block.get("input"), is_error=result.is_error,
                                      result=result.content)
                if result.submitted is not None and conv.submitted is None:
                    conv.submitted = result.submitted
                results.append({"type": "tool_result", "tool_use_id": block["id"],
                                "content": result.content, "is_error": result.is_error})
            conv.messages.append({"role": "user", "content": results})
            if conv.submitted is not None:
                conv.end_reason = "submit"
                return
        conv.end_reason = "max_turns"

    def tell(self, ctx: AgentContext, outcome: Outcome) -> None:
        # Each experiment starts a fresh conversation; the outcome reaches the next one through
        # the results table. Record it next to the transcript for the human.
        Transcript(ExpFolder(ctx.exp_dir).transcript).write(
            event="outcome", status=outcome.status, score=outcome.score, best=outcome.best)

    # -- the API --------------------------------------------------------------------------------

    def _create(self, system: str, messages: list[dict], transcript: "Transcript"):
        """One Messages API call, waiting out outages for as long as they last."""
        waits = 0
        while True:
            try:
                return self.client.messages.create(
                    model=self.model, max_tokens=self.max_tokens,
                    system=[{"type": "text", "text": system, "cache_control": CACHE}],
                    tools=_cached_tools(), messages=_with_cache_breakpoint(messages),
                )
            except (anthropic.APIConnectionError, anthropic.APIStatusError) as err:
                status = getattr(err, "status_code", None)
                if isinstance(err, anthropic.AuthenticationError):
                    raise AgentConfigError(f"the Messages API rejected ANTHROPIC_API_KEY: {err}") from err
                transient = status is None or status in TRANSIENT_STATUS or status >= 500
                if not transient:
                    raise
                if self.retry.max_outage_waits is not None and waits >= self.retry.max_outage_waits:
                    raise AgentError(f"the Messages API is still unavailable after {waits} waits: "
                                     f"{err}") from err
                wait = self._outage_wait(waits, err)
                waits += 1
                reason = f"HTTP {status}" if status is not None else type(err).__name__
                log.warning("anthropic API unavailable (%s); the SDK's retries are spent; "
                            "waiting %.1f s before trying again (wait %d)", reason, wait, waits)
                transcript.write(event="outage", status=status, error=str(err)[:500],
                                 wait_s=round(wait, 3), wait_number=waits)
                self.sleep(wait)

    def _outage_wait(self, waits_so_far: int, err: Exception) -> float:
        backoff = min(self.retry.outage_max_wait_s, self.retry.outage_wait_s * 2 ** waits_so_far)
        wait = backoff * random.uniform(0.5, 1.0)
        retry_after = _retry_after_s(err)
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.retry.outage_max_wait_s))
        return wait

    def _description(self, conv: "Conversation") -> str:
        if conv.end_reason == "submit":
            return one_line(conv.submitted or "") or "agent edit (submitted without a description)"
        note = {
            "max_turns": f"no submit within --max-turns {self.max_turns}",
            "max_cost": "stopped early: --max-cost reached",
            "no_tool_use": "agent stopped using its tools without submitting",
            "refusal": "agent refused",
            "api_error": "conversation ended by an API error",
        }[conv.end_reason]
        detail = one_line(conv.last_text)
        return one_line(f"[{note}] {detail}" if detail else f"[{note}]")


@dataclass
class Conversation:
    """One experiment's conversation and what it has cost so far."""
    system: str
    messages: list[dict]
    toolbox: Toolbox
    transcript: "Transcript"
    spent_before: float = 0.0          # the run's agent cost before this experiment
    usage: TokenUsage = field(default_factory=TokenUsage)
    cost: float = 0.0
    turns: int = 0
    last_text: str = ""
    submitted: Optional[str] = None
    end_reason: str = "max_turns"


class Transcript:
    """One JSON object per line, appended and flushed as the conversation goes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, **record: Any) -> None:
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record}
        with self.path.open("a") as file:
            file.write(json.dumps(record, default=str) + "\n")


def run_cost_so_far(run_dir: Path) -> float:
    """The agent cost already recorded in results.tsv (a torn last line is ignored)."""
    path = RunFolder(run_dir).results
    if not path.exists():
        return 0.0
    total = 0.0
    with path.open(newline="") as file:
        for row in csv.DictReader(file, delimiter="\t"):
            try:
                total += float(row.get("cost_usd") or 0)
            except (TypeError, ValueError):
                continue
    return total


def _cached_tools() -> list[dict]:
    tools = [dict(tool) for tool in TOOL_DEFINITIONS]
    tools[-1]["cache_control"] = CACHE
    return tools


def _with_cache_breakpoint(messages: list[dict]) -> list[dict]:
    """A copy of the conversation with a cache breakpoint on its last block, so each turn reads
    the previous turns from the cache instead of paying for them again."""
    copied = [dict(message, content=list(message["content"])) for message in messages]
    last = copied[-1]["content"]
    last[-1] = dict(last[-1], cache_control=CACHE)
    return copied


def _as_param(block: Any) -> Optional[dict]:
    """A response content block as a request content block."""
    data = block.to_dict(mode="json", exclude_none=True)
    kind = data.get("type")
    if kind == "text":
        return {"type": "text", "text": data["text"]} if data.get("text") else None
    if kind == "tool_use":
        return {"type": "tool_use", "id": data["id"], "name": data["name"],
                "input": data.get("input") or {}}
    return data   # thinking blocks and the like go back unchanged (signatures included)


def _retry_after_s(err: Exception) -> Optional[float]:
    response = getattr(err, "response", None)
    if response is None:
        return None
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _usage_dict(usage: TokenUsage) -> dict:
    return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
            "cache_read_tokens": usage.cache_read_tokens}


def _retirement_date(model: str) -> Optional[str]:
    """The retirement date the SDK knows for a deprecated model, else None."""
    try:
        from anthropic._data import DEPRECATED_MODELS
    except ImportError:   # an SDK without the list: nothing to warn about
        return None
    return DEPRECATED_MODELS.get(model)
