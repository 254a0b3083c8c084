"""Agent kinds, one file each; see base.py for the interface.

`make_agent(args, run_dir)` builds the agent named by `args.agent` from the `run` command's
arguments. Modules are imported lazily so an offline run never imports the LLM SDKs.
"""
from __future__ import annotations

from pathlib import Path

from .base import Agent

AGENT_KINDS = ("optuna", "replay", "anthropic", "command")


def make_agent(args, run_dir: Path) -> Agent:
    kind = getattr(args, "agent", None)
    if kind == "replay":
        from .replay import ReplayAgent

        return ReplayAgent.from_args(args, run_dir)
    if kind == "optuna":
        from .optuna_agent import OptunaAgent

        return OptunaAgent.from_args(args, run_dir)
    if kind == "anthropic":
        from .anthropic_agent import AnthropicAgent

        return AnthropicAgent.from_args(args, run_dir)
    if kind == "command":
        from .command import CommandAgent

        return CommandAgent.from_args(args, run_dir)
    raise ValueError(f"unknown agent {kind!r}; choose one of {', '.join(AGENT_KINDS)}")
