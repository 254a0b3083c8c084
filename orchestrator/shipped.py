"""The backends a checkout ships, verified at setup: before its baseline, a run verifies (L1-L3) and
benchmarks the translations its start commit holds for the env (JAX `envs_fast/translations/<slug>.py`, Rust
`envs_fast/translations/<slug>.rs`) and gymnax where gymnax has the env, so that the baseline already trains on
the fastest verified backend (envs_fast.choose_backend reads the run's verdict cache, which starts
empty).

The work goes through the run's runner as a translate experiment's does (walled snapshot of the
commit, scratch cache, only the expected record merged back). A verdict or benchmark record made by
an earlier run for the same content, verifier and package versions comes from the user-level cache
instead (orchestrator/usercache.py), so the second run on an env pays close to nothing. What training
will use, and why, goes to daemon.log and to results/<tag>/backend.json (which `status` shows).
For a MuJoCo env envpool (trusted without a verdict, its MuJoCo build the engine backends' close
rival) is benchmarked beside them, so that choose_backend ranks it by a figure measured here.

`transfer` does the same for each env it trains on (a `Stage` of its own: the reports under
results/<tag>/transfer/<env>/setup/, the choice in results/<tag>/transfer/<env>/backend.json), into
the run's one verdict cache, whose records name their env.
"""
from __future__ import annotations

import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from envs_fast.protocol import is_file_spec, is_rust_spec, translation_files, translation_path
from envs_fast.verify.report import report_lines

from .artifacts import TRAIN_SCRIPT
from .config import RunConfig
from .daemon import log
from .inflight import InFlight
from .results import ExpFolder, RunFolder, read_json
from .runners import Runner, Slot
from .usercache import UserCache, bench_context, figures_name, user_cache_dir
from .workspace import Workspace

SETUP = "setup"                 # results/<tag>/setup/<backend>/: its verification report and benchmark
BACKEND_JSON = "backend.json"   # results/<tag>/backend.json: what the baseline trains on, and why
VERIFY_WORKERS = 3              # verifications at once (compile-bound; the benchmarks run one at a time)


@dataclass(frozen=True)
class Stage:
    """Who verifies what a commit ships, and where the files go: a run's setup (`Stage.setup`:
    results/<tag>/setup/<backend>/ and results/<tag>/backend.json), or `transfer` for one of its envs."""
    name: str     # what log lines start with: "setup", "transfer Hopper-v5"
    when: str     # how a verdict reached here is told: "at setup", "by transfer"
    home: Path    # holds SETUP/<backend>/ (each verification's report, the benchmark) and BACKEND_JSON
    before: str = ""  # how one found in the run's cache is told (default: `when`, a resumed stage's own)

    @classmethod
    def setup(cls, folder: RunFolder) -> "Stage":
        return cls("setup", "at setup", folder.path)

    @property
    def is_setup(self) -> bool:
        """A run's own setup, whose lines need no name (the daemon's log says "setting up")."""
        return self.name == "setup"

    def saved_choice(self) -> dict:
        """backend.json of an earlier pass of this stage ({} when there is none)."""
        return read_json(self.home / BACKEND_JSON)


@dataclass
class Shipped:
    """One backend the start commit ships, as setup finds it."""
    spec: str                     # as the runner verifies it: "envs_fast/translations/cartpole_v1.py" or "gymnax"
    local: str                    # the same in this setup's copy of the commit (record names hash its content)
    folder: ExpFolder             # results/<tag>/setup/<name>/
    passed: Optional[bool] = None
    how: str = ""                 # "verified at setup", "verified by an earlier run", or why it failed
                                  # (an unverified rival, envpool: "trusted without a verdict")
    figures: dict = field(default_factory=dict)   # the benchmark's JSON (train_sps, train_path, ...)

    @property
    def name(self) -> str:
        return self.folder.path.name


