"""One experiment on Modal, as plain Python: what the train container does with a commit
(`train_archive`), what the scoring container does with a policy (`score_policy`), and
`one_experiment`, the two in a row as `modal run modal_app.py` runs them.

Nothing here imports modal: the Modal functions of functions.py call these (and tests call
them directly; tests/fake_modal.py runs them through those Modal functions, as a container would).
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import secrets
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable, Optional

from ...artifacts import POLICY_NAMES, TRAIN_SCRIPT, find_policy, log_tail, parse_summary, train_env
from ...config import budget_allowance
from ...processes import file_fingerprint, run_group, scrubbed_env

LOG_CAP_BYTES = 2_000_000    # the end of a train log that comes back
EVAL_TIMEOUT_S = 1800        # the harness itself
POLICY_REFUSED_EXIT = 4      # evaluate.POLICY_REFUSED_EXIT: the policy's graph holds an op a policy may not use


class HarnessRefused(ValueError):
    """The harness bytes do not have the hash the daemon recorded (nothing was run), or the harness refused
    the policy before running it (an op a policy may not use): recorded `invalid`, never a crash."""


class HarnessFailed(RuntimeError):
    """The harness ran and failed (bad artifact, timeout): the message is its last log line."""


# ---------------------------------------------------------------- a container's scratch
CONTAINER_ENV = "MODAL_TASK_ID"          # set by Modal in every container
CLEAN_STATE_FILE = ".autorl-clean-tmp"   # the temp folder's entries before the container's first call


def fresh_scratch() -> list[str]:
    """In a Modal container: remove what an earlier call left in the temp folder and return its names.

    The candidate functions run in single-use containers (functions.CANDIDATE_CONTAINER), so
    there is nothing to remove; should a container ever serve a second call, a confirmation must still
    not find its first run's weights or compile cache in /tmp. The first call records the folder's
    entries as the container started (before any candidate code ran); every later one removes the rest
    and checks they are gone. Outside a container (tests, `.local()`) it does nothing."""
    if not os.environ.get(CONTAINER_ENV):
        return []
    tmp = Path(tempfile.gettempdir())
    state = tmp / CLEAN_STATE_FILE
    if not state.exists():
        state.write_text(json.dumps(sorted(p.name for p in tmp.iterdir())))
        return []
    clean = set(json.loads(state.read_text())) | {CLEAN_STATE_FILE}
    left = sorted(p.name for p in tmp.iterdir() if p.name not in clean)
    for name in left:
        path = tmp / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    remaining = sorted(p.name for p in tmp.iterdir() if p.name not in clean)
    if remaining:
        raise RuntimeError(f"an earlier call's files in {tmp} could not be removed: {', '.join(remaining[:5])}")
    return left


# ---------------------------------------------------------------- train
def extract_archive(archive: bytes, dest: Path) -> None:
    """A `git archive --format=tar.gz` into `dest`; members that would land outside are refused."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        try:
            tar.extractall(dest, filter="data")
        except TypeError:  # pragma: no cover - a Python without extraction filters
            root = dest.resolve()
            for member in tar.getmembers():
                if not (dest / member.name).resolve().is_relative_to(root) or member.issym() or member.islnk():
                    raise ValueError(f"archive member {member.name!r} leaves the checkout")
            tar.extractall(dest)


def _log_tail_bytes(path: Path, cap: int) -> tuple[str, int]:
    """The last `cap` bytes of a log (with a note of what was cut) and its full size."""
    if not path.exists():
        return "", 0
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - cap))
        data = f.read()
    text = data.decode("utf-8", errors="replace")
    if size > cap:
        text = f"[... first {size - len(data)} bytes of the log cut ...]\n" + text.split("\n", 1)[-1]
    return text, size


