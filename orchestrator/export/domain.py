"""Find and check an env folder's domain module (the DOMAIN PROTOCOL of envs/<name>/)."""
from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

# Not the domain module even when they mention ACTIONS: the gymnasium wrapper and the task list.
NOT_DOMAIN_FILES = {"env.py", "tasks.py", "__init__.py"}
REQUIRED_NAMES = ("NAME", "DESCRIPTION", "ACTIONS", "OBSERVATION_SIZE", "OBSERVATION_LOW",
                  "OBSERVATION_HIGH", "REWARD_RANGE", "MAX_STEPS")
REQUIRED_FUNCTIONS = ("reset", "legal_actions", "step", "observation", "render")


class DomainError(ValueError):
    """The env folder has no usable domain module (a user error: exit 2)."""


@dataclass(frozen=True)
class EnvInfo:
    env_dir: Path
    name: str            # the folder name, used for every generated name
    domain_file: str     # e.g. connect_four.py
    max_steps: int
    action_count: int

    @property
    def class_prefix(self) -> str:
        return "".join(part[:1].upper() + part[1:] for part in self.name.split("_") if part) or "Env"

    @property
    def slug(self) -> str:
        return self.name.replace("_", "-")


def _defines_domain(path: Path) -> bool:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError):
        return False
    assigned, functions = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            assigned |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.FunctionDef):
            functions.add(node.name)
    return "ACTIONS" in assigned and "legal_actions" in functions


def find_domain_file(env_dir: Path) -> Path:
    """The one file in env_dir that defines ACTIONS and legal_actions (not env.py/tasks.py)."""
    if not env_dir.is_dir():
        raise DomainError(f"{env_dir} is not a folder")
    candidates = [path for path in sorted(env_dir.glob("*.py"))
                  if path.name not in NOT_DOMAIN_FILES and not path.name.startswith("test_")
                  and _defines_domain(path)]
    if not candidates:
        raise DomainError(f"{env_dir} has no domain module: no .py file there (other than env.py and "
                          "tasks.py) defines both ACTIONS and legal_actions()")
    if len(candidates) > 1:
        names = ", ".join(path.name for path in candidates)
        raise DomainError(f"{env_dir} has several domain modules ({names}); keep one")
    return candidates[0]


def load_domain(path: Path):
    """Import the domain module from its file (as the exported wrappers do)."""
    module_name = f"autorl_export_check_{path.parent.name}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise DomainError(f"{path} does not import: {type(error).__name__}: {error}") from error
    finally:
        sys.modules.pop(module_name, None)
    return module


def inspect_env(env_dir: Path) -> EnvInfo:
    """Check env_dir's domain module against the protocol; what the generator needs to know."""
    env_dir = env_dir.resolve()
    domain_path = find_domain_file(env_dir)
    domain = load_domain(domain_path)
    missing = [name for name in REQUIRED_NAMES if not hasattr(domain, name)]
    missing += [f"{name}()" for name in REQUIRED_FUNCTIONS if not callable(getattr(domain, name, None))]
    if missing:
        raise DomainError(f"{domain_path.name} misses {', '.join(missing)} (see the domain protocol)")
    if not domain.ACTIONS or not all(isinstance(action, str) for action in domain.ACTIONS):
        raise DomainError(f"{domain_path.name}: ACTIONS must be a non-empty list of strings")
    if not env_dir.name.isidentifier():
        raise DomainError(f"{env_dir.name!r} is not a valid env name (use letters, digits and _)")
    return EnvInfo(env_dir=env_dir, name=env_dir.name, domain_file=domain_path.name,
                   max_steps=int(domain.MAX_STEPS), action_count=len(domain.ACTIONS))
