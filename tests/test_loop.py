"""One replay night through every status: keep, discard and its ref, crash, timeout, invalid
(forbidden path, syntax error), a fake score, a train.py that rewrites evaluate.py, one that
tampers with the run's harness copy; and no secret reaches train.py.

It runs with `--sandbox off`: these are the daemon's own defences, which hold where no sandbox
is available (macOS); tests/test_walls.py shows the same attacks failing inside the sandbox."""
from __future__ import annotations

import hashlib
import json
import os

import git
import pytest

from tests.conftest import FAST, TINY_TRAIN_PY, processes_of, read_results, run_daemon, tiny_train_py, write_replay

TAG = "night"
CANARY = "canary-secret-8f2d61"


def _insert_before_export(code: str, **constants) -> str:
    return tiny_train_py(**constants).replace("out = Path(", code + "\nout = Path(", 1)


DUMP_ENV = """
import json as _json
_out = Path(os.environ["AUTORL_OUTPUT_DIR"])
_out.mkdir(parents=True, exist_ok=True)
print("ENV_DUMP " + _json.dumps(dict(os.environ)), flush=True)
(Path.cwd() / "scratch.txt").write_text("left behind by a train run")  # must not taint exp 2
"""

SPAWN_SLEEPER_AND_HANG = """
import subprocess as _sp
_child = _sp.Popen(["sleep", "600"])
_escapee = _sp.Popen(["sleep", "601"], start_new_session=True)  # leaves the process group
Path(os.environ["AUTORL_OUTPUT_DIR"]).mkdir(parents=True, exist_ok=True)
(Path(os.environ["AUTORL_OUTPUT_DIR"]) / "grandchild.pid").write_text(f"{_child.pid} {_escapee.pid}")
time.sleep(600)
"""

FAKE_SCORE = """
_out = Path(os.environ["AUTORL_OUTPUT_DIR"])
_out.mkdir(parents=True, exist_ok=True)
(_out.parent / "eval.json").write_text('{"mean": 99999.0}')
print('{"mean": 99999.0, "se": 0.0}')
print("score: 99999")
"""

# What a cheating train.py writes over evaluate.py: a harness that reports a million.
LYING_HARNESS = (
    "import json, sys\n"
    "args = sys.argv\n"
    "out = args[args.index('--out') + 1] if '--out' in args else None\n"
    "line = json.dumps({'mean': 1e6, 'se': 0.0, 'episodes': 10, 'returns': [1e6]})\n"
    "open(out, 'w').write(line) if out else None\n"
    "print(line)\n"
)

REWRITE_HARNESSES = f"""
_lie = {LYING_HARNESS!r}
(Path.cwd() / "evaluate.py").write_text(_lie)
_checkout = Path(os.environ["AUTORL_OUTPUT_DIR"]).parents[3]  # out <- exp-NNNN <- <tag> <- results <- checkout
(_checkout / "evaluate.py").write_text(_lie)
"""

TAMPER_RUN_COPY = f"""
_lie = {LYING_HARNESS!r}
(Path(os.environ["AUTORL_OUTPUT_DIR"]).parents[1] / "evaluate.py").write_text(_lie)  # results/<tag>/
"""


