"""The docs site builds with `mkdocs build --strict` (a broken link or a missing page fails), the
command reference is the parsers' own, and the README stays a two-screen front page."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# CI (.ci/run) sets AUTORL_DOCS_REQUIRED: there a missing mkdocs is a failed install, not a skip
needs_mkdocs = pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None and not os.environ.get("AUTORL_DOCS_REQUIRED"),
                                  reason="mkdocs is not installed (make install installs it: the docs extra)")


def mkdocs_build(project: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=project, capture_output=True, text=True, timeout=300)


@needs_mkdocs
def test_the_docs_site_builds_strictly(tmp_path):
    done = mkdocs_build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()
    # ARCHITECTURE.md (for contributors, at the root) is a page of the site, linked from its index
    architecture = (tmp_path / "site" / "reference" / "architecture" / "index.html").read_text()
    assert "Who may import whom" in architecture and "orchestrator.cli" in architecture
    assert "reference/architecture.md" in (ROOT / "docs" / "index.md").read_text()


@needs_mkdocs
def test_a_broken_link_fails_the_build(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project)
    shutil.copy(ROOT / "ARCHITECTURE.md", project)   # a page includes it
    shutil.copytree(ROOT / "docs", project / "docs")
    page = project / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [the missing page](concepts/no-such-page.md).\n")
    done = mkdocs_build(project, tmp_path / "site")
    assert done.returncode != 0 and "no-such-page.md" in done.stdout + done.stderr


def test_the_command_reference_is_generated_from_the_parsers():
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_cli.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    from orchestrator.cli import build_parser

    run = build_parser()._subparsers._group_actions[0].choices["run"]
    for action in run._actions:   # every visible option of `run` is on the page
        if action.option_strings and action.help != "==SUPPRESS==":
            assert f"`{action.option_strings[-1]}`" in page, action.option_strings


def test_the_readme_fits_two_screens_and_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    commands = [line.split("#")[0].strip() for line in lines[:8] if line.startswith("make ")]
    assert commands == ["make demo", "make test"], lines[:8]


def test_every_link_and_picture_in_the_readme_exists():
    import re

    text = (ROOT / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert targets, "the README links into the docs"
    assert [t for t in targets if not (ROOT / t).exists()] == []


def test_the_results_index_names_every_results_file_and_who_cites_it(tmp_path):
    """bench/results/README.md is current: every file there has its row, with the pages citing it; a
    results file added without the index fails (and the index tells how to rewrite it)."""
    command = [sys.executable, "-m", "bench.results_index", "--check"]
    check = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    index = (ROOT / "bench" / "results" / "README.md").read_text()
    assert "| `one-ppo-2026-11-28.md` | " in index and "| `mujoco-batch-2026-11-26.txt` | docs/results/throughput.md" in index
    stray = ROOT / "bench" / "results" / "zz-unindexed-test-file.txt"
    stray.write_text("# a measurement nobody indexed\n")
    try:
        check = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        assert check.returncode == 1 and "bench.results_index" in check.stderr
    finally:
        stray.unlink()
