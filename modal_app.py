"""Runs autorl experiments, or a whole night, on Modal.

One experiment of this checkout (`git archive HEAD`) trained on a GPU container, then scored by
this checkout's evaluate.py on a CPU container with a fresh random seed:

    modal run modal_app.py --env-id BipedalWalker-v3 [--budget S] [--seed N] [--episodes N] [--gpu A100] [--cpu 4]

The whole night as a Modal job: the daemon (`python -m orchestrator run --runner modal ...`) runs
in a small CPU container over a clone of this checkout, each experiment's training on a GPU
container; after every experiment results/<tag>/ and branch autorl/<tag> are saved to the volume
`autorl-results`, and `python -m orchestrator pull --tag TAG` brings them home:

    modal run --detach modal_app.py::night --env-id ENV [--tag TAG] [--run-args "--until 07:00 --agent optuna"]
                                            [--secret NAME] [--tz Europe/Paris] [--no-wait]

GPU type and CPU count of the train containers: AUTORL_MODAL_GPU (default H100) and
AUTORL_MODAL_CPU (default 8), read at import (also AUTORL_MODAL_EVAL_CPU, AUTORL_MODAL_TIMEOUT);
per call, `configured(gpu="A100", cpu=4)` returns the functions with those options
(`Function.with_options`): this is what the daemon's --modal-gpu/--modal-cpu go through.

Importing this module makes no network call. The work itself is in plain functions
(`train_archive`, `score_policy`, `sync_run`, `run_night`) that the Modal functions call.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path
from typing import Callable, NamedTuple, Optional

import modal

from orchestrator.modal_support import (BUNDLE_NAME, NIGHT_LOG_NAME, NOT_SYNCED, VOLUME_NAME,
                                        copy_changed, fetch_branch_bundle, write_branch_bundle)

ROOT = Path(__file__).resolve().parent
TORCH_SPEC = "torch==2.13.0"  # as the Makefile; PyPI's Linux wheel of torch is the CUDA build

TRAIN_GPU = os.environ.get("AUTORL_MODAL_GPU", "H100")
TRAIN_CPU = float(os.environ.get("AUTORL_MODAL_CPU", 8))
EVAL_CPU = float(os.environ.get("AUTORL_MODAL_EVAL_CPU", 8))
NIGHT_CPU = 2.0
TRAIN_TIMEOUT_S = int(os.environ.get("AUTORL_MODAL_TIMEOUT", 4 * 3600))  # a cap: run_group kills at budget + grace
EVAL_TIMEOUT_S = 1800                                                     # the harness itself
NIGHT_TIMEOUT_S = 24 * 3600                                               # Modal's longest
LOG_CAP_BYTES = 2_000_000    # the end of a train log that comes back
RESULTS_MOUNT = "/autorl-results"
FUNCTION_IDS_ENV = "AUTORL_MODAL_FUNCTIONS"  # set in the night container for the daemon it runs

image = (
    modal.Image.debian_slim(python_version="3.11")
    .apt_install("swig", "build-essential", "git", "tzdata")  # swig + compilers: Box2D
    .pip_install(TORCH_SPEC)
    .pip_install_from_pyproject(str(ROOT / "pyproject.toml"))  # torch>=2.4 is then already met
    .pip_install("jax[cuda12]")                                 # the CUDA plugin of the jax just installed
    .env({"PYTHONUNBUFFERED": "1"})
    .add_local_python_source("orchestrator", "envs_fast")
    .add_local_file(ROOT / "evaluate.py", "/root/evaluate.py")
)
app = modal.App("autorl", image=image)
results_volume = modal.Volume.from_name(VOLUME_NAME, create_if_missing=True)


class HarnessRefused(ValueError):
    """The harness bytes do not have the hash the daemon recorded: nothing was run."""


class HarnessFailed(RuntimeError):
    """The harness ran and failed (bad artifact, timeout): the message is its last log line."""


# ---------------------------------------------------------------- train: plain logic
def _extract(archive: bytes, dest: Path) -> None:
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
                  log_cap: int = LOG_CAP_BYTES) -> dict:
    """Extract a commit's archive into a fresh directory and run its candidate/train.py there for
    `budget` seconds (killed as a group at budget + grace) with a scrubbed environment.

    Returns policy (bytes or None), policy_name, log (its last `log_cap` bytes), log_bytes,
    metrics (the `key: value` summary), returncode, timed_out, wall_s."""
    from orchestrator.artifacts import TRAIN_SCRIPT, find_policy, parse_summary, train_env
    from orchestrator.processes import run_group, scrubbed_env

    grace = max(30.0, 0.1 * budget) if grace is None else grace
    with tempfile.TemporaryDirectory(prefix="autorl-train-") as tmp:
        checkout, out_dir, log_path = Path(tmp) / "checkout", Path(tmp) / "out", Path(tmp) / "train.log"
        checkout.mkdir()
        out_dir.mkdir()
        _extract(archive, checkout)
        env = scrubbed_env({**train_env(out_dir, env_id, budget, seed), **(extra_env or {})})
        proc = run_group([sys.executable, TRAIN_SCRIPT], checkout, env, log_path, budget + grace, should_stop)
        log, log_bytes = _log_tail_bytes(log_path, log_cap)
        policy = find_policy(out_dir)
        return {
            "policy": policy.read_bytes() if policy else None,
            "policy_name": policy.name if policy else None,
            "log": log,
            "log_bytes": log_bytes,
            "metrics": parse_summary(log),
            "returncode": proc.returncode,
            "timed_out": proc.timed_out,
            "wall_s": proc.wall_s,
        }


# ---------------------------------------------------------------- evaluate: plain logic
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
    from orchestrator.artifacts import POLICY_NAMES, log_tail
    from orchestrator.processes import run_group, scrubbed_env

    actual = hashlib.sha256(harness).hexdigest()
    if actual != harness_sha256:
        raise HarnessRefused(f"harness sha256 {actual} is not the expected {harness_sha256}: not run")
    name = Path(policy_name or "policy.pt").name
    if name not in POLICY_NAMES:
        raise HarnessFailed(f"policy name {policy_name!r} is not one of {', '.join(POLICY_NAMES)}")
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
        if proc.returncode != 0 or not out_json.exists():
            raise HarnessFailed(log_tail(log_path, 1) or f"evaluate.py exited with {proc.returncode}")
        return json.loads(out_json.read_text())


# ---------------------------------------------------------------- the night: plain logic
def sync_run(checkout: Path, tag: str, target_root: Path, night_log: Optional[Path] = None) -> list[str]:
    """Copy results/<tag>/ of `checkout` (new or changed files) and a bundle of its branch
    autorl/<tag> into `target_root/<tag>/` (the volume's layout); returns what was copied."""
    target = Path(target_root) / tag
    source = Path(checkout) / "results" / tag
    copied = copy_changed(source, target, skip=(*NOT_SYNCED, BUNDLE_NAME, NIGHT_LOG_NAME)) if source.is_dir() else []
    if write_branch_bundle(checkout, tag, target / BUNDLE_NAME):
        copied.append(BUNDLE_NAME)
    if night_log is not None and Path(night_log).is_file():
        target.mkdir(parents=True, exist_ok=True)
        data = Path(night_log).read_bytes()
        (target / NIGHT_LOG_NAME).write_bytes(data)
        copied.append(NIGHT_LOG_NAME)
    return copied


def restore_run(source: Path, checkout: Path, tag: str) -> bool:
    """The reverse of sync_run (a night resuming a run of an earlier night): `source` (= volume's
    <tag>/) back into results/<tag>/ and branch autorl/<tag>. False when there is nothing."""
    if not (Path(source) / "results.tsv").is_file():
        return False
    copy_changed(source, Path(checkout) / "results" / tag, skip=(*NOT_SYNCED, BUNDLE_NAME, NIGHT_LOG_NAME))
    if (Path(source) / BUNDLE_NAME).is_file():
        fetch_branch_bundle(checkout, Path(source) / BUNDLE_NAME, tag)
    return True


class RunSync:
    """Copies a run to the volume whenever its results.tsv changes (a thread), and once at the end."""

    def __init__(self, checkout: Path, tag: str, target_root: Path, commit: Callable[[], None],
                 poll_s: float = 5.0, night_log: Optional[Path] = None):
        self.checkout, self.tag, self.target_root = Path(checkout), tag, Path(target_root)
        self.commit, self.poll_s, self.night_log = commit, poll_s, night_log
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._seen = None
        self._thread = threading.Thread(target=self._watch, name="autorl-volume-sync", daemon=True)

    def _stamp(self):
        try:
            st = (self.checkout / "results" / self.tag / "results.tsv").stat()
            return st.st_mtime_ns, st.st_size
        except OSError:
            return None

    def sync_now(self) -> list[str]:
        with self._lock:
            self._seen = self._stamp()
            try:
                copied = sync_run(self.checkout, self.tag, self.target_root, self.night_log)
                self.commit()
                return copied
            except Exception as exc:  # noqa: BLE001 - a failed copy must not end the night
                print(f"[autorl night] saving results to the volume failed: {exc!r}", flush=True)
                return []

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            stamp = self._stamp()
            if stamp is not None and stamp != self._seen:
                self.sync_now()

    def start(self) -> "RunSync":
        self._thread.start()
        return self

    def stop(self) -> list[str]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.sync_now()


def clone_bundle(bundle: bytes, dest: Path, identity: tuple[str, str] = ("autorl", "autorl@modal.invalid")) -> Path:
    """A checkout at `dest` from a `git bundle` of HEAD and the branches (all of them local)."""
    import git

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    bundle_path = dest.parent / f"{dest.name}.bundle"
    bundle_path.write_bytes(bundle)
    repo = git.Repo.clone_from(str(bundle_path), str(dest))
    repo.git.fetch("--quiet", "--update-head-ok", str(bundle_path), "+refs/heads/*:refs/heads/*")
    repo.delete_remote("origin")
    with repo.config_writer() as config:
        config.set_value("user", "name", identity[0] or "autorl")
        config.set_value("user", "email", identity[1] or "autorl@modal.invalid")
    return dest


def daemon_command(env_id: str, tag: str, run_args: str) -> list[str]:
    args = shlex.split(run_args or "")
    for option in ("--env", "--tag"):
        if any(a == option or a.startswith(option + "=") for a in args):
            raise ValueError(f"give {option} as the night's own option (--env-id / --tag), not in --run-args")
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        args = ["--runner", "modal", *args]
    return [sys.executable, "-m", "orchestrator", "run", "--env", env_id, "--tag", tag, *args]


def run_night(bundle: bytes, env_id: str, tag: str, run_args: str, volume_root: Path,
              commit: Callable[[], None] = lambda: None, function_ids: Optional[dict] = None,
              workdir: Optional[Path] = None, poll_s: float = 5.0,
              identity: tuple[str, str] = ("autorl", "autorl@modal.invalid"), tz: str = "") -> int:
    """Clone the checkout, run the daemon over it (its output to stdout and night.log), and keep
    `volume_root/<tag>/` up to date after every experiment; returns the daemon's exit code."""
    work = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="autorl-night-"))
    work.mkdir(parents=True, exist_ok=True)
    checkout = clone_bundle(bundle, work / "autorl", identity)
    cmd = daemon_command(env_id, tag, run_args)
    saved = Path(volume_root) / tag
    if (saved / "results.tsv").is_file():
        if "--resume" not in cmd:
            print(f"[autorl night] run {tag!r} already exists in the volume {VOLUME_NAME}: pass "
                  f"--run-args '--resume ...' to continue it, or another --tag", flush=True)
            return 2
        restore_run(saved, checkout, tag)
        print(f"[autorl night] resuming {tag!r} from the volume {VOLUME_NAME}", flush=True)
    env = dict(os.environ)
    if function_ids:
        env[FUNCTION_IDS_ENV] = json.dumps(function_ids)
    if tz:
        env["TZ"] = tz
    night_log = work / NIGHT_LOG_NAME
    sync = RunSync(checkout, tag, volume_root, commit, poll_s, night_log).start()
    print(f"[autorl night] {' '.join(shlex.quote(c) for c in cmd[1:])}", flush=True)
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        out = getattr(sys.stdout, "buffer", None)
        with open(night_log, "ab") as log:
            for line in proc.stdout:
                if out is not None:
                    out.write(line)
                else:
                    sys.stdout.write(line.decode("utf-8", errors="replace"))
                sys.stdout.flush()
                log.write(line)
                log.flush()
        return proc.wait()
    finally:
        if proc.poll() is None:  # interrupted here (container stopping): let the daemon stop cleanly
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        sync.stop()


