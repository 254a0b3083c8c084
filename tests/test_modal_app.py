"""modal_app.py and the Modal plumbing of the daemon (orchestrator/runners/modal/), offline:
modal_app imports without a network or a token, its CLI parses, the Modal functions do their work
through `.local()` (real train.py and evaluate.py subprocesses), a run folder goes to a volume folder and comes back with `pull`
(through tests/fake_modal.py's volume: what a container commits is what `pull` reads), and missing credentials
are named in one line."""
from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import git
import modal
import pytest

from orchestrator.runners.modal.support import (BUNDLE_NAME, check_modal_reachable, container_settings,
                                        modal_credentials_problem, write_branch_bundle)
from orchestrator.runners.modal.pull import PullError, pull
from orchestrator.sandbox import probe as sandbox_probe
from orchestrator.runners.modal import doctor as modal_doctor, experiment as modal_experiment
from orchestrator.runners.modal import functions as modal_functions, night as modal_night
from tests.conftest import AUTORL_ROOT, PYTHON, tiny_train_py
from tests.fake_modal import FakeVolume

HARNESS = (AUTORL_ROOT / "evaluate.py").read_bytes()
HARNESS_SHA = hashlib.sha256(HARNESS).hexdigest()
MODAL_CLI = Path(PYTHON).parent / "modal"