def train_archive(archive: bytes, env_id: str, budget: float, seed: int, grace: Optional[float] = None,
                  extra_env: Optional[dict] = None, should_stop: Callable[[], bool] = lambda: False,
                  log_cap: int = LOG_CAP_BYTES, verdicts: Optional[dict] = None,
                  keyed_for: Optional[dict] = None) -> dict:
    """Extract a commit's archive into a fresh directory and run its candidate/train.py there for
    `budget` seconds (killed as a group at budget + grace, the budget's allowance) with a scrubbed
    environment.

    `verdicts` ({record file name: bytes}) are the run's verdicts and figures, keyed for the
    environment `keyed_for` (a container's `envs_fast.cache.environment()`): train.py finds them in
    its verdict cache and chooses among the same verified backends as the run. When this container's
    environment is another (other package versions, another GPU), they would not apply: nothing is
    trained, and the reply's `stale` says why (the daemon verifies again, in such a container).

    Returns policy (bytes or None), policy_name, log (its last `log_cap` bytes), metrics (the
    `key: value` summary), returncode, timed_out, wall_s, artifact_s (seconds from train.py's start
    to its complete artifact, by this container's clock: whatever it waited for before), and
    environment (this container's)."""
    grace = budget_allowance(budget) if grace is None else grace
    left = fresh_scratch()
    with tempfile.TemporaryDirectory(prefix="autorl-train-") as tmp:
        checkout, out_dir, log_path = Path(tmp) / "checkout", Path(tmp) / "out", Path(tmp) / "train.log"
        checkout.mkdir()
        out_dir.mkdir()
        extract_archive(archive, checkout)
        here = checkout_environment(checkout)
        if verdicts and keyed_for is not None and verdict_environment(keyed_for) != verdict_environment(here):
            return {"stale": environment_change(keyed_for, here), "environment": here, "policy": None,
                    "policy_name": None, "log": "", "metrics": {}, "returncode": None, "timed_out": False,
                    "wall_s": 0.0, "artifact_s": None, "left_by_earlier_call": left}
        extra = dict(extra_env or {})
        if verdicts:
            extra["AUTORL_VERIFY_CACHE"] = str(write_records(Path(tmp) / "verify-cache", verdicts))
        env = scrubbed_env({**train_env(out_dir, env_id, budget, seed), **extra})
        proc = run_group([sys.executable, TRAIN_SCRIPT], checkout, env, log_path, budget + grace, should_stop,
                         artifact=lambda: file_fingerprint(find_policy(out_dir)))
        log, _ = _log_tail_bytes(log_path, log_cap)
        policy = find_policy(out_dir)
        return {
            "policy": policy.read_bytes() if policy else None,
            "policy_name": policy.name if policy else None,
            "log": log,
            "metrics": parse_summary(log),
            "returncode": proc.returncode,
            "timed_out": proc.timed_out,
            "wall_s": proc.wall_s,
            "artifact_s": proc.artifact_s,
            "environment": here,
            "left_by_earlier_call": left,
        }


def checkout_environment(checkout: Path) -> dict:
    """This container's environment as the processes run in `checkout` key their records: the image's
    packages and GPU, the checkout's envs_fast (a commit's, which may differ from the image's: a night
    --from an older ref, or an image built from a checkout edited since)."""
    from envs_fast.cache import environment

    package = checkout / "envs_fast"
    return environment(package if package.is_dir() else None)


def verdict_environment(environment: dict) -> dict:
    """What of an environment decides a verdict: all of it but the CPU model and count (those decide
    throughput figures only, and containers of one GPU type run on several CPU models)."""
    machine = environment.get("machine") or {}
    return {**environment, "machine": {"gpus": machine.get("gpus", ""), "arch": machine.get("arch")}}