def shipped_specs(env_id: str, workspace: Workspace, commit: str, environment: Optional[dict] = None) -> list[str]:
    """The backends `commit` ships for `env_id`: its JAX and Rust translations (Rust where rustc
    can build it; a physics scene's JAX port only where training has a GPU, when a Rust port of it
    ships), then mujoco_batch and, where training has a GPU, mjx (MuJoCo envs they cover), then
    gymnax. `environment`: where training runs (runner.record_environment(); None: this machine)."""
    from envs_fast.cache import machine
    from envs_fast.backends.gymnax_backend import gymnax_supports
    from envs_fast.portability import engine_backends, engine_of

    specs = [translation_path(env_id, ".", lang).as_posix() for lang in ("jax", "rust")]
    specs = [spec for spec in specs if workspace.has_path(commit, spec)]
    if not builds_rust(environment) and any(is_rust_spec(spec) for spec in specs):
        where = "where training runs" if environment and "rustc" in environment else "on PATH"
        log.info("setup: rustc is not %s, so the Rust translation is not verified (nor trained on)", where)
        specs = [spec for spec in specs if not is_rust_spec(spec)]
    gpus = ((environment or {}).get("machine") or machine()).get("gpus", "")
    if engine_of(env_id) and len(specs) == 2 and not gpus:
        # BipedalWalker on 2 cores: the JAX port steps ~50x slower than the Rust one and verifying it
        # takes over an hour; it is written for GPUs, where setup verifies and benchmarks both
        log.info("setup: %s's JAX port %s is verified only where training has a GPU; on this CPU the Rust port "
                 "%s trains", env_id, specs[0], specs[1])
        specs = specs[1:]
    # the reference's engine (mujoco_batch, batched; mjx, its JAX port): verified like a translation. MJX
    # compiles for minutes and steps slower than mujoco_batch on a CPU, so setup verifies it where there is a GPU
    engines = [spec for spec in engine_backends(env_id) if spec != "mjx" or gpus]
    return specs + engines + (["gymnax"] if gymnax_supports(env_id) else [])


def saved_choice(folder: RunFolder) -> dict:
    return Stage.setup(folder).saved_choice()


def unverified_rivals(env_id: str, specs: list[str], environment: Optional[dict] = None) -> list[str]:
    """What training may use without a verdict and is benchmarked beside `specs`, so that a measured
    figure ranks it (choose_backend: it must be STATISTICAL_MARGIN times as fast as what is verified
    state by state): envpool for the MuJoCo envs an engine backend covers (envpool's MuJoCo build is
    their close rival, docs/results/throughput.md), unless a cached verdict fails it.
    Elsewhere a translation outruns envpool by far, and setup leaves it unmeasured."""
    from envs_fast.cache import cached_verdict
    from envs_fast.portability import engine_backends

    if not set(specs) & set(engine_backends(env_id)):
        return []
    from envs_fast.backends.envpool_backend import envpool_supports

    verdict = cached_verdict("envpool", env_id, environment)
    return ["envpool"] if envpool_supports(env_id) and (verdict is None or verdict.get("passed")) else []


def choice_line(choice: dict) -> str:
    """`training backend: envs_fast/translations/cartpole_v1.py (verified L1-L3 at setup, 1.12M train sps vs 60k
    reference (one gymnasium env)) -> jax-e2e`, from backend.json."""
    return f"training backend: {choice.get('backend', '?')} ({choice.get('why', '')}) -> {choice.get('path', '?')}"


