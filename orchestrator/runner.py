"""Runs one experiment's processes: train+eval, or verify+bench (local subprocess, Modal)."""
from __future__ import annotations

import os

# A variable whose name contains one of these never reaches candidate code or agent commands.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
# Credentials the daemon itself holds under names without the markers above.
DAEMON_CREDENTIALS = ("ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH", "MODAL_TOKEN_ID", "AWS_PROFILE")


def scrubbed_env(extra: dict | None = None) -> dict:
    """The daemon's environment without secrets, plus `extra`."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not any(marker in name.upper() for marker in SECRET_MARKERS)
        and not name.upper().startswith(DAEMON_CREDENTIALS)
    }
    env.update(extra or {})
    return env