# ---------------------------------------------------------------- Modal functions
@app.function(gpu=TRAIN_GPU, cpu=TRAIN_CPU, timeout=TRAIN_TIMEOUT_S, block_network=True,
              restrict_modal_access=True)
def train_experiment(archive: bytes, env_id: str, budget: float, seed: int, grace: float | None = None,
                     extra_env: dict | None = None) -> dict:
    """Train a commit (`git archive --format=tar.gz COMMIT`) for `budget` seconds on a GPU. No
    secret, no harness and no held-out seed enter this container."""
    return train_archive(archive, env_id, budget, seed, grace, extra_env)


@app.function(cpu=EVAL_CPU, timeout=EVAL_TIMEOUT_S + 300, block_network=True, restrict_modal_access=True)
def evaluate_policy(harness: bytes, harness_sha256: str, policy: bytes, env_id: str, seed: int, episodes: int,
                    policy_name: str = "policy.pt") -> dict:
    """Score a policy artifact with the trusted harness (checked against its sha256) on CPUs."""
    return score_policy(harness, harness_sha256, policy, env_id, seed, episodes, policy_name)


@app.function(cpu=NIGHT_CPU, timeout=NIGHT_TIMEOUT_S, volumes={RESULTS_MOUNT: results_volume})
def night_daemon(bundle: bytes, env_id: str, tag: str, run_args: str = "", identity: tuple | None = None,
                 tz: str = "") -> int:
    """The daemon over a clone of `bundle`, its experiments on train_experiment/evaluate_policy of
    this running app (by id), its run saved to the volume after every experiment."""
    ids = {"train_experiment": train_experiment.object_id, "evaluate_policy": evaluate_policy.object_id}
    return run_night(bundle, env_id, tag, run_args, Path(RESULTS_MOUNT), commit=results_volume.commit,
                     function_ids=ids, identity=tuple(identity or ("autorl", "autorl@modal.invalid")), tz=tz)