def verify_at_setup(config: RunConfig, folder: RunFolder, workspace: Workspace, runner: Runner,
                    journal: InFlight, stop_requested, stage: Optional[Stage] = None) -> Optional[dict]:
    """Verify and benchmark what config.base_commit ships for config.env_id into the run's cache (or
    take the records from the user cache); write the stage's backend.json (default: the run's setup)
    and log the choice. `runner` works for config.env_id. None when stopped."""
    stage = stage or Stage.setup(folder)
    started = time.monotonic()
    verify_cache = folder.verify_cache
    user = UserCache(user_cache_dir(), verify_cache)
    commit, environment = config.base_commit, runner.record_environment()
    specs = shipped_specs(config.env_id, workspace, commit, environment)
    journal.set_waiting(f"{'setting up' if stage.is_setup else stage.name}: verifying the backends "
                        f"{commit[:7]} ships ({', '.join(specs) or 'none'})")
    try:
        with tempfile.TemporaryDirectory(prefix="autorl-setup-") as scratch:
            paths = [p for spec in specs if is_file_spec(spec) for p in translation_files(spec)] + [TRAIN_SCRIPT]
            copy = workspace.extract(commit, Path(scratch) / "commit", paths)
            backends = [Shipped(spec, str(copy / spec) if is_file_spec(spec) else spec,
                                ExpFolder(stage.home / SETUP / Path(spec).name)) for spec in specs]
            for backend in backends:
                backend.folder.path.mkdir(parents=True, exist_ok=True)
            where = f"bench/{bench_context(copy)}"
            if not _verify_all(backends, config, runner, user, commit, stage) or stop_requested():
                log.info("%s stopped before its verification ended; it is done again next time", stage.name)
                return None
            passed = [b for b in backends if b.passed]
            rivals = [Shipped(spec, spec, ExpFolder(stage.home / SETUP / spec), how="trusted without a verdict")
                      for spec in unverified_rivals(config.env_id, [b.spec for b in passed], environment)]
            if not _bench_all(passed + rivals, config, runner, user, commit, where, stage) and stop_requested():
                log.info("%s stopped during the benchmark; it is done again next time", stage.name)
                return None
            choice = _choose(config.env_id, copy, verify_cache, backends, environment, rivals, stage)
    finally:
        journal.set_waiting(None)
    choice["setup_seconds"] = round(time.monotonic() - started, 1)
    _write_json(stage.home / BACKEND_JSON, choice)
    log.info("%s%s [%s %.1fs]", "" if stage.is_setup else f"{stage.name}: ", choice_line(choice),
             stage.name, choice["setup_seconds"])
    return choice


def skipped(folder: RunFolder, why: str) -> dict:
    """backend.json of a run that did not verify at setup (--no-setup-verify, a Modal runner)."""
    choice = {"backend": "auto", "path": "as train.py decides", "why": why, "setup_seconds": 0.0, "backends": []}
    _write_json(folder.path / BACKEND_JSON, choice)
    log.info("setup verification skipped: %s", why)
    return choice


# ---------------------------------------------------------------- verify
def _verify_all(backends: list[Shipped], config: RunConfig, runner: Runner, user: UserCache, commit: str,
                stage: Stage) -> bool:
    """Each backend's verdict, from the run's cache, the user cache, or the verifier (several at
    once). False when a verification was interrupted."""
    from envs_fast.cache import changed_sources, record_name

    todo, where = [], runner.record_environment()  # records are named as training's processes name them
    for backend in backends:
        name = record_name("verdict", backend.local, config.env_id, where)
        ours = (user.run_cache / name).is_file()  # a resumed setup's own verdict (or the run's, for transfer)
        record = read_json(user.run_cache / name) if ours or user.lend(name) else None
        changed = changed_sources(record, where) if record else []
        if changed:  # made by an envs_fast edited since in a module its verification imported
            log.info("%s: %s: verified again: envs_fast's %s changed since its verdict", stage.name, backend.spec,
                     ", ".join(changed[:4]))
            record = None
        if record is not None:
            backend.passed = bool(record.get("passed"))
            when = (stage.before or stage.when) if ours else "by an earlier run (user cache)"
            if backend.passed:
                backend.how = _verified(record, when)
                _lend_library(backend, user)
                log.info("%s: %s: %s", stage.name, backend.spec, backend.how)
            else:  # remembered: the same code is not verified again (a change to it, or to the verifier, is)
                backend.how = f"verification failed {when}: {record.get('summary', '')}"[:300]
                log.warning("%s: %s: %s; not verified again until it changes", stage.name, backend.spec,
                            backend.how)
        else:
            todo.append((backend, name))
    if not todo:
        return True
    log.info("%s: verifying %s at L1-L3 for %s before training on it", stage.name, ", ".join(b.spec for b, _ in todo),
             config.env_id)

    def verify(item: tuple[Shipped, str]) -> bool:
        backend, name = item
        outcome = runner.verify(Slot(0, backend.folder, f"{stage.name} {backend.spec}"), commit, backend.spec, 0)
        if outcome.interrupted:
            return False
        backend.passed = outcome.passed
        report = backend.folder.verify_round(0)[1]
        if outcome.passed:
            backend.how = _verified(read_json(user.run_cache / name), stage.when)
            user.keep(name)
            _keep_library(backend, user)
            log.info("%s: %s %s", stage.name, backend.spec, backend.how)
        elif outcome.timed_out:  # no verdict: the next run verifies it again
            backend.how = f"verification timed out after {config.verify_timeout_s:.0f}s (not a failure)"
            log.warning("%s: %s: %s; the next run verifies it again (report %s); training falls back to another "
                        "backend", stage.name, backend.spec, backend.how, report)
        else:
            backend.how = f"verification failed (exit {outcome.returncode}): {first_failing_line(outcome.report)}"
            user.keep(name)  # a verdict (when the verifier reached one): remembered with its reason
            log.warning("%s: %s FAILED verification (report %s): %s; training falls back to another backend",
                        stage.name, backend.spec, report, first_failing_line(outcome.report))
        return True

    with ThreadPoolExecutor(max_workers=min(VERIFY_WORKERS, len(todo))) as pool:
        return all(list(pool.map(verify, todo)))


