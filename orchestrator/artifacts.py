"""What a train run leaves behind: its `key: value` summary, its policy artifact, its log tail.

Shared by every runner (a local process group, a Modal container): nothing here runs anything.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

TRAIN_SCRIPT = "candidate/train.py"
POLICY_NAMES = ("policy.pt", "policy.pt2")


def parse_summary(log_text: str) -> dict:
    """The `key: value` lines after train.py's last `---` line (information, never the score)."""
    lines = log_text.splitlines()
    try:
        start = len(lines) - 1 - lines[::-1].index("---")
    except ValueError:
        return {}
    metrics = {}
    for line in lines[start + 1:]:
        key, sep, value = line.partition(":")
        if not sep or not key.strip() or " " in key.strip():
            continue
        value = value.strip()
        try:
            metrics[key.strip()] = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            metrics[key.strip()] = value
    return metrics


def find_policy(out_dir: Path) -> Optional[Path]:
    for name in POLICY_NAMES:
        if (Path(out_dir) / name).is_file():
            return Path(out_dir) / name
    return None


def number_arg(value: float) -> str:
    """A number as a command-line argument or environment value: 30, not 30.0."""
    return str(int(value)) if float(value).is_integer() else str(value)


def log_tail(path: Path, lines: int = 60) -> str:
    path = Path(path)
    if not path.exists():
        return ""
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def train_env(out_dir: Path, env_id: str, budget_s: float, seed: int) -> dict:
    """The variables train.py reads (added to a scrubbed environment by whoever runs it)."""
    return {
        "AUTORL_OUTPUT_DIR": str(out_dir),
        "AUTORL_TIME_BUDGET": number_arg(budget_s),
        "AUTORL_SEED": str(seed),
        "AUTORL_ENV_ID": env_id,
        "PYTHONUNBUFFERED": "1",          # a killed run still leaves its log
        "PYTHONDONTWRITEBYTECODE": "1",   # no stray __pycache__ in the checkout
    }