class ModalFunctions(NamedTuple):
    train: modal.Function      # train_experiment(archive, env_id, budget, seed, grace=None, extra_env=None)
    evaluate: modal.Function   # evaluate_policy(harness, harness_sha256, policy, env_id, seed, episodes, policy_name)


def configured(gpu: str | None = None, cpu: float | None = None, timeout_s: int | None = None) -> ModalFunctions:
    """train_experiment and evaluate_policy, the train containers with GPU type `gpu` and `cpu`
    CPUs (None: AUTORL_MODAL_GPU / AUTORL_MODAL_CPU) and a `timeout_s` cap. Call inside a running
    app (`session()`, `app.run()`, a local entrypoint); in the night container (where
    AUTORL_MODAL_FUNCTIONS holds their ids) the running app's functions are looked up by id."""
    train, evaluate = train_experiment, evaluate_policy
    ids = json.loads(os.environ.get(FUNCTION_IDS_ENV) or "{}")
    if ids:
        train = modal.Function.from_id(ids["train_experiment"])
        evaluate = modal.Function.from_id(ids["evaluate_policy"])
    if gpu or cpu or timeout_s:
        # resources are replaced as a whole by with_options: always give both GPU and CPU
        train = train.with_options(gpu=gpu or TRAIN_GPU, cpu=float(cpu or TRAIN_CPU), timeout=timeout_s)
    return ModalFunctions(train, evaluate)


