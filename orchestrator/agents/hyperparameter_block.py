"""train.py's hyperparameter block: the `NAME = literal` lines between `# >>> hyperparameters` and
`# <<< hyperparameters`, read and rewritten in place (comments and spacing kept), and which of
train.py's two paths (one learner fed end to end or from the host) reads them."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

TRAIN_SCRIPT = "candidate/train.py"
BLOCK_START = "# >>> hyperparameters"
BLOCK_END = "# <<< hyperparameters"
# Not learning hyperparameters: which backend, and whether a JAX one trains end to end.
FIXED_NAMES = {"BACKEND", "END_TO_END"}
PATH_TAG = re.compile(r"\((jax-host|jax-e2e) path\)")
# Backends train.py steps from a Python loop (its jax-host path); any other verified backend is
# functional JAX and trains end to end (jax-e2e path) when the block has JAX_NUM_ENVS and END_TO_END
# is not False. Mirrors train.py (choose_path) and train_plumbing (HOST_SPECS, is_jax_functional).
HOST_SPECS = ("envpool", "gymnasium", "reference", "mujoco_batch")


class NoHyperparameterBlock(ValueError):
    pass


@dataclass
class Constant:
    name: str
    value: object
    line: int           # 0-based line index in the file
    start: int          # column span of the literal on that line
    end: int
    path: Optional[str] = None  # "jax-host" or "jax-e2e" when its comment names the path reading it


def read_block(text: str) -> list[Constant]:
    """The `NAME = literal` lines of the hyperparameter block (comments and spacing kept)."""
    lines = text.split("\n")
    try:
        first = next(i for i, line in enumerate(lines) if line.strip() == BLOCK_START)
        last = next(i for i in range(first + 1, len(lines)) if lines[i].strip() == BLOCK_END)
    except StopIteration:
        raise NoHyperparameterBlock(
            f"no hyperparameter block: {TRAIN_SCRIPT} needs a line `{BLOCK_START}`, then `NAME = literal` "
            f"lines, then a line `{BLOCK_END}`") from None
    constants = []
    for index in range(first + 1, last):
        line = lines[index]
        try:
            tree = ast.parse(line)
        except SyntaxError:
            continue
        if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign):
            continue
        node = tree.body[0]
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
            continue
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            continue
        tag = PATH_TAG.search(line[node.value.end_col_offset:])
        constants.append(Constant(node.targets[0].id, value, index, node.value.col_offset,
                                  node.value.end_col_offset, tag.group(1) if tag else None))
    return constants


def reads(tag: Optional[str], training: str) -> bool:
    """Whether the `training` path reads a constant whose comment names path `tag` (untagged: both)."""
    return tag is None or tag == training


def training_path(constants: list[Constant], env_id: str, worktree: Path) -> str:
    """Which of train.py's paths will train this block: "jax-e2e" when the backend it would choose
    is functional JAX, the block has the jax-e2e constants and END_TO_END is not False; else
    "jax-host" (the backend stepped from a Python loop)."""
    values = {c.name: c.value for c in constants}
    if "JAX_NUM_ENVS" not in values or values.get("END_TO_END", True) is False:
        return "jax-host"
    spec = values.get("BACKEND", "auto")
    if spec == "auto":
        try:
            import envs_fast
        except ImportError:
            return "jax-host"
        spec = envs_fast.choose_backend(env_id, int(values.get("NUM_ENVS", 32)), root=worktree)
    return "jax-host" if spec in HOST_SPECS or str(spec).endswith(".rs") else "jax-e2e"


def format_value(value) -> str:
    if isinstance(value, float):
        return repr(float(f"{value:.4g}"))
    return repr(value)


def write_block(text: str, values: dict) -> str:
    lines = text.split("\n")
    for const in read_block(text):
        if const.name in values:
            line = lines[const.line]
            lines[const.line] = line[:const.start] + format_value(values[const.name]) + line[const.end:]
    return "\n".join(lines)