def environment_change(before: dict, now: dict) -> str:
    """One line: how `now` differs from `before` (packages, interpreter, GPU, compiler)."""
    changes = []
    old, new = before.get("versions") or {}, now.get("versions") or {}
    changes += [f"{name} {old.get(name, 'absent')} -> {new.get(name, 'absent')}"
                for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)]
    for key, label in (("python", "python"), ("rustc", "rustc")):
        if before.get(key) != now.get(key):
            changes.append(f"{label} {before.get(key)} -> {now.get(key)}")
    old_sources, new_sources = before.get("envs_fast") or {}, now.get("envs_fast") or {}
    if old_sources != new_sources:
        if isinstance(old_sources, dict) and isinstance(new_sources, dict):
            edited = sorted(n for n in set(old_sources) | set(new_sources) if old_sources.get(n) != new_sources.get(n))
            changes.append("envs_fast's " + ", ".join(edited[:4]) + (f" and {len(edited) - 4} more" if len(edited) > 4 else ""))
        else:  # an environment recorded before modules were listed one by one
            changes.append("envs_fast's source")
    gpus = [(e.get("machine") or {}).get("gpus", "") for e in (before, now)]
    if gpus[0] != gpus[1]:
        changes.append(f"GPU {gpus[0] or 'none'} -> {gpus[1] or 'none'}")
    return "the run's verdicts were made where " + ("; ".join(changes) or "something else differed")


