"""Writes docs/reference/cli.md from the real argument parsers, so the reference cannot drift.

    python docs/gen_cli.py          # rewrite docs/reference/cli.md
    python docs/gen_cli.py --check  # exit 1 if the committed page differs (tests/test_docs.py runs it)

Every command of `python -m orchestrator` with every option the parser accepts (hidden ones left out,
as `--help` leaves them out), its value, default and help; `verify` and `bench` own their parsers
(envs_fast/), read from there.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "cli.md"
sys.path.insert(0, str(ROOT))

HEADER = """# Command reference

Generated from the argument parsers by `python docs/gen_cli.py` (a test fails when this page and the
parsers differ). Every command is `python -m orchestrator COMMAND [options]`; `--help` on any
command prints the same.
"""


def _cell(text: str) -> str:
    # < and > would read as HTML tags (`<tag>` vanishes from the page)
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.metavar or action.dest.upper()


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%" in text:  # as argparse formats a help: %(default)s expanded, %% a percent sign
        text = text % {**vars(action), "default": action.default, "prog": ""}
    return text


def _options_table(parser: argparse.ArgumentParser) -> list[str]:
    lines = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        title = "options" if group.title in ("options", "optional arguments") else group.title
        lines += ["", f"**{title}**", "", "| option | value | default | help |", "|---|---|---|---|"]
        for action in actions:
            names = ", ".join(f"`{n}`" for n in action.option_strings) or f"`{action.dest}`"
            required = " (required)" if action.required else ""
            default = "" if action.default in (None, False, argparse.SUPPRESS) else f"`{action.default}`"
            lines.append(f"| {names}{required} | {_cell(_value(action))} | {default} | {_cell(_help(action))} |")
    return lines


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=100)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def render() -> str:
    from envs_fast import bench as bench_module
    from envs_fast import verify as verify_module
    from orchestrator.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    lines = [HEADER, "| command | what it does |", "|---|---|"]
    lines += [f"| [`{name}`](#{name}) | {_cell(helps.get(name, ''))} |" for name in sub.choices]
    for name, command in sub.choices.items():
        if name in ("verify", "bench"):   # they own their parsers
            command = verify_module.build_parser() if name == "verify" else _bench_parser(bench_module)
            command.prog = f"python -m orchestrator {name}"
        lines += ["", f"## {name}", "", _cell(command.description or helps.get(name, "")), "",
                  "```", _usage(command), "```"]
        lines += _options_table(command)
    return "\n".join(lines) + "\n"


def _bench_parser(bench_module) -> argparse.ArgumentParser:
    """envs_fast/bench/__init__.py builds its parser inside main(): capture it there."""
    captured = {}
    original = argparse.ArgumentParser.parse_args

    def capture(self, *args, **kwargs):
        captured["parser"] = self
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = capture
    try:
        bench_module.main([])
    except SystemExit:
        pass
    finally:
        argparse.ArgumentParser.parse_args = original
    return captured["parser"]


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    page = render()
    if check:
        if not PAGE.exists() or PAGE.read_text() != page:
            print(f"{PAGE.relative_to(ROOT)} differs from the parsers: run python docs/gen_cli.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