def _verified(record: dict, when: str) -> str:
    """`verified L1-L3 at setup`, saying so when the verification (its verdict `record`) was the
    weaker, statistical kind (a backend that cannot sync state with the reference: gymnax)."""
    weaker = "statistical only" in str(record.get("summary", ""))
    return f"verified L1-L3{' (statistically only: state not synced)' if weaker else ''} {when}"


def first_failing_line(report: str) -> str:
    """The line of a verifier's report that says what failed first: its first `[FAIL]` check, else
    the first line saying FAIL, else its last line (an error message)."""
    lines = report_lines(report)
    for marker in ("[FAIL]", "FAIL"):
        found = [line for line in lines if marker in line]
        if found:
            return found[0][:240]
    return lines[-1][:240] if lines else "no report"


def builds_rust(environment: Optional[dict] = None) -> bool:
    """Whether Rust translations can be built where training runs: the rustc that `environment` (a
    Modal container's) reports, else this machine's."""
    if environment and "rustc" in environment:
        return environment["rustc"] != "no rustc"
    from envs_fast.rust.build import rustc_available

    return rustc_available()


def _library(backend: Shipped) -> Optional[str]:
    """The folder name of a Rust translation's built library (`<source>-<toolchain>`)."""
    if not is_rust_spec(backend.local):
        return None
    from envs_fast.rust.build import library_path, rustc_available

    return library_path(backend.local).parent.name if rustc_available() else None


def _lend_library(backend: Shipped, user: UserCache) -> None:
    folder = _library(backend)
    if folder:
        user.lend_library(folder)


def _keep_library(backend: Shipped, user: UserCache) -> None:
    folder = _library(backend)
    if folder:
        user.keep_library(folder)


# ---------------------------------------------------------------- bench
def _bench_all(backends: list[Shipped], config: RunConfig, runner: Runner, user: UserCache, commit: str, where: str,
               stage: Stage) -> bool:
    """Each verified backend's throughput record in the run's cache and its figures: from the user
    cache when an earlier run on this machine measured the same content with the same train.py
    constants, else all the others measured side by side in one process (their figures under one
    load, in interleaved rounds: half of --bench-seconds per figure is enough for that)."""
    from envs_fast.cache import holds, record_name

    todo, environment = [], runner.record_environment()
    for backend in backends:
        name = record_name("bench", backend.local, config.env_id, environment)
        figures = user.read(figures_name(name), where)
        if figures and user.lend(name, where) and holds(read_json(user.run_cache / name), environment):
            backend.figures = figures
        else:
            todo.append((backend, name))
    if not todo:
        return True
    seconds = max(0.5, config.bench_seconds / 2)
    json_path = stage.home / SETUP / "bench.json"
    log.info("%s: benchmarking %s side by side (%gs per figure)", stage.name, ", ".join(b.spec for b, _ in todo),
             seconds)
    results = runner.bench_side_by_side(Slot(0, ExpFolder(stage.home / SETUP), f"{stage.name} benchmark"), commit,
                                        [b.spec for b, _ in todo], json_path, seconds)
    if not results:
        log.warning("%s: the benchmark failed (see %s)", stage.name, json_path.with_suffix(".log"))
        return False
    for (backend, name), figures in zip(todo, results):
        backend.figures = figures
        if user.keep(name, where):
            user.write(figures_name(name), figures, where)
        _keep_library(backend, user)
    return True


