"""`export`: turn envs/<name>/ into thin OpenEnv, OpenReward, verifiers and NeMo Gym variants.

    python -m orchestrator.export --env envs/<name> --to openenv,ors,verifiers,nemo_gym [--smoke]

Each variant (envs/<name>/export/<framework>/) imports the env's domain module from its file, so
the rules live in one place. --smoke serves each variant on 127.0.0.1, plays a few turns with its
rollout.py (Claude when ANTHROPIC_API_KEY is set, else a scripted player), stops the server and
prints one line per framework; exit 0 only when all pass, 2 on bad input. The NeMo Gym variant runs
on the real nemo-gym (ng_run, in a cached Python >= 3.12 venv: real_nemo_gym.py) when this machine
has a Python >= 3.12 that can install it, else its HTTP contract on FastAPI/uvicorn.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .domain import DomainError, EnvInfo, inspect_env
from .generate import FRAMEWORKS, render_variant, variant_dir, write_variant

__all__ = ["FRAMEWORKS", "DomainError", "EnvInfo", "add_arguments", "export_env", "inspect_env",
           "render_variant", "run", "variant_dir"]

EXIT_BAD_INPUT = 2


def parse_frameworks(text: str) -> list[str]:
    """'openenv,ors' -> ['openenv', 'ors']; 'all' -> every framework; unknown names are an error."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return list(FRAMEWORKS)
    unknown = [name for name in names if name not in FRAMEWORKS]
    if unknown or not names:
        raise ValueError(f"unknown framework {', '.join(unknown) or repr(text)}; "
                         f"choose from {','.join(FRAMEWORKS)} (or all)")
    return list(dict.fromkeys(names))


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def export_env(env_dir: Path, frameworks: list[str]) -> tuple[EnvInfo, list[Path]]:
    """Write envs/<name>/export/<framework>/ for each framework; returns the folders written."""
    info = inspect_env(env_dir)
    return info, [write_variant(info, framework) for framework in frameworks]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", dest="env_dir", required=True, metavar="ENV_DIR",
                        help="the env folder, e.g. envs/connect_four (holds the domain module)")
    parser.add_argument("--to", dest="frameworks", default="all", metavar="LIST",
                        help=f"comma-separated: {','.join(FRAMEWORKS)} (default: all)")
    parser.add_argument("--smoke", action="store_true",
                        help="serve each variant on 127.0.0.1 and run its rollout.py against it")
    parser.add_argument("--turns", type=_positive_int, default=4, metavar="N",
                        help="--smoke: act calls per rollout (default 4)")
    parser.add_argument("--player", choices=("auto", "scripted", "anthropic"), default="auto",
                        help="--smoke: auto = Claude when ANTHROPIC_API_KEY is set, else scripted")
    parser.add_argument("--verbose", action="store_true", help="--smoke: show every rollout's calls")
    parser.add_argument("--nemo-gym", dest="nemo_gym", choices=("auto", "real", "contract"), default="auto",
                        help="--smoke: real = the real nemo-gym served by ng_run in a Python >= 3.12 venv "
                             "(cached); contract = its HTTP contract on FastAPI/uvicorn; auto (default) = real "
                             "when a Python >= 3.12 can install nemo-gym, else contract")
    parser.add_argument("--nemo-python", dest="nemo_python", metavar="PATH",
                        help="--smoke: the Python >= 3.12 for the real nemo-gym (default: found on PATH or "
                             "under pyenv)")


def run(args: argparse.Namespace) -> int:
    try:
        frameworks = parse_frameworks(args.frameworks)
        info, folders = export_env(Path(args.env_dir), frameworks)
    except (ValueError, DomainError) as error:
        print(f"export: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for folder in folders:
        print(f"wrote {folder}")
    if not args.smoke:
        return 0
    from .smoke import smoke_variant

    results = []
    for framework in frameworks:
        result = smoke_variant(info, framework, turns=args.turns, player=args.player, verbose=args.verbose,
                               nemo_gym=args.nemo_gym, nemo_python=args.nemo_python)
        print(result.line, flush=True)
        results.append(result)
    return 0 if all(result.ok for result in results) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.export", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
