"""Agent kinds, one file each (see base.py for the interface), and the one place where each kind
declares its `run` options: the CLI adds them, `run.json` keeps them for `--resume`.

Modules are imported lazily (`make_agent`) so an offline run never imports the LLM SDKs.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

from .base import Agent


@dataclass
class AgentKind:
    name: str
    target: str                     # "module:Class", imported only when the agent is made
    title: str                      # the CLI's argument group
    options: list[tuple[str, dict]] = field(default_factory=list)   # (flag, argparse keywords)
    path_options: tuple[str, ...] = ()                               # resolved to absolute paths


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(text)
    return value


# Defaults live in the agents (None here), so a --resume can tell what was given.
KINDS = {kind.name: kind for kind in (
    AgentKind("optuna", "orchestrator.agents.optuna_agent:OptunaAgent", "optuna agent (offline default)", [
        ("--optuna-params", dict(metavar="NAME,NAME", help="tune only these constants of the hyperparameter "
                                                             "block (default: all numeric)")),
        ("--optuna-sampler", dict(choices=("local", "tpe", "random"),
                                  help="local (default: the neighbourhood of the best, see README), or Optuna's "
                                       "plain TPE or random search over the same constants (what bench/nights.py "
                                       "compares it with)"))]),
    AgentKind("replay", "orchestrator.agents.replay:ReplayAgent", "replay agent", [
        ("--replay-dir", dict(metavar="DIR", help="folders DIR/001/, DIR/002/, ... of files to apply"))],
        path_options=("replay_dir",)),
    AgentKind("anthropic", "orchestrator.agents.anthropic_agent:AnthropicAgent", "anthropic agent", [
        ("--model", dict(help="anthropic model (default: the agent's current default, see README)")),
        ("--max-turns", dict(type=_positive_int, help="tool-use turns per experiment (default 40)")),
        ("--price-table", dict(metavar="FILE.json", help="USD per million tokens, per model"))]),
    AgentKind("command", "orchestrator.agents.command:CommandAgent", "command agent (an external coding CLI)", [
        ("--agent-cmd", dict(metavar="TEMPLATE", help="shell template with {prompt_file} or {prompt}")),
        ("--agent-timeout", dict(type=_positive_float, metavar="SECONDS",
                                 help="time limit per experiment (default 1800)"))]),
)}
AGENT_KINDS = tuple(KINDS)
CREATE_AGENT_KINDS = ("anthropic", "command", "replay")   # those that can write a new environment's files


def add_agent_arguments(parser, kinds=AGENT_KINDS) -> None:
    for kind in (KINDS[name] for name in kinds):
        group = parser.add_argument_group(kind.title)
        for flag, keywords in kind.options:
            group.add_argument(flag, **keywords)


def option_names() -> list[str]:
    """Every agent option's argparse name: what a resume without --agent takes over."""
    return [flag.lstrip("-").replace("-", "_") for kind in KINDS.values() for flag, _ in kind.options]


def given_options(args) -> dict:
    """The agent options given on the command line (paths made absolute), for run.json."""
    paths = {name for kind in KINDS.values() for name in kind.path_options}
    options = {}
    for name in option_names():
        value = getattr(args, name, None)
        if value is not None:
            options[name] = str(Path(value).resolve()) if name in paths else value
    return options


def restore_options(args, stored: dict) -> None:
    for name, value in stored.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def make_agent(args, run_dir: Path) -> Agent:
    name = getattr(args, "agent", None)
    if name not in KINDS:
        raise ValueError(f"unknown agent {name!r}; choose one of {', '.join(AGENT_KINDS)}")
    module, _, cls = KINDS[name].target.partition(":")
    return getattr(importlib.import_module(module), cls).from_args(args, run_dir)