def offline_env(home: Path) -> dict:
    """This environment without any Modal setting, with an empty HOME (so no ~/.modal.toml)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODAL_")}
    env["HOME"] = str(home)
    return env


def archive_of(repo: Path) -> bytes:
    return subprocess.run(["git", "archive", "--format=tar.gz", "HEAD"], cwd=repo, capture_output=True,
                          check=True).stdout


@pytest.fixture
def one_eval_worker(monkeypatch):
    """Score in one process (a pool of spawned workers costs seconds here)."""
    monkeypatch.setattr(modal_experiment, "_cpu_count", lambda: 1)


# ---------------------------------------------------------------- import and CLI, offline
def test_import_is_offline_and_fast(tmp_path):
    started = time.monotonic()
    proc = subprocess.run([PYTHON, "-c", "import modal_app"], cwd=AUTORL_ROOT, env=offline_env(tmp_path),
                          capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    # The contract is < 5 s (about 1 s here); the bound is generous so a loaded machine cannot flake.
    assert elapsed < 15, elapsed


@pytest.mark.skipif(not MODAL_CLI.exists(), reason="the modal CLI is not installed next to this python")
def test_modal_run_help_lists_the_options(tmp_path):
    for ref, options in (("modal_app.py", ("--env-id", "--budget", "--seed", "--episodes", "--gpu", "--cpu")),
                         ("modal_app.py::night", ("--env-id", "--tag", "--run-args", "--secret")),
                         ("modal_app.py::doctor", ("--gpu", "--budget"))):
        proc = subprocess.run([str(MODAL_CLI), "run", ref, "--help"], cwd=AUTORL_ROOT, env=offline_env(tmp_path),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for option in options:
            assert option in proc.stdout, (ref, proc.stdout)


def test_configured_overrides_gpu_and_cpu_without_network(monkeypatch):
    monkeypatch.delenv(modal_night.FUNCTION_IDS_ENV, raising=False)
    fns = modal_functions.configured()
    assert fns.train is modal_functions.train_experiment and fns.evaluate is modal_functions.evaluate_policy
    fns = modal_functions.configured(gpu="A100", cpu=4)
    assert fns.train is not modal_functions.train_experiment
    assert fns.evaluate is modal_functions.evaluate_policy
    # In the night container the daemon finds the running app's functions by id (lazily: no call yet).
    monkeypatch.setenv(modal_night.FUNCTION_IDS_ENV,
                       '{"train_experiment": "fu-1", "evaluate_policy": "fu-2", "check_backend": "fu-3"}')
    with modal_functions.session(gpu="L4", cpu=2) as fns:
        assert isinstance(fns.train, modal.Function) and isinstance(fns.evaluate, modal.Function)
        assert isinstance(fns.check, modal.Function)   # verify and bench: on the run's GPU type too
        assert fns.evaluate is not modal_functions.evaluate_policy


def test_the_image_sources_are_checked_before_a_run(tmp_path, monkeypatch):
    """`--runner modal` refuses a tree without the files the image is built from (Modal reads
    them only when it builds the image, after the run was created)."""
    assert modal_functions.image_problem() is None
    monkeypatch.setattr(modal_functions, "ROOT", tmp_path)
    (tmp_path / "evaluate.py").write_text("")
    problem = modal_functions.image_problem()
    assert "pyproject.toml" in problem and "evaluate.py" not in problem and "\n" not in problem


@pytest.mark.skipif(not MODAL_CLI.exists(), reason="the modal CLI is not installed next to this python")
def test_doctor_without_a_token_fails_in_one_line_naming_modal_token_new(tmp_path):
    proc = subprocess.run([str(MODAL_CLI), "run", "modal_app.py::doctor"], cwd=AUTORL_ROOT, env=offline_env(tmp_path),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and "modal token new" in lines[0], lines


def test_the_image_has_one_cuda_major_for_torch_and_jax():
    """torch's CUDA major is stated for the pinned torch (a bump must say which it is), JAX's CUDA
    plugin is asked for that major, the installed jax offers it, and Modal's torch is the Makefile's."""
    import importlib.metadata

    version = modal_functions.TORCH_SPEC.split("==")[1]
    major = modal_functions.TORCH_CUDA_MAJORS[version]
    assert modal_functions.CUDA_MAJOR == major and modal_functions.JAX_CUDA_SPEC == f"jax[cuda{major}]"
    assert f"cuda{major}" in importlib.metadata.metadata("jax").get_all("Provides-Extra")
    assert f"TORCH_SPEC ?= {modal_functions.TORCH_SPEC}" in (AUTORL_ROOT / "Makefile").read_text()


def test_doctor_problems_name_what_keeps_a_night_off_the_gpu():
    def report(**changes):
        good = {"driver": "NVIDIA H100 80GB HBM3, 580.65.06, 81559 MiB",
                "torch": {"version": "2.13.0", "cuda": "13.0", "cuda_major": 13, "gpu": True, "device": "NVIDIA H100"},
                "jax": {"version": "0.10.2", "backend": "gpu", "devices": ["cuda:0"],
                        "plugins": ["jax-cuda13-plugin 0.10.2"], "cuda_majors": [13]},
                "env_id": "CartPole-v1", "budget_s": 20.0,
                "jax_host": {"path": "jax-host", "device": "gpu", "trained": True, "returncode": 0, "log_tail": "",
                             "env_steps": 100000, "sps": 5000, "compile_seconds": "2.50", "episode_return": 500.0},
                "verify": {"passed": True, "summary": "PASS"},
                "jax_e2e": {"path": "jax-e2e", "device": "gpu (cuda:0)", "trained": True, "returncode": 0,
                            "log_tail": "", "env_steps": 9000000, "sps": 450000, "compile_seconds": "3.10",
                            "episode_return": 500.0}}
        for key, value in changes.items():
            good[key] = good[key] | value
        return good

    assert modal_doctor.problems(report()) == []
    assert "ok: train.py's JAX learner trains on the GPU on both paths" in modal_doctor.format_report(
        report() | {"problems": []})
    two = modal_doctor.problems(report(jax={"plugins": ["jax-cuda12-plugin 0.10.2"], "cuda_majors": [12]}))
    assert len(two) == 1 and "two CUDA majors" in two[0] and "13.0" in two[0]
    assert modal_doctor.problems(report(torch={"gpu": False})) == []  # torch only loads the artifact
    on_cpu = modal_doctor.problems(report(jax_host={"device": "cpu"}))
    assert on_cpu == ["the jax-host path trained on cpu, not the GPU"]
    assert "jax-e2e path trained on cpu" in modal_doctor.problems(report(jax_e2e={"device": "cpu"}))[0]
    assert "not jax-e2e" in modal_doctor.problems(report(jax_e2e={"path": "jax-host"}))[0]


def test_the_image_and_make_install_install_one_lock_and_the_doctor_names_a_drift():
    """One constraints.txt, read by make install and by every pip step of the image: this venv (built
    by make install) is the locked set, and a container that resolved another version is a problem
    the doctor names (the image once resolved `mujoco>=4.0,<5` and an unbounded jax at build time)."""
    from orchestrator.lockfile import differences, installed_versions, read_lock

    lock = read_lock()
    assert {"torch", "jax", "jaxlib", "jax-cuda13-plugin", "mujoco", "mujoco-mjx", "gymnasium", "box2d"} <= set(lock)
    assert differences(installed_versions()) == [], "this venv is not the locked set: make clean install"
    makefile = (AUTORL_ROOT / "Makefile").read_text()
    assert makefile.count("pip install -q -c constraints.txt") == 2
    assert modal_functions.PIP_LOCKED == f"-c {modal_functions.LOCK_IN_IMAGE}"
    assert "constraints.txt" in modal_functions.IMAGE_FILES
    assert modal_functions.JAX_CUDA_SPEC == "jax[cuda13]" and lock["jax-cuda13-plugin"] == lock["jax"]
    drifted = {**{name: version for name, version in lock.items()}, "mujoco": "4.1.0", "torch": "2.13.0+cu130",
               "Jax": "0.11.2"}
    assert differences(drifted) == ["jax 0.11.2 (locked 0.10.2)", "mujoco 4.1.0 (locked 4.0.0)"]
    good = {"driver": "", "torch": {"cuda_major": 13}, "unlocked": ["mujoco 4.1.0 (locked 4.0.0)"],
            "jax": {"version": "0.10.2", "backend": "gpu", "devices": ["cuda:0"], "plugins": [], "cuda_majors": [13]},
            "jax_host": {"trained": True, "device": "gpu"}, "verify": {"passed": False, "summary": "x"}}
    assert "not the tested set of constraints.txt: mujoco 4.1.0 (locked 4.0.0)" in modal_doctor.problems(good)[0]


@pytest.mark.long
@pytest.mark.slow
def test_doctor_reports_what_this_machine_trains_on(autorl_repo):
    """gpu_doctor's work, run here: the shipped train.py on each path, each saying its device (on a
    machine without a GPU, that is the problem the doctor reports)."""
    import jax

    # every kind of fast path, CartPole's standing in for BipedalWalker's ports (which compile for minutes on
    # a CPU); a path the checkout lacks is a problem the doctor names
    paths = (("CartPole-v1", "jax"), ("Hopper-v5", "jax"), ("HalfCheetah-v5", "mjx"), ("CartPole-v1", "rust"))
    report = modal_doctor.diagnose(archive_of(autorl_repo()), budget=8, paths=paths, port_envs=64)
    port, missing, mjx, rust = report["ports"]
    assert port["sps"] > 1000 and port["num_envs"] == 64 and jax.default_backend() in port["device"].lower()
    assert "no jax translation of Hopper-v5" in missing["error"]
    assert "the JAX port of Hopper-v5 did not run here" in "\n".join(report["problems"])
    assert mjx["sps"] > 0 and mjx["num_envs"] == 64, mjx
    if shutil.which("rustc"):
        assert rust["sps"] > 1000 and rust["num_envs"] == modal_doctor.RUST_NUM_ENVS and rust["device"] == "cpu", rust
    else:
        assert "the Rust port of CartPole-v1 did not run here" in "\n".join(report["problems"])
    assert report["jax_host"]["trained"] and report["jax_host"]["path"] == "jax-host"
    assert report["verify"]["passed"], report["verify"]
    assert report["jax_e2e"]["trained"] and report["jax_e2e"]["path"] == "jax-e2e"
    assert jax.default_backend() in report["jax_e2e"]["device"].lower()
    text = modal_doctor.format_report(report)
    assert "path jax-host" in text and "path jax-e2e" in text
    assert re.search(r"port: +CartPole-v1's JAX port, 64 envs on \S+: \d+ env steps/s \(compile [\d.]+ s\)", text), text
    assert "HalfCheetah-v5's mjx backend, 64 envs" in text
    assert report["jax_host"]["device"] == jax.default_backend()
    if jax.default_backend() != "gpu":
        assert any("JAX" in line and "not a GPU" in line for line in report["problems"])
        assert "the jax-host path trained on cpu, not the GPU" in report["problems"] and "PROBLEM: " in text


# ---------------------------------------------------------------- train_experiment / evaluate_policy
def test_train_experiment_local_returns_a_policy_the_harness_scores(autorl_repo, monkeypatch, one_eval_worker):
    train_py = tiny_train_py(BIAS=0.0) + (
        "print(f\"saw_secret: {int('AUTORL_TEST_API_KEY' in os.environ)}\")\n"
        "print(f\"budget_env: {os.environ['AUTORL_TIME_BUDGET']}\")\n"
        "print(f\"extra: {os.environ.get('AUTORL_EXTRA', 'none')}\")\n")
    repo = autorl_repo(train_py=train_py)
    monkeypatch.setenv("AUTORL_TEST_API_KEY", "sk-not-for-candidates")
    run = modal_functions.train_experiment.local(archive=archive_of(repo), env_id="CartPole-v1", budget=10, seed=1,
                                                 extra_env={"AUTORL_EXTRA": "yes"})
    assert run["returncode"] == 0 and not run["timed_out"], run["log"]
    assert run["policy_name"] == "policy.pt" and run["policy"]
    assert run["metrics"] == {"env_steps": 1000, "sps": 500, "saw_secret": 0, "budget_env": 10, "extra": "yes"}
    assert run["wall_s"] > 0

    result = modal_functions.evaluate_policy.local(HARNESS, HARNESS_SHA, run["policy"], "CartPole-v1", 123, 4,
                                                   run["policy_name"])
    assert result["mean"] == 500.0 and result["episodes"] == 4 and len(result["returns"]) == 4
    assert {"std", "se", "iqm", "min", "max"} <= set(result)

    with pytest.raises(modal_experiment.HarnessRefused):
        modal_functions.evaluate_policy.local(HARNESS + b"\n# tampered\n", HARNESS_SHA, run["policy"],
                                              "CartPole-v1", 123, 4)
    with pytest.raises(modal_experiment.HarnessFailed, match="CartPole-v1|policy|artifact|load"):
        modal_experiment.score_policy(HARNESS, HARNESS_SHA, b"not a policy", "CartPole-v1", 123, 4, workers=1)


def test_one_experiment_trains_head_and_scores_it_with_the_checkouts_harness(autorl_repo, one_eval_worker):
    """What `modal run modal_app.py` does, with the functions run by .local() instead of .remote()."""
    repo = autorl_repo(train_py=tiny_train_py(BIAS=0.5))
    local = modal_functions.ModalFunctions(SimpleNamespace(remote=modal_functions.train_experiment.local),
                                           SimpleNamespace(remote=modal_functions.evaluate_policy.local),
                                           SimpleNamespace(remote=modal_functions.check_backend.local))
    outcome = modal_experiment.one_experiment(local, repo, "CartPole-v1", 5, 1, 3)
    assert outcome["train"]["metrics"]["env_steps"] == 1000
    assert 100 < outcome["score"]["mean"] < 500 and outcome["score"]["seed"] == outcome["eval_seed"]


def test_train_experiment_is_killed_at_budget_plus_grace(autorl_repo):
    repo = autorl_repo(train_py=tiny_train_py(SLEEP=120.0))
    run = modal_functions.train_experiment.local(archive_of(repo), "CartPole-v1", 1, 1, grace=1)
    assert run["timed_out"] and run["policy"] is None and run["policy_name"] is None
    assert run["wall_s"] < 30 and run["artifact_s"] is None   # killed before it delivered anything


RECORD_FUNCTION_OPTIONS = """
import json, modal
options = {}
real = modal.App.function
def recording(self, *args, **kwargs):
    decorate = real(self, *args, **kwargs)
    def wrap(f):
        options[f.__name__] = {k: v for k, v in kwargs.items() if isinstance(v, (bool, int, float, str))}
        return decorate(f)
    return wrap
