"""train.py's hyperparameter block: the `NAME = literal` lines between `# >>> hyperparameters` and
`# <<< hyperparameters`, read and rewritten in place (comments and spacing kept), and which of
train.py's two training paths reads them."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

TRAIN_SCRIPT = "candidate/train.py"
BLOCK_START = "# >>> hyperparameters"
BLOCK_END = "# <<< hyperparameters"
# Not learning hyperparameters: how many threads, which backend, seeds.
FIXED_NAMES = {"TORCH_THREADS", "BACKEND"}
PATH_TAG = re.compile(r"\((host|jax-host|jax-e2e) path\)")
# Backends train.py steps from a Python loop (the host path's torch learner, or the jax-host path's
# JAX one); any other verified backend is functional JAX and trains end to end (jax-e2e path) when
# the block has JAX_NUM_ENVS. Mirrors train.py (HOST_SPECS, is_jax_functional, choose_path).
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
    path: Optional[str] = None  # "host", "jax-host" or "jax-e2e" when its comment names the path reading it


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
    """Whether the `training` path reads a constant whose comment names path `tag`: "(host path)"
    constants are the jax-host path's too (the same PPO, learnt in JAX), the others their path's only."""
    return tag is None or tag == training or (tag == "host" and training == "jax-host")


def training_path(constants: list[Constant], env_id: str, worktree: Path) -> str:
    """Which of train.py's paths will train this block: "jax-e2e" when the backend it would choose
    is functional JAX and the block has the jax-e2e constants; for a backend stepped from a Python
    loop, "jax-host" when LEARNER asks for the JAX learner or leaves it to train.py ("auto", which
    picks it for all but gymnasium's own vector env from a 30 s budget), else "host"."""
    values = {c.name: c.value for c in constants}
    if "JAX_NUM_ENVS" not in values and "LEARNER" not in values:
        return "host"
    spec = values.get("BACKEND", "auto")
    if spec == "auto":
        try:
            import envs_fast
        except ImportError:
            return "host"
        spec = envs_fast.choose_backend(env_id, int(values.get("NUM_ENVS", 32)), root=worktree)
    learner = values.get("LEARNER", "auto")
    if spec not in HOST_SPECS and not str(spec).endswith(".rs"):
        return "jax-e2e" if "JAX_NUM_ENVS" in values and learner != "torch" else "host"
    if learner == "jax" or (learner == "auto" and spec not in ("reference", "gymnasium")):
        return "jax-host"
    return "host"


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
