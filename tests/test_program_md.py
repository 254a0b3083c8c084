"""program.md tells the agent the truth: every constant, file, module attribute, summary key and
training path it names in backquotes exists in what train.py runs (train.py, train_plumbing.py,
evaluate.py, envs_fast). A rename in train.py that leaves program.md describing what is gone fails here."""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROGRAM = (REPO / "program.md").read_text()
TRAIN = (REPO / "candidate" / "train.py").read_text()
CODE = {name: (REPO / name).read_text() for name in ("candidate/train.py", "train_plumbing.py", "evaluate.py")}
SPANS = re.findall(r"`([^`\n]+)`", PROGRAM)


def module_level_names(source: str) -> set[str]:
    names = set()
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        names |= {target.id for target in targets if isinstance(target, ast.Name)}
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names}
    return names


DEFINED = set().union(*(module_level_names(source) for source in CODE.values()))


def named(pattern: str) -> list[str]:
    """Each backquoted span's matches of `pattern`, once each, in order."""
    found = []
    for span in SPANS:
        for match in re.findall(pattern, span):
            if match not in found:
                found.append(match)
    return found


CONSTANT = r"^(?!AUTORL_)([A-Z][A-Z0-9_]{2,})(?: = .*)?$"
PLACEHOLDERS = {"NAME", "key"}  # program.md's `NAME = value` and `key: value` describe the format


def test_it_names_constants_and_files_at_all():
    """The checks below have something to check (a program.md in another format would pass them empty)."""
    assert len(named(CONSTANT)) >= 15
    assert len(named(r"[\w./<>-]+\.(?:py|rs|md)\b")) >= 8


@pytest.mark.parametrize("constant", [name for name in named(CONSTANT) if name not in PLACEHOLDERS])
def test_every_constant_it_names_is_defined(constant):
    assert constant in DEFINED, (f"program.md names `{constant}`, which neither candidate/train.py, train_plumbing.py "
                                 f"nor evaluate.py defines")


@pytest.mark.parametrize("variable", named(r"\b(AUTORL_[A-Z_]+)\b"))
def test_every_variable_it_names_is_read(variable):
    assert any(variable in source for source in CODE.values()), f"program.md names ${variable}, which nothing reads"


@pytest.mark.parametrize("path", [path for path in named(r"[\w./<>-]+\.(?:py|rs|md)\b") if "<" not in path])
def test_every_file_it_names_exists(path):
    candidates = [REPO / path, REPO / "envs_fast" / path, REPO / "envs_fast" / "translations" / path,
                  REPO / "candidate" / path]
    assert any(candidate.exists() for candidate in candidates), f"program.md names {path}, which is not in the repository"


@pytest.mark.parametrize("attribute", [name for name in named(r"^((?:evaluate|envs_fast|train_plumbing)(?:\.\w+)+)")
                                       if not name.endswith((".py", ".rs", ".md"))])
def test_every_module_attribute_it_names_exists(attribute):
    try:
        importlib.import_module(attribute)  # a submodule (envs_fast.backends.load)
        return
    except ImportError:
        module, name = attribute.rsplit(".", 1)
    assert hasattr(importlib.import_module(module), name), f"program.md names `{attribute}`, which does not exist"


@pytest.mark.parametrize("key", [key for key in named(r"^([a-z_]+):(?: |$)") if key not in PLACEHOLDERS])
def test_every_summary_key_it_names_is_printed(key):
    printing = TRAIN + CODE["train_plumbing.py"]  # train.py's summary, printed by the plumbing it imports
    assert re.search(rf'print\(f?"{key}: ', printing) or f'"{key}: ' in printing or f'"{key}": ' in printing \
        or f"{key}: ok" in printing, f"program.md names the summary line `{key}:`, which train.py does not print"


@pytest.mark.parametrize("path", named(r"^\*?\*?(jax-[a-z0-9]+|host)\*?\*?$") + re.findall(r"\*\*([a-z0-9-]+)\*\*", PROGRAM))
def test_every_training_path_it_describes_is_one_train_py_takes(path):
    taken = set(re.findall(r'"(jax-[a-z0-9]+|host)"', TRAIN))
    assert path in taken, f"program.md describes the {path} path; train.py's paths are {sorted(taken)}"


def test_its_count_of_paths_is_train_pys():
    taken = set(re.findall(r'"(jax-[a-z0-9]+|host)"', TRAIN))
    words = {1: "one", 2: "two", 3: "three", 4: "four"}
    heading = re.search(r"^## train\.py\b.*?\b(one|two|three|four) paths?\b", PROGRAM, re.M)
    assert heading, "program.md has no section on train.py's paths"
    assert heading.group(1) == words[len(taken)], f"program.md says {heading.group(1)} paths; train.py has {sorted(taken)}"
