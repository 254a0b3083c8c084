"""The local runner's JAX compilation cache: one folder per commit, shared by that commit's train runs
(baseline seeds, confirmations), never by another commit's, and gone when the run ends."""
from __future__ import annotations

from tests.conftest import FAST, read_results, run_daemon, tiny_train_py

# After the export: what the commit's cache folder held when this run started, then a file of its own.
REPORT_CACHE = '''
cache = Path(os.environ["AUTORL_JAX_CACHE_DIR"])
print(f"jax_cache: {cache}")
print(f"jax_cache_before: {','.join(sorted(p.name for p in cache.iterdir()))}")
(cache / f"seed{os.environ['AUTORL_SEED']}").write_text("a compiled executable")
print(f"user_cache_seen: {os.environ.get('AUTORL_USER_CACHE')}")
'''


def summary(train_log) -> dict:
    tail = train_log.read_text().split("\n---\n")[-1]
    return dict(line.split(": ", 1) for line in tail.splitlines() if ": " in line)


def test_each_commit_has_its_own_jax_cache_for_its_runs(autorl_repo):
    repo = autorl_repo(train_py=tiny_train_py(BIAS=1.0) + REPORT_CACHE)
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "jc", "--agent", "optuna", "--budget", "2",
                      "--max-experiments", "1", "--no-setup-verify", *FAST, "--grace", "30", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = repo / "results" / "jc"
    first, second = summary(run_dir / "exp-0000" / "train.log"), summary(run_dir / "exp-0000" / "run-2" / "train.log")
    rows = read_results(repo, "jc")
    base = rows.commit.iloc[0]
    # The baseline's two seeds share the base commit's folder: the second finds what the first wrote.
    assert first["jax_cache"] == second["jax_cache"] and first["jax_cache"].startswith(str(run_dir / "jax-cache"))
    assert first["jax_cache"].split("/")[-1].startswith(base)
    assert first["jax_cache_before"] == "" and second["jax_cache_before"] == "seed1"
    # The candidate (another commit) starts from an empty folder of its own.
    candidate = summary(run_dir / "exp-0001" / "train.log")
    assert candidate["jax_cache"] != first["jax_cache"] and candidate["jax_cache_before"] == ""
    assert candidate["jax_cache"].split("/")[-1].startswith(rows.commit.iloc[-1])
    assert not (run_dir / "jax-cache").exists()  # removed when the run ended
    # The daemon's user-level cache is not named to candidate code (the tests' session sets it).
    assert first["user_cache_seen"] == candidate["user_cache_seen"] == "None"