@contextlib.contextmanager
def session(gpu: str | None = None, cpu: float | None = None, timeout_s: int | None = None):
    """`with session(gpu, cpu) as fns: fns.train.spawn(...)`: the configured functions of a running
    app (a fresh `app.run()` for the block; in the night container, the night's own app)."""
    if os.environ.get(FUNCTION_IDS_ENV):
        yield configured(gpu, cpu, timeout_s)
        return
    with app.run():
        yield configured(gpu, cpu, timeout_s)


# ---------------------------------------------------------------- local entrypoints
def _git_archive(root: Path) -> bytes:
    import git

    repo = git.Repo(root)
    if repo.is_dirty(untracked_files=False):
        print("note: uncommitted changes are not part of the experiment (it runs HEAD)")
    buffer = io.BytesIO()
    repo.archive(buffer, "HEAD", format="tar.gz")
    return buffer.getvalue()


def _time_budget(root: Path) -> float:
    """evaluate.TIME_BUDGET of the checkout (AUTORL_TIME_BUDGET overrides it there)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_autorl_checkout_evaluate", root / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return float(module.TIME_BUDGET)


def one_experiment(fns: ModalFunctions, root: Path, env_id: str, budget: float, seed: int, episodes: int) -> dict:
    """Train `root`'s HEAD with `fns.train`, score its artifact with `fns.evaluate` and root's
    evaluate.py on a fresh random seed, print both; returns {"train", "score", "eval_seed"}."""
    import secrets

    budget = budget or _time_budget(root)
    print(f"training HEAD of {root} on {env_id} for {budget:g}s (seed {seed}) ...")
    run = fns.train.remote(_git_archive(root), env_id, budget, seed)
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


@app.local_entrypoint()
def main(env_id: str = "CartPole-v1", budget: float = 0, seed: int = 1, episodes: int = 100, gpu: str = "",
         cpu: float = 0):
    """One experiment of this checkout's HEAD on Modal: train on a GPU, score with evaluate.py.
    --budget 0: evaluate.TIME_BUDGET. --gpu/--cpu: the train container (default AUTORL_MODAL_GPU/CPU)."""
    print(f"GPU {gpu or TRAIN_GPU}, {cpu or TRAIN_CPU:g} CPUs")
    if one_experiment(configured(gpu or None, cpu or None), ROOT, env_id, budget, seed, episodes)["score"] is None:
        raise SystemExit(1)


def _default_tag(env_id: str) -> str:
    from orchestrator.config import default_tag

    return default_tag(env_id)


def _local_timezone() -> str:
    """This machine's IANA time zone (so --until 07:00 means 07:00 here), or "" if unknown."""
    if os.environ.get("TZ"):
        return os.environ["TZ"].lstrip(":")
    target = os.path.realpath("/etc/localtime")
    return target.split("zoneinfo/", 1)[1] if "zoneinfo/" in target else ""


