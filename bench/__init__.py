"""Measurements run by hand, from the repository root: `.venv/bin/python -m bench.<script> --help`
(bench/README.md lists them). As modules of this package they import the checkout's own orchestrator
and envs_fast, with no path edits."""
