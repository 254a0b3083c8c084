"""`--agent command --agent-cmd TEMPLATE`: an external coding CLI (Claude Code, Codex, ...).

The prompt (prompt.py) is written to exp_dir/prompt.md; the template gets it through the
placeholders `{prompt_file}` (the file's path) and `{prompt}` (the text), both shell-quoted. The
command runs through bash in the worktree, with the scrubbed environment, stdin from /dev/null, in
its own process group, killed as a group at --agent-timeout. Its stdout goes to exp_dir/agent.log
and its stderr to exp_dir/agent.err.log. The daemon judges only the diff it leaves.

The one-line description is the last `DESCRIPTION: ...` line of the output, else its last
non-empty line. When the output is Claude Code's `--output-format json` result, its `result` text
is used that way and its `total_cost_usd` becomes the experiment's cost.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import re
import shlex
import shutil
from pathlib import Path
from typing import Any, Optional

import git

from orchestrator.agents.base import AgentContext, AgentError, Outcome, Proposal
from orchestrator.agents.errors import AgentConfigError
from orchestrator.agents.prompt import command_prompt, one_line
from orchestrator.processes import run_group, scrubbed_env
from orchestrator.results import ExpFolder
from orchestrator.sandbox import Sandbox, Walls

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1800
PLACEHOLDERS = ("{prompt_file}", "{prompt}")
# Names of variables passed to the agent command although the scrub would drop them, e.g.
# AUTORL_AGENT_PASS_ENV=OPENAI_API_KEY for a CLI that is not logged in. Never reaches train.py.
PASS_ENV_VARIABLE = "AUTORL_AGENT_PASS_ENV"
SHELL_WORDS = {"cd", "exec", "set", "export", "source", ".", "env", "time", "nice", "timeout"}
DESCRIPTION_LINE = re.compile(r"^\W*description\W*:\s*(.+)$", re.IGNORECASE)
MAX_PROMPT_ARG_BYTES = 120_000   # Linux refuses a single argument over 128 KiB


class CommandAgent:
    name = "command"

    def __init__(self, template: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 pass_env: tuple[str, ...] = ()):
        self.template = check_template(template)
        if timeout_s <= 0:
            raise AgentConfigError(f"--agent-timeout must be positive, not {timeout_s}")
        self.timeout_s = timeout_s
        self.pass_env = pass_env

    @classmethod
    def from_args(cls, args: Any, run_dir: Path) -> "CommandAgent":
        template = getattr(args, "agent_cmd", None)
        if not template:
            raise AgentConfigError(
                '--agent command needs --agent-cmd "TEMPLATE", e.g. '
                "--agent-cmd 'claude -p --permission-mode acceptEdits < {prompt_file}' "
                "({prompt_file} is the prompt's path, {prompt} its text)")
        timeout = getattr(args, "agent_timeout", None) or DEFAULT_TIMEOUT_S
        names = os.environ.get(PASS_ENV_VARIABLE, "")
        pass_env = tuple(name.strip() for name in names.split(",") if name.strip())
        return cls(template, timeout_s=float(timeout), pass_env=pass_env)

    def propose(self, ctx: AgentContext) -> Proposal:
        exp_dir = Path(ctx.exp_dir)
        prompt = command_prompt(ctx)
        prompt_file = ExpFolder(exp_dir).prompt
        prompt_file.write_text(prompt)
        if "{prompt}" in self.template and len(prompt.encode()) > MAX_PROMPT_ARG_BYTES:
            raise AgentError(f"the prompt ({len(prompt.encode())} bytes) is too long for one "
                             f"command-line argument; use {{prompt_file}} in --agent-cmd instead")
        command = render(self.template, prompt_file, prompt)
        env = scrubbed_env({"PYTHONDONTWRITEBYTECODE": "1"})
        env.update({name: os.environ[name] for name in self.pass_env if name in os.environ})
        stdout_path, stderr_path = ExpFolder(exp_dir).agent_log, ExpFolder(exp_dir).agent_err
        log.info("agent: running %s (timeout %.0f s)", self.template, self.timeout_s)
        # A stop signal raised while the CLI runs still kills its group (run_group's finally).
        # Walled where bubblewrap works: a coding CLI may live anywhere and needs the network (its
        # API), $HOME (its login) and /tmp, so the machine stays visible read-only; only the worktree,
        # $HOME and /tmp are writable, and the user's checkout and the run folder (held-out seed) are
        # hidden.
        hidden = [p for p in (ctx.main_root, ctx.run_dir) if p]
        walls = Walls(cwd=Path(ctx.worktree), read_only=[Path("/"), prompt_file],
                      writable=[Path(ctx.worktree), Path(tempfile.gettempdir())], network=True, home=True,
                      private_tmp=False, masked=hidden, hidden=hidden)
        result = run_group(["bash", "-c", command], Path(ctx.worktree), env, stdout_path, self.timeout_s,
                           should_stop=lambda: False, stderr_path=stderr_path, walls=walls,
                           sandbox=Sandbox(ctx.sandbox))
        timed_out = result.timed_out
        output = stdout_path.read_text(errors="replace")
        description, cost = parse_output(output)
        extra = {"exit_code": result.returncode, "timed_out": timed_out,
                 "seconds": round(result.wall_s, 1), "stderr": str(stderr_path)}
        if timed_out:
            description = one_line(f"[agent command timed out after {self.timeout_s:.0f} s] "
                                   + (description or ""))
        elif result.returncode != 0 and not worktree_changed(ctx.worktree):
            last_error = _last_line(stderr_path.read_text(errors="replace")) or _last_line(output)
            raise AgentError(f"agent command exited with code {result.returncode} and changed "
                             f"nothing: {last_error or '(no output)'} (see {stderr_path})")
        return Proposal(description=description or "command agent edit (no description given)",
                        cost_usd=cost, transcript=stdout_path, extra=extra)

    def tell(self, ctx: AgentContext, outcome: Outcome) -> None:
        """The CLI starts afresh each experiment and reads the results table in its prompt."""


def check_template(template: str) -> str:
    if not isinstance(template, str) or not template.strip():
        raise AgentConfigError("--agent-cmd is empty")
    if not any(placeholder in template for placeholder in PLACEHOLDERS):
        raise AgentConfigError(
            f"--agent-cmd {template!r} contains neither {{prompt_file}} nor {{prompt}}, so the "
            "coding CLI would never see the prompt")
    try:
        words = shlex.split(template)
    except ValueError as err:
        raise AgentConfigError(f"--agent-cmd {template!r} is not a valid shell command: {err}") from None
    program = words[0] if words else ""
    checkable = program and not any(char in program for char in "=${}()<>|&;")
    if checkable and program not in SHELL_WORDS and shutil.which(program) is None:
        raise AgentConfigError(f"--agent-cmd runs {program!r}, which is not on PATH")
    return template


def render(template: str, prompt_file: Path, prompt: str) -> str:
    """The template with its placeholders shell-quoted (quotes the user put around one are
    dropped first, so `"{prompt}"` works as well as `{prompt}`)."""
    values = {"{prompt_file}": shlex.quote(str(prompt_file)), "{prompt}": shlex.quote(prompt)}
    pattern = re.compile(r"""(["']?)(\{prompt_file\}|\{prompt\})\1""")
    return pattern.sub(lambda match: values[match.group(2)], template)


def parse_output(output: str) -> tuple[Optional[str], float]:
    """(description, cost in USD) from the CLI's stdout."""
    cost = 0.0
    text = output
    result = _claude_json_result(output)
    if result is not None:
        text = str(result.get("result") or "")
        try:
            cost = float(result.get("total_cost_usd") or 0.0)
        except (TypeError, ValueError):
            cost = 0.0
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        match = DESCRIPTION_LINE.match(line)
        if match:
            return one_line(match.group(1)), cost
    return (one_line(lines[-1].strip("`*# ")) if lines else None), cost


def _claude_json_result(output: str) -> Optional[dict]:
    """Claude Code's final `{"type": "result", ...}` object (json or stream-json output)."""
    candidates = [output.strip()] + [line for line in reversed(output.splitlines()) if line.strip()]
    for candidate in candidates:
        if not candidate.startswith("{"):
            continue
        try:
            data = json.loads(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and data.get("type") == "result":
            return data
    return None


def worktree_changed(worktree: Path) -> bool:
    return git.Repo(worktree).is_dirty(untracked_files=True)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
