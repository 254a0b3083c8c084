"""The local runner's JAX compilation cache: an empty folder for every train run, so baselines and
candidates compile alike (cold) out of their budgets and no run leaves anything for the next; gone
when the run ends."""
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


def test_every_train_run_compiles_cold_in_a_jax_cache_of_its_own(autorl_repo):
    repo = autorl_repo(train_py=tiny_train_py(BIAS=1.0) + REPORT_CACHE)
    proc = run_daemon(repo, "run", "--env", "CartPole-v1", "--tag", "jc", "--agent", "optuna", "--budget", "2",
                      "--max-experiments", "1", "--no-setup-verify", *FAST, "--grace", "30", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = repo / "results" / "jc"
    first, second = summary(run_dir / "exp-0000" / "train.log"), summary(run_dir / "exp-0000" / "run-2" / "train.log")
    rows = read_results(repo, "jc")
    base = rows.commit.iloc[0]
    # The baseline's two seeds do not share a folder: the second finds nothing of what the first wrote
    # (with a cache per commit, baselines 2-4 compiled warm while a candidate's first run compiled cold).
    assert first["jax_cache"] != second["jax_cache"] and first["jax_cache"].startswith(str(run_dir / "jax-cache"))
    assert first["jax_cache"].split("/")[-1].startswith(base) and second["jax_cache"].split("/")[-1].startswith(base)
    assert first["jax_cache_before"] == "" and second["jax_cache_before"] == ""
    # The candidate (another commit) starts from an empty folder of its own, as the baselines did.
    candidate = summary(run_dir / "exp-0001" / "train.log")
    assert candidate["jax_cache"] != first["jax_cache"] and candidate["jax_cache_before"] == ""
    assert candidate["jax_cache"].split("/")[-1].startswith(rows.commit.iloc[-1])
    assert not (run_dir / "jax-cache").exists()  # removed when the run ended
    # The daemon's user-level cache is not named to candidate code (the tests' session sets it).
    assert first["user_cache_seen"] == candidate["user_cache_seen"] == "None"