@pytest.mark.long
@pytest.mark.slow
def test_replay_night_covers_every_status(autorl_repo, tmp_path):
    repo = autorl_repo(TINY_TRAIN_PY)
    original_harness = (repo / "evaluate.py").read_bytes()
    replay = write_replay(tmp_path / "replay", {
        1: {"candidate/train.py": _insert_before_export(DUMP_ENV, BIAS=0.5), "DESCRIPTION": "less bias"},
        2: {"candidate/train.py": tiny_train_py(BIAS=5.0), "DESCRIPTION": "always left"},
        3: {"candidate/train.py": _insert_before_export("raise RuntimeError('deliberate crash')"),
            "DESCRIPTION": "crashes"},
        # exports its artifact in time, then hangs (a timeout; one still training at the deadline
        # stretched its budget and is invalid: tests/test_budget.py)
        4: {"candidate/train.py": TINY_TRAIN_PY + SPAWN_SLEEPER_AND_HANG, "DESCRIPTION": "hangs"},
        5: {"candidate/train.py": tiny_train_py(BIAS=0.0), "evaluate.py": "# mine now\n",
            "DESCRIPTION": "edits the harness"},
        6: {"candidate/train.py": TINY_TRAIN_PY + "\ndef broken(:\n", "DESCRIPTION": "syntax error"},
        7: {"candidate/train.py": _insert_before_export(FAKE_SCORE, BIAS=5.0), "DESCRIPTION": "fake score"},
        8: {"candidate/train.py": _insert_before_export(REWRITE_HARNESSES, BIAS=5.0),
            "DESCRIPTION": "rewrites evaluate.py"},
        9: {"candidate/train.py": _insert_before_export(TAMPER_RUN_COPY, BIAS=5.0),
            "DESCRIPTION": "tampers with the run's harness copy"},
        10: {"candidate/train.py": tiny_train_py(BIAS=0.0), "DESCRIPTION": "no bias"},
    })
    secrets = {"AUTORL_TEST_API_KEY": CANARY, "INNOCENT_LOOKING": CANARY,
               "ANTHROPIC_BASE_URL": "http://127.0.0.1:9/canary-base-url"}
    result = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", TAG, "--agent", "replay",
                        "--replay-dir", str(replay), "--budget", "2", "--sandbox", "off", *FAST, env=secrets)
    assert result.returncode == 0, result.stdout + result.stderr

    rows = read_results(repo, TAG)
    assert list(rows.columns) == ["exp", "time", "phase", "commit", "status", "score", "best", "env_steps",
                                  "sps", "wall_s", "cost_usd", "budget_s", "description"]
    # the budget each score was trained at; nothing trained for a candidate that never compiled (exp 6)
    assert rows["budget_s"].iloc[:3].tolist() == [2, 2, 2] and rows.set_index("exp")["budget_s"].isna()[6]
    assert rows["status"].tolist() == ["baseline", "baseline", "keep", "discard", "crash", "timeout", "invalid",
                                       "invalid", "discard", "discard", "invalid", "keep"]
    assert rows["exp"].tolist() == [0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    by_exp = rows.set_index("exp")

    # Scores come from the trusted harness only.
    assert 100 < by_exp.loc[1, "score"] < 400
    assert by_exp.loc[7, "score"] < 20, "a printed/planted fake score must not count"
    assert by_exp.loc[8, "score"] < 20, "rewriting evaluate.py must not change the score"
    assert by_exp.loc[10, "score"] == 500.0
    assert rows["best"].iloc[-1] == 500.0
    assert "RuntimeError" in by_exp.loc[3, "description"]
    assert "evaluate.py" in by_exp.loc[5, "description"]
    assert "SyntaxError" in by_exp.loc[6, "description"]
    assert "harness" in by_exp.loc[9, "description"]
    assert by_exp.loc[4, "wall_s"] < 30

    # The branch tip is the best experiment; every other experiment is kept under a ref.
    main = git.Repo(repo)
    tip = main.commit(f"autorl/{TAG}")
    assert tip.hexsha.startswith(by_exp.loc[10, "commit"])
    assert tip.message.strip() == "no bias"
    assert tip.parents[0].hexsha.startswith(by_exp.loc[1, "commit"])
    refs = {r.path: r.commit.hexsha for r in main.refs if r.path.startswith(f"refs/autorl/{TAG}/")}
    for exp in (2, 3, 4, 5, 6, 7, 8, 9):
        ref = f"refs/autorl/{TAG}/exp-{exp:04d}"
        assert refs[ref].startswith(by_exp.loc[exp, "commit"]), ref
    assert f"refs/autorl/{TAG}/exp-0001" not in refs and f"refs/autorl/{TAG}/exp-0010" not in refs
    assert main.commit(f"refs/autorl/{TAG}/exp-0005").tree["evaluate.py"].data_stream.read() == b"# mine now\n"

    # The worktree is clean at the best commit, its evaluate.py the original.
    worktree = git.Repo(repo / "runs" / TAG)
    assert worktree.head.commit == tip and not worktree.is_dirty(untracked_files=True)
    assert (repo / "runs" / TAG / "evaluate.py").read_bytes() == original_harness
    # The attack of exp 8 did happen to the main checkout, and was harmless.
    assert "1e6" in (repo / "evaluate.py").read_text()
    run_dir = repo / "results" / TAG
    recorded = json.loads((run_dir / "run.json").read_text())["harness_sha256"]
    assert hashlib.sha256((run_dir / "evaluate.py").read_bytes()).hexdigest() == recorded == \
        hashlib.sha256(original_harness).hexdigest()

    # Per-experiment folders.
    exp1 = run_dir / "exp-0001"
    assert (exp1 / "train.log").exists() and (exp1 / "diff.patch").read_text().count("BIAS") >= 2
    assert json.loads((exp1 / "eval.json").read_text())["episodes"] == 10
    assert (run_dir / "exp-0003" / "failure.txt").read_text().count("deliberate crash") >= 1

    # No secret reached train.py; its own variables did.
    dump = next(line for line in (exp1 / "train.log").read_text().splitlines() if line.startswith("ENV_DUMP "))
    env = json.loads(dump[len("ENV_DUMP "):])
    assert env["AUTORL_TIME_BUDGET"] == "2" and env["AUTORL_ENV_ID"] == "CartPole-v1"
    assert env["AUTORL_SEED"] == "1" and env["AUTORL_OUTPUT_DIR"] == str(exp1 / "out")
    assert CANARY not in json.dumps(env) and "canary-base-url" not in json.dumps(env)
    assert "AUTORL_TEST_API_KEY" not in env and "ANTHROPIC_BASE_URL" not in env

    # The hung train run's grandchild was killed with its group.
    assert processes_of(run_dir / "exp-0004" / "out") == []
    # Only the policy artifact stays in an experiment's output folder.
    assert sorted(p.name for p in (exp1 / "out").iterdir()) == ["policy.pt"]

    # The log says what happened, one line per event.
    log_text = (run_dir / "daemon.log").read_text()
    assert "exp 4: TIMEOUT" in log_text and "agent: replay" in log_text
    assert "changed during exp 8 (by the candidate?)" in log_text
    assert os.path.exists(run_dir / "state.json")