# ---------------------------------------------------------------- the choice
def _choose(env_id: str, copy: Path, verify_cache: Path, backends: list[Shipped], environment: Optional[dict],
            rivals: list[Shipped], stage: Stage) -> dict:
    """What train.py's `auto` picks in the start commit with the run's cache (where training runs:
    `environment`), and why. `rivals`: the unverified backends benchmarked beside them (envpool)."""
    import envs_fast
    from envs_fast.bench import train_num_envs
    from envs_fast.cache import cache_dir

    assert cache_dir() == verify_cache, "setup reads the run's verdict cache (AUTORL_VERIFY_CACHE)"
    chosen = envs_fast.choose_backend(env_id, train_num_envs(copy), root=copy, environment=environment)
    by_local = {b.local: b for b in backends + rivals}
    winner = by_local.get(chosen)
    summary = [{"backend": b.spec, "passed": b.passed, "how": b.how, "train_sps": b.figures.get("train_sps"),
                "train_path": b.figures.get("train_path"),
                "report": str(b.folder.verify_round(0)[1]) if b.passed is not None else None}
               for b in backends + rivals]
    if winner is not None:
        figures = winner.figures
        spec, path = winner.spec, figures.get("train_path") or ("jax-host" if is_rust_spec(winner.spec) else "?")
        why = winner.how
        if figures.get("train_sps"):
            why += (f", {_sps(figures['train_sps'])} train sps vs {_sps(figures.get('reference_sps'))} "
                    f"reference (one gymnasium env)")
        margin = f"{envs_fast.STATISTICAL_MARGIN:g}x"
        if winner.passed:  # what it beat without a verdict, which has to be `margin` as fast to win
            others = [b for b in rivals if b.figures.get("train_sps")]
            if others:
                why += "; " + ", ".join(f"{b.spec} {_sps(b.figures['train_sps'])}" for b in others) + \
                    f" unverified (it would need {margin})"
        else:  # an unverified rival won: by `margin` over what is verified
            others = [b for b in backends if b.passed and b.figures.get("train_sps")]
            if others:
                why += f", over {margin} " + ", ".join(f"{b.spec}'s {_sps(b.figures['train_sps'])}" for b in others)
    else:
        spec, path = chosen, "host"
        failed = [b.spec for b in backends if b.passed is False]
        if not backends:
            reason = f"envs_fast/translations/ holds no translation of {env_id} and gymnax has none"
        elif len(failed) == len(backends):
            reason = f"no shipped backend passed verification ({', '.join(failed)} failed)"
        elif any(b.passed and envs_fast.cache.cached_verdict(b.local, env_id, environment) is None for b in backends):
            # the verifier's records are named by the run's envs_fast (runner.record_environment()): a
            # record that is not there was lost (a cache folder removed during setup)
            reason = "a verified backend's verdict is no longer in the run's cache (removed during setup?)"
            log.warning("%s: %s", stage.name, reason)
        else:
            reason = "the cached figures rank it above the shipped backends"
        what = {"envpool": "envpool (trusted without a verdict)",
                "reference": "gymnasium's own vector env"}.get(chosen, chosen)
        why = f"{reason}: {what}"
    return {"backend": spec, "path": path, "why": why, "backends": summary, "time": time.time()}


def _sps(value) -> str:
    if not value:
        return "?"
    value = float(value)
    return f"{value / 1e6:.2f}M" if value >= 1e6 else f"{value / 1e3:.0f}k" if value >= 1e3 else f"{value:.0f}"


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)
