"""ARCHITECTURE.md kept true: the import graph of the tree (tests excluded) has no circle, and every
import goes to a module of the same or a lower layer (the layers ARCHITECTURE.md draws)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import AUTORL_ROOT

SKIP = {".venv", "tests", "results", "runs", ".git", "templates", "__pycache__"}


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if not SKIP & set(p.relative_to(root).parts))


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The tree's modules that `path` imports (at any depth of the file: a local import counts)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[:len(parent) - (node.level - 1)] if node.level > 1 else parent
                base = ".".join(parent + ([node.module] if node.module else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in known:  # `from a.b import c`: c may be a module or a name
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path = AUTORL_ROOT) -> dict[str, set[str]]:
    files = {module_name(p, root): p for p in python_files(root)}
    known = set(files)
    graph = {name: imports_of(path, name, known) for name, path in files.items()}
    for name in graph:  # a package's __init__ is imported with any of its modules: not an edge back up
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layers(root: Path = AUTORL_ROOT) -> list[tuple[int, str]]:
    """ARCHITECTURE.md's table: (layer, module pattern) rows, e.g. `| 3 | orchestrator.phases |`."""
    text = (root / "ARCHITECTURE.md").read_text()
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*`([^`]+)`", text, re.MULTILINE)
    return [(int(layer), pattern) for layer, pattern in rows]


def layer_of(module: str, table: list[tuple[int, str]]) -> int:
    """The layer of the most specific pattern that matches (`a.*` matches a and everything under it)."""
    best, length = None, -1
    for layer, pattern in table:
        prefix = pattern[:-2] if pattern.endswith(".*") else pattern
        if (module == prefix or (pattern.endswith(".*") and module.startswith(prefix + "."))) and len(prefix) > length:
            best, length = layer, len(prefix)
    return best


def test_the_tree_has_no_import_circle():
    found = cycles(import_graph())
    assert not found, "import circles (each a set of modules that import each other):\n" + "\n".join(map(str, found))


def test_every_module_has_a_layer_and_imports_only_downward():
    graph, table = import_graph(), layers()
    assert table, "ARCHITECTURE.md has no layer table"
    missing = sorted(m for m in graph if layer_of(m, table) is None)
    assert not missing, f"modules with no layer in ARCHITECTURE.md: {missing}"
    upward = sorted(f"{m} (layer {layer_of(m, table)}) -> {t} (layer {layer_of(t, table)})"
                    for m, targets in graph.items() for t in targets if layer_of(t, table) > layer_of(m, table))
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_the_checker_finds_a_circle_and_an_upward_import(tmp_path):
    """The checks above can fail: a two-module circle and an import up the table are found."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "low.py").write_text("from . import high\n")
    (tmp_path / "pkg" / "high.py").write_text("from .low import something\n")
    (tmp_path / "ARCHITECTURE.md").write_text("| 1 | `pkg.low` |\n| 2 | `pkg.*` |\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["pkg.high", "pkg.low"]]
    table = layers(tmp_path)
    assert layer_of("pkg.low", table) == 1 and layer_of("pkg.high", table) == 2
    assert any(layer_of(t, table) > layer_of(m, table) for m, ts in graph.items() for t in ts)


def test_nothing_outside_the_tests_imports_them():
    """A bench script or a shipped module runs from a checkout without the test suite's fixtures:
    what both need lives in the tree (e.g. orchestrator/benchmark/scratch_checkout.py)."""
    def imports_tests(path: Path) -> bool:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n.split(".")[0] in ("tests", "conftest") for n in names):
                return True
        return False

    offenders = [str(p.relative_to(AUTORL_ROOT)) for p in python_files(AUTORL_ROOT) if imports_tests(p)]
    assert not offenders, f"modules outside tests/ that import from it: {offenders}"


MAX_MODULE_LINES = 450
# Over the limit today, at most this long: each may only shrink (and leaves the list once within it).
# candidate/train.py is the one-learner issue's (at most 500 lines, readable top to bottom).
STILL_LONG = {"candidate/train.py": 500}
EXCEPTED = {"evaluate.py"}   # the harness, copied whole into every run (ARCHITECTURE.md says why)
TRANSLATION = re.compile(r"^envs_fast/translations/[a-z0-9_]+\.(?:py|rs)$")


def test_modules_stay_within_450_lines_and_the_long_ones_only_shrink():
    too_long, grown = [], []
    for path in python_files(AUTORL_ROOT):
        rel = path.relative_to(AUTORL_ROOT).as_posix()
        if rel in EXCEPTED or TRANSLATION.match(rel):
            continue
        lines = len(path.read_text().splitlines())
        if rel in STILL_LONG:
            if lines > STILL_LONG[rel]:
                grown.append(f"{rel}: {lines} lines, listed at {STILL_LONG[rel]}")
        elif lines > MAX_MODULE_LINES:
            too_long.append(f"{rel}: {lines} lines")
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split by noun; ARCHITECTURE.md): {too_long}"
    assert not grown, f"modules of STILL_LONG that grew: {grown}"
    assert TRANSLATION.match("envs_fast/translations/bipedalwalker_v3_sync.py")
    assert not TRANSLATION.match("envs_fast/mujoco/mjx.py")
