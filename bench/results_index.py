"""bench/results/README.md: which results file backs which page of the docs.

    .venv/bin/python -m bench.results_index          # rewrites bench/results/README.md
    .venv/bin/python -m bench.results_index --check  # exits 1 when it is out of date

One row per file or folder of bench/results: the pages that cite it (the docs, the READMEs, other
results) and, for a text file, its first line. A file no page cites is history: a figure a later
measurement replaced, kept as it was measured.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
INDEX = RESULTS / "README.md"
PAGES = ("README.md", "ARCHITECTURE.md", "program.md", "bench/README.md", "envs_fast/README.md", "docs/**/*.md",
         "bench/results/*.md")
HEADER = """# bench/results

What the scripts of bench/ measured, each file named by what and when. The docs cite the file
behind each figure; this index, written by `bench/results_index.py` (a test checks it is current),
says which pages cite which file. A file no page cites is history: a figure that a later
measurement replaced, kept as it was measured.

| file | cited by | what it holds |
|---|---|---|
"""


def first_line(path: Path) -> str:
    if path.is_dir():
        return f"a folder of {sum(1 for _ in path.iterdir())} files"
    if path.suffix not in (".txt", ".md"):
        return ""
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip().lstrip("#").strip()
        if line:
            return (line[:117] + "...") if len(line) > 120 else line
    return ""


def render() -> str:
    pages = sorted({p for pattern in PAGES for p in REPO.glob(pattern) if p != INDEX})
    texts = {p.relative_to(REPO).as_posix(): p.read_text(errors="replace") for p in pages}
    rows = []
    for entry in sorted(RESULTS.iterdir()):
        if entry == INDEX or entry.name.startswith("."):
            continue
        citing = [name for name, text in texts.items() if entry.name in text and name != f"bench/results/{entry.name}"]
        what = first_line(entry).replace("|", "\\|")
        rows.append(f"| `{entry.name}` | {', '.join(citing) or 'history'} | {what} |")
    return HEADER + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when bench/results/README.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = INDEX.read_text() if INDEX.is_file() else ""
        if current != text:
            print("bench/results/README.md is out of date: run .venv/bin/python -m bench.results_index", file=sys.stderr)
            return 1
        return 0
    INDEX.write_text(text)
    print(f"wrote {INDEX.relative_to(REPO)} ({text.count(chr(10)) - HEADER.count(chr(10))} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