modal.App.function = recording
real_with_options = modal.Function.with_options
def with_options_recording(self, **kwargs):
    options.setdefault("with_options", []).append({k: v for k, v in kwargs.items() if isinstance(v, (str, float))})
    return real_with_options(self, **kwargs)
modal.Function.with_options = with_options_recording
import orchestrator.runners.modal.functions as functions
functions.configured(gpu="a100", cpu=4)
print(json.dumps(options))
"""


def test_candidate_code_and_policies_run_in_single_use_containers_without_network(tmp_path):
    """What the real modal.App.function is given for each function that runs a candidate's code or policy:
    a container of its own per call (nothing a run leaves reaches a confirmation), no network, no Modal API."""
    proc = subprocess.run([PYTHON, "-c", RECORD_FUNCTION_OPTIONS], cwd=AUTORL_ROOT, env=offline_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    options = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    for name in ("train_experiment", "check_backend", "evaluate_policy", "gpu_doctor"):
        assert options[name].get("single_use_containers") is True, (name, options[name])
        assert options[name].get("block_network") is True and options[name].get("restrict_modal_access") is True
    assert not options["night_daemon"].get("single_use_containers")  # the daemon itself: one long call


def test_containers_get_exactly_the_gpu_type_a_night_names(tmp_path):
    """Modal runs an "H100" request on an H200 where it can, and "A100" on an A100-80GB; verdicts are
    keyed by the GPU, so a mixed pool made training calls stale one by one. The request pins the type."""
    proc = subprocess.run([PYTHON, "-c", RECORD_FUNCTION_OPTIONS], cwd=AUTORL_ROOT, env=offline_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    options = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    for name in ("train_experiment", "check_backend", "gpu_doctor"):
        assert options[name]["gpu"] == "H100!", options[name]   # AUTORL_MODAL_GPU's default, H100
    assert [o["gpu"] for o in options["with_options"]] == ["A100-40GB", "A100-40GB"]   # --modal-gpu a100
    assert [modal_functions.exact_gpu(g) for g in ("H100", "h100:2", "H200", "B200", "A100-80GB", "L40S")] == [
        "H100!", "H100!:2", "H200", "B200", "A100-80GB", "L40S"]


def test_a_reused_container_is_cleaned_before_a_confirmation_trains(autorl_repo, tmp_path, monkeypatch):
    """Should Modal serve a second call in a container, what the first run left in /tmp (weights to warm-start
    from, a compile cache) is gone before the second trains, and the reply names it; the container's own
    files are left alone. Outside a container nothing is touched."""
    tmp = tmp_path / "container-tmp"
    (tmp / "modal-runtime").mkdir(parents=True)   # there before any call: the container's own
    monkeypatch.setattr(modal_experiment.tempfile, "tempdir", str(tmp))
    monkeypatch.delenv(modal_experiment.CONTAINER_ENV, raising=False)
    (tmp / "not-in-a-container.txt").write_text("left alone")
    assert modal_experiment.fresh_scratch() == [] and (tmp / "not-in-a-container.txt").exists()
    (tmp / "not-in-a-container.txt").unlink()

    monkeypatch.setenv(modal_experiment.CONTAINER_ENV, "ta-test")
    leaves_weights = tiny_train_py(BIAS=0.0) + (
        "import tempfile as _t\n"
        "_seen = sorted(p.name for p in Path(_t.gettempdir()).iterdir() if p.name.startswith('warm'))\n"
        "print(f\"warm_files: {len(_seen)}\")\n"
        "(Path(_t.gettempdir()) / 'warm-weights.pt').write_bytes(b'weights of an earlier run')\n"
        "(Path(_t.gettempdir()) / 'warm-cache').mkdir(exist_ok=True)\n")
    archive = archive_of(autorl_repo(train_py=leaves_weights))
    env = {"TMPDIR": str(tmp)}
    first = modal_experiment.train_archive(archive, "CartPole-v1", 10, 1, extra_env=env)
    assert first["returncode"] == 0, first["log"]
    assert first["metrics"]["warm_files"] == 0 and first["left_by_earlier_call"] == []
    assert (tmp / "warm-weights.pt").exists()
    second = modal_experiment.train_archive(archive, "CartPole-v1", 10, 2, extra_env=env)
    assert second["returncode"] == 0, second["log"]
    assert second["metrics"]["warm_files"] == 0, "the confirmation found its first run's files"
    assert second["left_by_earlier_call"] == ["warm-cache", "warm-weights.pt"]
    assert (tmp / "modal-runtime").is_dir()


def test_train_experiment_local_with_the_real_train_py(autorl_repo, one_eval_worker):
    run = modal_functions.train_experiment.local(archive=archive_of(autorl_repo()), env_id="CartPole-v1",
                                                 budget=10, seed=1)
    assert run["returncode"] == 0, run["log"][-3000:]
    assert run["metrics"]["env_steps"] > 0
    assert 0 < run["artifact_s"] <= run["wall_s"]   # timed by the container's clock, from train.py's start
    assert run["policy"] and run["policy_name"] in ("policy.pt", "policy.pt2")
    result = modal_functions.evaluate_policy.local(HARNESS, HARNESS_SHA, run["policy"], "CartPole-v1", 7, 3,
                                                   run["policy_name"])
    assert math.isfinite(result["mean"]) and result["min"] >= 1


# ---------------------------------------------------------------- the volume: sync there, pull back
def make_run(repo: Path, tag: str) -> git.Repo:
    """A run's traces as the daemon leaves them: branch, a discarded experiment's ref, run folder."""
    r = git.Repo(repo)
    r.git.checkout("-b", f"autorl/{tag}")
    (repo / "candidate" / "train.py").write_text("# kept\n")
    r.git.commit("-am", "exp 1: kept")
    r.git.checkout("-b", "scratch")
    (repo / "candidate" / "train.py").write_text("# discarded\n")
    r.git.commit("-am", "exp 2: discarded")
    r.git.update_ref(f"refs/autorl/{tag}/exp-0002", "HEAD")
    r.git.checkout("main")
    run = repo / "results" / tag
    (run / "exp-0001").mkdir(parents=True)
    (run / "results.tsv").write_text("exp\tstatus\n1\tkeep\n")
    (run / "exp-0001" / "train.log").write_text("---\nenv_steps: 1000\n")
    (run / "daemon.lock").write_text("123\n")
    return r


def test_sync_run_then_pull_recreates_the_run_elsewhere(autorl_repo, tmp_path):
    source = autorl_repo(name="cloud")
    cloud = make_run(source, "t1")
    volume = FakeVolume(tmp_path / "storage")
    mount = volume.mount(tmp_path / "volume")  # the night container's view of the volume
    volume_dir = mount.path
    copied = modal_night.sync_run(source, "t1", volume_dir)
    mount.commit()
    assert sorted(copied) == [BUNDLE_NAME, "exp-0001/train.log", "results.tsv"]
    assert not (volume_dir / "t1" / "daemon.lock").exists()
    assert modal_night.sync_run(source, "t1", volume_dir) == [BUNDLE_NAME]  # unchanged files are not copied again

    home = autorl_repo(name="home")
    results = pull("t1", home, volume=volume)
    assert results == home / "results" / "t1"
    assert (results / "results.tsv").read_text() == "exp\tstatus\n1\tkeep\n"
    assert (results / "exp-0001" / "train.log").read_text() == "---\nenv_steps: 1000\n"
    assert not (results / BUNDLE_NAME).exists()
    mine = git.Repo(home)
    assert mine.git.rev_parse("autorl/t1") == cloud.git.rev_parse("autorl/t1")
    assert mine.git.rev_parse("refs/autorl/t1/exp-0002") == cloud.git.rev_parse("refs/autorl/t1/exp-0002")

    # Another experiment later: only what changed is read again, and the branch moves on.
    with open(source / "results" / "t1" / "results.tsv", "a") as f:
        f.write("2\tdiscard\n")
    cloud.git.checkout("autorl/t1")
    (source / "candidate" / "train.py").write_text("# kept again\n")
    cloud.git.commit("-am", "exp 3: kept")
    cloud.git.checkout("main")
    modal_night.sync_run(source, "t1", volume_dir)
    mount.commit()
    volume.reads.clear()
    pull("t1", home, volume=volume)
    assert sorted(volume.reads) == ["t1/branch.bundle", "t1/results.tsv"]
    assert (results / "results.tsv").read_text().endswith("2\tdiscard\n")
    assert mine.git.rev_parse("autorl/t1") == cloud.git.rev_parse("autorl/t1")

    with pytest.raises(PullError, match="no run 'nope'"):
        pull("nope", home, volume=volume)


def test_run_sync_copies_whenever_results_tsv_changes(autorl_repo, tmp_path):
    repo = autorl_repo()
    make_run(repo, "t2")
    commits = []
    sync = modal_night.RunSync(repo, "t2", tmp_path / "volume", lambda: commits.append(time.monotonic()),
                               poll_s=0.05).start()
    deadline = time.monotonic() + 10
    while not commits and time.monotonic() < deadline:
        time.sleep(0.05)
    assert commits and (tmp_path / "volume" / "t2" / "results.tsv").exists()
    with open(repo / "results" / "t2" / "results.tsv", "a") as f:
        f.write("2\tdiscard\n")
    while len(commits) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(commits) >= 2
    assert (tmp_path / "volume" / "t2" / "results.tsv").read_text().endswith("2\tdiscard\n")
    sync.stop()
    assert len(commits) >= 3  # the final copy
    assert write_branch_bundle(repo, "no-such-run", tmp_path / "x.bundle") is False


def test_clone_bundle_and_restore_run_resume_a_night(autorl_repo, tmp_path):
    repo = autorl_repo()
    r = make_run(repo, "t3")
    modal_night.sync_run(repo, "t3", tmp_path / "volume")
    bundle = tmp_path / "checkout.bundle"
    r.git.bundle("create", str(bundle), "HEAD", "--branches")
    clone = modal_night.clone_bundle(bundle.read_bytes(), tmp_path / "night" / "autorl")
    cloned = git.Repo(clone)
    assert cloned.active_branch.name == "main" and cloned.head.commit.hexsha == r.head.commit.hexsha
    assert cloned.git.rev_parse("autorl/t3") == r.git.rev_parse("autorl/t3")
    assert not cloned.remotes
    assert modal_night.restore_run(tmp_path / "volume" / "t3", clone, "t3")
    assert (clone / "results" / "t3" / "results.tsv").read_text() == "exp\tstatus\n1\tkeep\n"
    assert cloned.git.rev_parse("refs/autorl/t3/exp-0002") == r.git.rev_parse("refs/autorl/t3/exp-0002")
    assert not modal_night.restore_run(tmp_path / "volume" / "other", clone, "other")


@pytest.mark.skipif(not sandbox_probe()[0], reason=f"a night runs with --sandbox require: {sandbox_probe()[1]}")
def test_run_night_saves_the_run_to_the_volume_folder(autorl_repo, tmp_path, monkeypatch):
    """A short night of the real daemon (local runner here, so no Modal): the volume folder ends with
    the run folder, the branch bundle and the night's log; the same tag again is refused."""
    repo = autorl_repo(train_py=tiny_train_py(BIAS=0.0) + "print(f\"eval_cpu: {os.environ['AUTORL_MODAL_EVAL_CPU']}\")\n")
    bundle = tmp_path / "checkout.bundle"
    git.Repo(repo).git.bundle("create", str(bundle), "HEAD", "--branches")
    monkeypatch.setenv("PYTHONPATH", str(AUTORL_ROOT))  # the daemon's package (the temp checkout has none)
    monkeypatch.delenv("AUTORL_MODAL_EVAL_CPU", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    commits = []
    # Setup verification is tested elsewhere (here it costs a minute); grace 10: a tiny train.py still
    # imports torch, which a loaded machine must not turn into a kill.
    args = ("--runner local --max-experiments 0 --budget 2 --eval-episodes 3 --eval-workers 1 --grace 10 "
            "--backoff 0.2 --no-setup-verify")
    volume_dir = tmp_path / "volume"
    # the container sizes of the machine the night was started from reach the night's daemon (which
    # calls and bills with them); anything else in the settings does not
    started_from = {"AUTORL_MODAL_EVAL_CPU": "3", "AUTORL_MODAL_GPU": "A100", "PATH": "/nowhere", "HOME": "/x"}
    rc = modal_night.run_night(bundle.read_bytes(), "CartPole-v1", "n1", args, volume_dir,
                               commit=lambda: commits.append(1), workdir=tmp_path / "night", poll_s=0.2,
                               settings=container_settings(started_from) | {"PATH": "/nowhere"})
    assert rc == 0, (volume_dir / "n1" / "night.log").read_text()[-3000:]
    saved = volume_dir / "n1"
    assert container_settings(started_from) == {"AUTORL_MODAL_EVAL_CPU": "3", "AUTORL_MODAL_GPU": "A100"}
    assert "eval_cpu: 3" in (saved / "exp-0000" / "train.log").read_text()
    assert "baseline" in (saved / "results.tsv").read_text()
    assert (saved / BUNDLE_NAME).is_file() and (saved / "night.log").read_text()
    assert not (saved / "daemon.lock").exists()
    assert len(commits) >= 2  # after the baseline rows, and at the end
    heads = git.Repo(repo).git.bundle("list-heads", str(saved / BUNDLE_NAME))
    assert "refs/heads/autorl/n1" in heads

    rc = modal_night.run_night(bundle.read_bytes(), "CartPole-v1", "n1", "--runner local", volume_dir,
                               workdir=tmp_path / "night2")
    assert rc == 2  # not without --resume


def test_daemon_command():
    cmd = modal_night.daemon_command("Pendulum-v1", "p1", "--until 07:00 --agent optuna")
    assert cmd[1:] == ["-m", "orchestrator", "run", "--env", "Pendulum-v1", "--tag", "p1", "--runner", "modal",
                       "--until", "07:00", "--agent", "optuna", "--sandbox", "require"]
    assert modal_night.daemon_command("Pendulum-v1", "p1", "--runner local")[-4:-2] == ["--runner", "local"]
    assert modal_night.daemon_command("Pendulum-v1", "p1", "--sandbox=require").count("--sandbox") == 0
    with pytest.raises(ValueError, match="--tag"):
        modal_night.daemon_command("Pendulum-v1", "p1", "--tag other")
    for walls_off in ("--sandbox off", "--sandbox=auto", "--agent optuna --sandbox auto"):
        with pytest.raises(ValueError, match="--sandbox require"):
            modal_night.daemon_command("Pendulum-v1", "p1", walls_off)


def test_the_output_of_a_nights_start_is_kept_and_still_shown(tmp_path):
    """What Modal's output manager writes while the image builds (to the process's own stdout and
    stderr, or from a subprocess) reaches the terminal and results/<tag>/modal-build.log."""
    log = tmp_path / "results" / "n1" / modal_night.BUILD_LOG_NAME
    script = (f"import os, subprocess, sys\n"
              f"from orchestrator.runners.modal.night import output_saved_to\n"
              f"with output_saved_to({str(log)!r}):\n"
              f"    print('Building image im-1')\n"
              f"    sys.stderr.write('=> Step 3: pip install torch\\n')\n"
              f"    os.write(1, b'raw fd write\\n')\n"
              f"    subprocess.run(['echo', 'from a child'])\n"
              f"print('after the build')\n")
    proc = subprocess.run([PYTHON, "-c", script], cwd=AUTORL_ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    kept = log.read_text()
    for line in ("Building image im-1", "=> Step 3: pip install torch", "raw fd write", "from a child"):
        assert line in kept and line in proc.stdout
    assert "after the build" in proc.stdout and "after the build" not in kept


def test_the_night_image_carries_bubblewrap():
    assert "bubblewrap" in modal_functions.APT_PACKAGES


def test_the_image_installs_the_rust_toolchain_the_ports_are_tested_with():
    """The containers build the Rust ports with the rustc they are tested with here."""
    import shutil
    import subprocess

    if not shutil.which("rustc"):
        pytest.skip("no rustc on this machine: the pin cannot be compared with a tested toolchain")
    version = subprocess.run(["rustc", "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
    assert version == modal_functions.RUST_TOOLCHAIN, f"rustc {version} here; the image pins {modal_functions.RUST_TOOLCHAIN}"
    assert modal_functions.RUST_HOME["CARGO_HOME"] + "/bin" in modal_functions.RUST_HOME["PATH"].split(":")


def test_a_night_where_bubblewrap_cannot_sandbox_runs_no_candidate_code(autorl_repo, tmp_path, monkeypatch):
    """The night container's daemon with no working bwrap (here: none on PATH) stops before its
    first experiment, saying why in one line, and leaves no result behind."""
    repo = autorl_repo(train_py=tiny_train_py(BIAS=0.0))
    bundle = tmp_path / "checkout.bundle"
    git.Repo(repo).git.bundle("create", str(bundle), "HEAD", "--branches")
    bin_dir = tmp_path / "bin"  # git only: GitPython needs it, the daemon's python is sys.executable
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(shutil.which("git"))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("PYTHONPATH", str(AUTORL_ROOT))
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    volume_dir = tmp_path / "volume"
    rc = modal_night.run_night(bundle.read_bytes(), "CartPole-v1", "n2", "--runner local --max-experiments 0 "
                               "--budget 2 --no-setup-verify", volume_dir, workdir=tmp_path / "night", poll_s=0.2)
    log = (volume_dir / "n2" / "night.log").read_text()
    assert rc != 0, log
    assert "--sandbox require: bwrap not found" in log, log
    assert not (volume_dir / "n2" / "results.tsv").exists()
    assert not list((tmp_path / "night" / "autorl").glob("results/n2/exp-*"))


# ---------------------------------------------------------------- credentials
def test_missing_credentials_name_modal_token_new(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("MODAL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    problem = modal_credentials_problem()
    assert problem and "modal token new" in problem and "\n" not in problem
    assert "modal token new" in (check_modal_reachable(5) or "")
    with pytest.raises(PullError, match="modal token new"):
        pull("t1", tmp_path)

    assert modal_credentials_problem({"HOME": str(tmp_path), "MODAL_TOKEN_ID": "ak-1",
                                      "MODAL_TOKEN_SECRET": "as-1"}) is None
    (tmp_path / ".modal.toml").write_text('[me]\ntoken_id = "ak-1"\ntoken_secret = "as-1"\nactive = true\n')
    assert modal_credentials_problem({"HOME": str(tmp_path)}) is None
    assert "modal token new" in modal_credentials_problem({"HOME": str(tmp_path), "MODAL_PROFILE": "other"})


def test_unreachable_modal_is_one_line_within_the_timeout(tmp_path):
    env = offline_env(tmp_path) | {"MODAL_TOKEN_ID": "ak-test", "MODAL_TOKEN_SECRET": "as-test",
                                   "MODAL_SERVER_URL": "http://127.0.0.1:9"}
    code = "from orchestrator.runners.modal.support import check_modal_reachable as c; print(c(2))"
    started = time.monotonic()
    proc = subprocess.run([PYTHON, "-c", code], cwd=AUTORL_ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert "modal token new" in line and "\n" not in line
    assert time.monotonic() - started < 30