def write_records(folder: Path, records: dict) -> Path:
    """A verdict cache folder holding `records` ({file name: bytes}); names with a path are refused."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in records.items():
        if Path(name).name != name or not name.endswith(".json"):
            raise ValueError(f"not a record name: {name!r}")
        (folder / name).write_bytes(data)
    return folder


def check_archive(archive: bytes, env_id: str, stage: str, args: list[str], records: dict, timeout_s: float,
                  should_stop: Callable[[], bool] = lambda: False, log_cap: int = LOG_CAP_BYTES,
                  budget_s: float = 0.0) -> dict:
    """`python -m envs_fast.<stage> --env ENV ARGS --json J` (stage verify or bench) in a commit's
    archive, with a verdict cache holding the run's `records`, in this container: a verdict and a
    figure are reached where training runs. Returns returncode, timed_out, log (its tail), json (the
    stage's, or None), records (every record file of the cache afterwards that is new or changed) and
    environment (this container's: the daemon names the records by it). Stage "environment" only
    reports the environment. `budget_s`: the run's training budget, which decides the path of
    train.py that a benchmark measures (AUTORL_TIME_BUDGET)."""
    from envs_fast.cache import environment

    if stage == "environment":
        return {"environment": environment()}
    if stage not in ("verify", "bench"):
        raise ValueError(f"unknown stage {stage!r}")
    fresh_scratch()
    with tempfile.TemporaryDirectory(prefix=f"autorl-{stage}-") as tmp:
        checkout, log_path, out = Path(tmp) / "checkout", Path(tmp) / f"{stage}.log", Path(tmp) / f"{stage}.json"
        checkout.mkdir()
        extract_archive(archive, checkout)
        cache = write_records(Path(tmp) / "verify-cache", records)
        env = scrubbed_env({"AUTORL_VERIFY_CACHE": str(cache), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
                            **({"AUTORL_TIME_BUDGET": str(budget_s)} if budget_s else {})})
        proc = run_group([sys.executable, "-m", f"envs_fast.{stage}", "--env", env_id, *args, "--json", str(out)],
                         checkout, env, log_path, timeout_s, should_stop)
        log, _ = _log_tail_bytes(log_path, log_cap)
        try:
            data = json.loads(out.read_text()) if out.exists() else None
        except ValueError:
            data = None
        found = {p.name: p.read_bytes() for p in cache.glob("*.json")}
        return {"returncode": proc.returncode, "timed_out": proc.timed_out, "log": log, "json": data,
                "records": {name: data for name, data in found.items() if records.get(name) != data},
                "environment": checkout_environment(checkout)}


# ---------------------------------------------------------------- score
def _cpu_count() -> int:
    """CPUs this container may use: its cgroup quota, else its affinity."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            return max(1, int(-(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def score_policy(harness: bytes, harness_sha256: str, policy: bytes, env_id: str, seed: int, episodes: int,
                 policy_name: str = "policy.pt", workers: Optional[int] = None,
                 timeout_s: float = EVAL_TIMEOUT_S) -> dict:
    """Check the harness against its hash, then run it as evaluate.py in a fresh process (scrubbed
    environment, no PYTHONPATH) on the policy; returns the JSON it wrote.

    Raises HarnessRefused on a wrong hash, HarnessFailed (last log line) when it fails."""
    actual = hashlib.sha256(harness).hexdigest()
    if actual != harness_sha256:
        raise HarnessRefused(f"harness sha256 {actual} is not the expected {harness_sha256}: not run")
    name = Path(policy_name or "policy.pt").name
    if name not in POLICY_NAMES:
        raise HarnessFailed(f"policy name {policy_name!r} is not one of {', '.join(POLICY_NAMES)}")
    fresh_scratch()
    with tempfile.TemporaryDirectory(prefix="autorl-eval-") as tmp:
        folder = Path(tmp)
        (folder / "evaluate.py").write_bytes(harness)
        (folder / name).write_bytes(policy)
        out_json, log_path = folder / "eval.json", folder / "eval.log"
        env = scrubbed_env({"PYTHONUNBUFFERED": "1", "AUTORL_EVAL_WORKERS": str(workers or _cpu_count())})
        env.pop("PYTHONPATH", None)  # nothing but installed packages and the harness itself
        cmd = [sys.executable, "evaluate.py", "--policy", name, "--env", env_id, "--episodes", str(episodes),
               "--seed", str(seed), "--out", str(out_json)]
        proc = run_group(cmd, folder, env, log_path, timeout_s, lambda: False)
        if proc.timed_out:
            raise HarnessFailed(f"evaluation took longer than {timeout_s:.0f}s")
        reason = log_tail(log_path, 1) or f"evaluate.py exited with {proc.returncode}"
        if proc.returncode == POLICY_REFUSED_EXIT:
            raise HarnessRefused(reason.removeprefix("evaluate.py: error: "))
        if proc.returncode != 0 or not out_json.exists():
            raise HarnessFailed(reason)
        return json.loads(out_json.read_text())


# ---------------------------------------------------------------- both, for `modal run modal_app.py`
def git_archive(root: Path) -> bytes:
    import git

    repo = git.Repo(root)
    if repo.is_dirty(untracked_files=False):
        print("note: uncommitted changes are not part of the experiment (it runs HEAD)")
    buffer = io.BytesIO()
    repo.archive(buffer, "HEAD", format="tar.gz")
    return buffer.getvalue()


def _time_budget(root: Path) -> float:
    """evaluate.TIME_BUDGET of the checkout (AUTORL_TIME_BUDGET overrides it there)."""
    spec = importlib.util.spec_from_file_location("_autorl_checkout_evaluate", root / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return float(module.TIME_BUDGET)


def one_experiment(fns, root: Path, env_id: str, budget: float, seed: int, episodes: int) -> dict:
    """Train `root`'s HEAD with `fns.train`, score its artifact with `fns.evaluate` and root's
    evaluate.py on a fresh random seed, print both; returns {"train", "score", "eval_seed"}.
    `fns` is a functions.ModalFunctions (anything whose two members have `.remote`)."""
    budget = budget or _time_budget(root)
    print(f"training HEAD of {root} on {env_id} for {budget:g}s (seed {seed}) ...")
    run = fns.train.remote(git_archive(root), env_id, budget, seed)
    print("\n".join(run["log"].splitlines()[-15:]))
    metrics = run["metrics"]
    print(f"train: returncode {run['returncode']}, {run['wall_s']:.1f}s, timed out {run['timed_out']}, "
          f"env_steps {metrics.get('env_steps', '?')}, sps {metrics.get('sps', '?')}")
    outcome = {"train": run, "score": None, "eval_seed": None}
    if run["policy"] is None:
        print("no policy artifact was exported: nothing to score")
        return outcome
    harness = (root / "evaluate.py").read_bytes()
    outcome["eval_seed"] = eval_seed = secrets.randbelow(2**31 - 1)
    outcome["score"] = result = fns.evaluate.remote(harness, hashlib.sha256(harness).hexdigest(), run["policy"],
                                                    env_id, eval_seed, episodes, run["policy_name"])
    print(f"score on {env_id}: mean {result['mean']:.2f} ± {result['se']:.2f} (se) over {result['episodes']} "
          f"episodes (seed {eval_seed}), iqm {result['iqm']:.2f}, min {result['min']:.2f}, max {result['max']:.2f}")
    return outcome
