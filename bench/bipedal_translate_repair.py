"""A night's translate experiment on BipedalWalker-v3 with a seeded bug, end to end through the daemon.

    .venv/bin/python -m bench.bipedal_translate_repair --bug friction|sync [--budget 60] [--work DIR]
        [--out bench/results/bipedal-translate-repair-DATE.txt]

A checkout of this tree without any BipedalWalker port (the Rust port, its state sync and the JAX
port removed), so the incumbent is envpool. The replay agent's first translate experiment writes the
shipped Rust port with one bug: `friction` (the terrain's FRICTION 2.5 -> 2.0, physics) or `sync`
(state_to_reference leaves the bodies' angular velocities unwritten, a sync field left out). Its
repair round writes the shipped files. What must happen, and what this prints from the run folder:
L2 fails naming the field and the state, the repair passes and is kept, and the re-baseline that
follows trains on the Rust port, more env steps in the same budget than the baselines on envpool.
Everything is real (daemon, sandbox, verifier at its CLI defaults, benchmark, keep rule); only the
agent is a replay.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import git

from orchestrator.artifacts import parse_summary
from orchestrator.benchmark.scratch_checkout import (AUTORL_ROOT, daemon_cmd, daemon_env, make_checkout, read_results,
                                                     write_replay)

RUST, SYNC, JAX = (f"envs_fast/translations/bipedalwalker_v3{end}" for end in (".rs", "_sync.py", ".py"))
BUGS = {  # file, the shipped text, the bug
    "friction": (RUST, "const FRICTION: f64 = 2.5;", "const FRICTION: f64 = 2.0;"),
    "sync": (SYNC, "        body.angularVelocity = s[o + 5]\n", ""),
}


def seeded(bug: str) -> dict:
    """The first attempt's files: the shipped port and sync with `bug` in one of them."""
    files = {RUST: (AUTORL_ROOT / RUST).read_text(), SYNC: (AUTORL_ROOT / SYNC).read_text()}
    path, shipped, wrong = BUGS[bug]
    assert files[path].count(shipped) == 1, f"the seed's anchor is not once in {path}"
    files[path] = files[path].replace(shipped, wrong)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bug", choices=sorted(BUGS), required=True)
    parser.add_argument("--budget", type=float, default=60.0, help="each training run's budget in seconds")
    parser.add_argument("--work", type=Path, default=None, help="the checkout and replay go here (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="also append what it printed to this file")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="bw-repair-"))
    repo = make_checkout(work / "checkout")
    checkout = git.Repo(repo)
    checkout.index.remove([RUST, SYNC, JAX], working_tree=True)
    checkout.index.commit("no BipedalWalker port yet")
    replay = write_replay(work / "replay", {1: {**seeded(args.bug), "DESCRIPTION": f"BipedalWalker in Rust ({args.bug})"}})
    write_replay(replay, {1: {}})
    for rel in (RUST, SYNC):
        (replay / "001.r1" / rel).parent.mkdir(parents=True, exist_ok=True)
        (replay / "001.r1" / rel).write_text((AUTORL_ROOT / rel).read_text())
    (replay / "001.r1" / "DESCRIPTION").write_text("the shipped port")
    tag = f"bw-repair-{args.bug}"
    command = daemon_cmd("run", "--env", "BipedalWalker-v3", "--tag", tag, "--agent", "replay", "--replay-dir",
                         str(replay), "--budget", f"{args.budget:g}", "--translate-lang", "rust", "--phases",
                         "translate,train", "--schedule", "translate:1,train:1", "--max-experiments", "2",
                         "--no-setup-verify", "--baselines", "2", "--eval-episodes", "20", "--rescore", "0")
    began = time.time()
    proc = subprocess.run(command, cwd=repo, env=daemon_env(), capture_output=True, text=True)
    lines = [f"# python -m bench.bipedal_translate_repair --bug {args.bug} --budget {args.budget:g} "
             f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(began))}, {(time.time() - began) / 60:.1f} min, "
             f"load average {Path('/proc/loadavg').read_text().split()[0]} at the end, daemon exit {proc.returncode})"]
    run_dir = repo / "results" / tag
    if not (run_dir / "results.tsv").is_file():
        lines.append("no results.tsv: " + (proc.stderr or proc.stdout)[-3000:])
    else:
        rows = read_results(repo, tag)
        for row in rows.itertuples():
            log = next(iter(sorted((run_dir / f"exp-{int(row.exp):04d}").glob("**/train.log"))), None)
            summary = parse_summary(log.read_text()) if log else {}
            lines.append(f"exp {row.exp}: {row.phase} {row.status}, score {row.score}, env steps {row.env_steps}, "
                         f"sps {row.sps}, path {summary.get('path')}, backend {summary.get('backend')}: "
                         f"{str(row.description)[:240]}")
        for log in sorted(run_dir.glob("exp-*/verify.r*.log")):
            text = log.read_text()
            levels = re.findall(r"^(L[1-4] \w+: \w+)", text, flags=re.M)
            lines.append(f"{log.relative_to(run_dir)}: {', '.join(levels)}")
            lost = re.search(r"^\s*fields that did not read back.*$", text, flags=re.M)  # a sync bug: L2's round trip
            if lost:
                lines.append("    " + lost.group(0).strip()[:400])
            failure = re.search(r"differing fields.*?(?:\n\s+\S.*){1,6}", text)
            if failure:
                lines.extend("    " + line.strip() for line in failure.group(0).splitlines()[:7])
            state = re.search(r"^\s*state: .*$", text, flags=re.M)
            if state:
                lines.append("    " + state.group(0).strip()[:300])
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as handle:
            handle.write(text + "\n")
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