def _checkout_bundle(root: Path) -> tuple[bytes, tuple[str, str]]:
    """A git bundle of HEAD and every local branch, and the git identity to commit with."""
    import git

    repo = git.Repo(root)
    if repo.is_dirty(untracked_files=False):
        print("note: uncommitted changes are not part of the night (it runs the committed checkout)")
    with tempfile.TemporaryDirectory(prefix="autorl-bundle-") as tmp:
        path = Path(tmp) / "checkout.bundle"
        repo.git.bundle("create", str(path), "HEAD", "--branches")
        data = path.read_bytes()
    reader = repo.config_reader()
    identity = (reader.get_value("user", "name", "autorl"), reader.get_value("user", "email", "autorl@modal.invalid"))
    return data, (str(identity[0]), str(identity[1]))


def start_night(env_id: str = "BipedalWalker-v3", tag: str = "", run_args: str = "", secret: str = "",
                tz: str = "", wait: bool = True):
    """A whole night on Modal: the daemon in a CPU container over this checkout (HEAD and branches,
    as a git bundle), experiments on GPU containers, the run saved to the volume after every
    experiment. --run-args: extra daemon options, e.g. "--until 07:00 --agent optuna --modal-gpu A100".
    --secret: a Modal Secret for the agent (e.g. one holding ANTHROPIC_API_KEY). The night goes on
    when this command ends or is interrupted; `python -m orchestrator pull --tag TAG` brings it home."""
    tag = tag or _default_tag(env_id)
    daemon_command(env_id, tag, run_args)  # refuse bad run args before anything is created
    bundle, identity = _checkout_bundle(ROOT)
    with app.run(name=f"autorl night {tag}", detach=True):  # detached: the night outlives this process
        function = night_daemon.with_options(secrets=[modal.Secret.from_name(secret)]) if secret else night_daemon
        call = function.spawn(bundle, env_id, tag, run_args, identity, tz or _local_timezone())
        print(f"night {tag!r} started on Modal (function call {call.object_id}); results go to the volume "
              f"{VOLUME_NAME} after every experiment.\n"
              f"  bring them home:  python -m orchestrator pull --tag {tag}\n"
              f"  stop the night:   python -c \"import modal; modal.FunctionCall.from_id('{call.object_id}')"
              f".cancel()\"   (or modal app stop)")
        if wait:
            print("waiting for the night to end (Ctrl-C leaves it running) ...")
            print(f"night {tag!r} ended: the daemon exited with {call.get()}")


# `modal run modal_app.py::night` resolves to this one entrypoint ("night.start") of its own small
# app, so that plain `modal run modal_app.py` still has a single module-level entrypoint (main).
night = modal.App("autorl-night")
night.local_entrypoint(name="start")(start_night)
