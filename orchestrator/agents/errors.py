"""Errors the agents raise besides those of base.py."""
from __future__ import annotations


class AgentConfigError(ValueError):
    """The agent cannot be set up as asked (missing API key, bad --agent-cmd, unknown model price).

    Raised by `from_args` before anything starts; the CLI prints the message and exits non-zero.
    """
