"""A cached verdict or figure applies only where everything that decided it is unchanged, and only the
daemon writes the user-level cache that runs share."""
from __future__ import annotations

import json
import shutil


from envs_fast import cache
from orchestrator.usercache import SIGNATURE, UserCache

ENV = "CartPole-v1"


def test_the_decisive_sources_are_every_module_of_envs_fast_but_the_translations():
    names = {p.relative_to(cache.PACKAGE_DIR).as_posix() for p in cache.decisive_sources()}
    # what the review found left out: the report, XLA's options, the gate, the cache, the bench and throughput code
    assert {"verify/report.py", "compiling.py", "gate.py", "cache.py", "bench/__init__.py", "bench/throughput.py", "__init__.py",
            "verify/interactions.py"} <= names
    assert not {name for name in names if name.startswith("translations/")}
    assert "translations/cartpole_v1.py" not in names and "translations/acrobot_v1_sync.py" not in names


def test_changing_any_input_of_a_verdict_asks_for_a_fresh_verification(private_cache, tmp_path, monkeypatch):
    translation = tmp_path / "cartpole_v1.py"
    shutil.copyfile(cache.PACKAGE_DIR / "translations" / "cartpole_v1.py", translation)
    cache.store_verdict(str(translation), ENV, [1, 2, 3], True, "passed")
    assert cache.cached_verdict(str(translation), ENV)["passed"]

    def fresh_after(change) -> None:
        with monkeypatch.context() as m:
            change(m)
            assert cache.cached_verdict(str(translation), ENV) is None
        assert cache.cached_verdict(str(translation), ENV) is not None   # and back as it was

    versions = cache.package_versions()
    fresh_after(lambda m: m.setattr(cache, "package_versions", lambda: {**versions, "jaxlib": "99.0"}))
    fresh_after(lambda m: m.setattr(cache, "package_versions", lambda: {**versions, "jax-cuda12-plugin": "0.10.2"}))
    fresh_after(lambda m: m.setattr(cache, "interpreter", lambda: "CPython 3.13.0"))
    fresh_after(lambda m: m.setattr(cache, "backend_identity", lambda spec, env, environment=None: "file:another"))
    # a JAX translation's verdict holds for the accelerator it was reached on only
    here = cache.machine()
    fresh_after(lambda m: m.setattr(cache, "machine", lambda: {**here, "gpus": "NVIDIA H100 80GB HBM3"}))
    # a module that decides verdicts (the report, the gate, ...) edited: its own copy of envs_fast. The
    # record lists the modules its writer had imported: these four are, here
    import envs_fast.gate, envs_fast.verify.report, envs_fast.bench.throughput, envs_fast.verify.interactions  # noqa: E401, F401

    cache.store_verdict(str(translation), ENV, [1, 2, 3], True, "passed")
    package = tmp_path / "envs_fast"
    shutil.copytree(cache.PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    with monkeypatch.context() as m:
        m.setattr(cache, "PACKAGE_DIR", package)
        assert cache.cached_verdict(str(translation), ENV) is not None   # the same sources: it holds
        for module in ("verify/report.py", "gate.py", "bench/throughput.py", "verify/interactions.py"):
            original = (package / module).read_text()
            (package / module).write_text(original + "\n# changed\n")
            assert cache.cached_verdict(str(translation), ENV) is None, module
            (package / module).write_text(original)
    # a translation is not in the key of another backend's record: editing one leaves the others' records
    with monkeypatch.context() as m:
        m.setattr(cache, "PACKAGE_DIR", package)
        (package / "translations" / "pendulum_v1.py").write_text(
            (package / "translations" / "pendulum_v1.py").read_text() + "\n# changed\n")
        assert cache.cached_verdict(str(translation), ENV) is not None


def test_a_record_without_its_sources_does_not_hold(private_cache, tmp_path):
    """A record written before records listed their modules (or one a process forged bare) checks
    nothing, so it applies to nothing."""
    cache.store_verdict("reference", ENV, [1, 2, 3], True, "passed")
    path = next(private_cache.glob("verdict-*.json"))
    record = json.loads(path.read_text())
    assert record["sources"] and cache.cached_verdict("reference", ENV) is not None
    path.write_text(json.dumps({**record, "sources": {}}))
    assert cache.cached_verdict("reference", ENV) is None
    del record["sources"]
    path.write_text(json.dumps(record))
    assert cache.cached_verdict("reference", ENV) is None


def test_a_verdict_depends_on_what_its_verification_imported_and_nothing_else(tmp_path):
    """The real verifier on the Rust CartPole port, in a process of its own over a copy of envs_fast:
    its verdict lists the verifier and the Rust loader and survives an edit to the MJX engine or the
    MuJoCo batch backend, which its verification never imports; an edit to the verifier's L2 or to the
    Rust loader asks for a fresh verification."""
    import subprocess
    import sys

    root = tmp_path / "checkout"
    shutil.copytree(cache.PACKAGE_DIR, root / "envs_fast", ignore=shutil.ignore_patterns("__pycache__"))
    records = tmp_path / "verify-cache"
    spec = str(root / "envs_fast" / "translations" / "cartpole_v1.rs")
    proc = subprocess.run([sys.executable, "-m", "envs_fast.verify", "--env", ENV, "--backend", spec,
                           "--episodes", "50", "--horizon", "100"], cwd=root, capture_output=True, text=True,
                          env={**__import__("os").environ, "PYTHONPATH": str(root), cache.CACHE_ENV_VAR: str(records)},
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (written,) = [json.loads(p.read_text()) for p in records.glob("verdict-*.json")]
    assert written["passed"] and {"verify/interactions.py", "rust/backend.py", "cache.py"} <= set(written["sources"])
    assert not {"mujoco/mjx_c_engine.py", "mujoco/c_solver.py", "mujoco/mjx.py", "mujoco/batch.py",
                "mujoco/locomotion.py", "backends/envpool_backend.py"} & set(written["sources"])

    def found() -> bool:
        environment = cache.environment(root / "envs_fast")
        with cache.reading_from(records):
            return cache.cached_verdict(spec, ENV, environment) is not None

    assert found()
    for module, holds in (("mujoco/mjx_c_engine.py", True), ("mujoco/batch.py", True), ("verify/interactions.py", False),
                          ("rust/backend.py", False)):
        original = (root / "envs_fast" / module).read_text()
        (root / "envs_fast" / module).write_text(original + "\n# changed\n")
        assert found() is holds, module
        (root / "envs_fast" / module).write_text(original)


def test_a_translations_verdict_depends_on_its_sync_companion(private_cache, tmp_path):
    """The BipedalWalker JAX port imports its Rust twin's `_sync.py` (state layout, terrain): editing
    that companion asks for a fresh verdict of either translation."""
    for name in ("bipedalwalker_v3.py", "bipedalwalker_v3.rs"):
        folder = tmp_path / name.replace(".", "-")
        folder.mkdir()
        translation = folder / name
        shutil.copyfile(cache.PACKAGE_DIR / "translations" / name, translation)
        shutil.copyfile(cache.PACKAGE_DIR / "translations" / "bipedalwalker_v3_sync.py", folder / "bipedalwalker_v3_sync.py")
        cache.store_verdict(str(translation), "BipedalWalker-v3", [1, 2, 3], True, "passed")
        assert cache.cached_verdict(str(translation), "BipedalWalker-v3") is not None
        with (folder / "bipedalwalker_v3_sync.py").open("a") as companion:
            companion.write("\n# changed\n")
        assert cache.cached_verdict(str(translation), "BipedalWalker-v3") is None, name


def test_a_rust_verdict_depends_on_the_compiler(private_cache, monkeypatch):
    from envs_fast.rust import toolchain as rust_toolchain

    rust = cache.PACKAGE_DIR / "translations" / "cartpole_v1.rs"
    monkeypatch.setattr(rust_toolchain, "rustc_available", lambda: True)
    monkeypatch.setattr(rust_toolchain, "rustc_version", lambda: "rustc 1.80.0")
    cache.store_verdict(str(rust), ENV, [1, 2, 3], True, "passed")
    assert cache.cached_verdict(str(rust), ENV) is not None
    monkeypatch.setattr(rust_toolchain, "rustc_version", lambda: "rustc 1.91.0")
    assert cache.cached_verdict(str(rust), ENV) is None
    # it steps on the CPU whatever accelerator the machine has: a GPU does not make it another verdict
    monkeypatch.setattr(rust_toolchain, "rustc_version", lambda: "rustc 1.80.0")
    here = cache.machine()
    monkeypatch.setattr(cache, "machine", lambda: {**here, "gpus": "NVIDIA H100 80GB HBM3"})
    assert cache.cached_verdict(str(rust), ENV) is not None


def test_records_are_named_as_the_process_that_will_read_them_names_them(private_cache):
    """The daemon of a Modal run names its records by its containers' environment: the same name a
    container gives them, whatever this machine runs."""
    here = cache.environment()
    container = {**here, "versions": {**here["versions"], "jaxlib": "0.10.2+cuda13"},
                 "machine": {**here["machine"], "gpus": "NVIDIA H100 80GB HBM3"}}
    spec = str(cache.PACKAGE_DIR / "translations" / "cartpole_v1.py")
    assert cache.record_name("verdict", spec, ENV, here) == cache.record_name("verdict", spec, ENV)
    assert cache.record_name("verdict", spec, ENV, container) != cache.record_name("verdict", spec, ENV)
    cache.store_verdict(spec, ENV, [1, 2, 3], True, "passed")
    assert cache.cached_verdict(spec, ENV, container) is None and cache.cached_verdict(spec, ENV, here) is not None


def test_a_throughput_figure_belongs_to_the_machine_it_was_measured_on(private_cache, monkeypatch):
    cache.store_throughput("reference", ENV, 8, 12345.0)
    assert cache.cached_throughput("reference", ENV, 8) == 12345.0
    here = cache.machine()
    monkeypatch.setattr(cache, "machine", lambda: {**here, "gpus": "NVIDIA H100 80GB HBM3"})
    assert cache.cached_throughput("reference", ENV, 8) is None
    monkeypatch.setattr(cache, "machine", lambda: {**here, "cpu": "another CPU"})
    assert cache.cached_throughput("reference", ENV, 8) is None
    # a verdict does not depend on the machine
    cache.store_verdict("reference", ENV, [1], True, "ok")
    monkeypatch.setattr(cache, "machine", lambda: here)
    assert cache.cached_verdict("reference", ENV) is not None


def test_a_gpu_containers_figure_holds_on_any_host_of_that_gpu_type(private_cache, monkeypatch):
    """Modal runs containers of one GPU type on hosts of several CPU models (each reporting the host's
    CPU count): a figure measured in one must be found in the next, or train.py there chooses another
    backend than the run named. It still belongs to its GPU type."""
    here = cache.machine()
    h100 = {"cpu": "AMD EPYC 9454 48-Core Processor", "cpus": 96, "arch": "x86_64", "gpus": "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(cache, "machine", lambda: h100)
    cache.store_throughput("envpool", ENV, 64, 2.0e6)
    monkeypatch.setattr(cache, "machine", lambda: {**h100, "cpu": "Intel(R) Xeon(R) Platinum 8480+", "cpus": 224})
    assert cache.cached_throughput("envpool", ENV, 64) == 2.0e6
    monkeypatch.setattr(cache, "machine", lambda: {**h100, "gpus": "NVIDIA H200"})
    assert cache.cached_throughput("envpool", ENV, 64) is None
    monkeypatch.setattr(cache, "machine", lambda: {**here, "gpus": ""})   # a CPU machine: its CPU model still decides
    cache.store_throughput("envpool", ENV, 64, 1.0e5)
    monkeypatch.setattr(cache, "machine", lambda: {**here, "gpus": "", "cpu": "another CPU"})
    assert cache.cached_throughput("envpool", ENV, 64) is None


def test_only_what_the_daemon_signed_leaves_the_user_cache(tmp_path, caplog):
    user_root, run = tmp_path / "user" / "verify", tmp_path / "run-cache"
    run.mkdir()
    user = UserCache(user_root, run)
    (run / "verdict-a.json").write_text(json.dumps({"passed": True}))
    assert user.keep("verdict-a.json") and (user_root / ("verdict-a.json" + SIGNATURE)).is_file()
    assert oct(user.key_path.stat().st_mode & 0o777) == "0o600"
    (run / "verdict-a.json").unlink()
    assert user.lend("verdict-a.json") and json.loads((run / "verdict-a.json").read_text())["passed"]
    # train.py without a sandbox writes a passing verdict straight into the user cache: never lent
    (user_root / "verdict-forged.json").write_text(json.dumps({"passed": True}))
    assert not user.lend("verdict-forged.json") and not (run / "verdict-forged.json").exists()
    assert "no valid signature" in caplog.text
    # a signed record changed afterwards, or a signature copied from another record: not lent either
    (user_root / "verdict-a.json").write_text(json.dumps({"passed": True, "summary": "edited"}))
    assert not user.lend("verdict-a.json")
    shutil.copyfile(user_root / ("verdict-a.json" + SIGNATURE), user_root / ("verdict-forged.json" + SIGNATURE))
    assert not user.lend("verdict-forged.json")
    # figures: written signed by the daemon, read only when signed
    user.write("bench-b.figures.json", {"train_sps": 1000.0}, "bench/here")
    assert UserCache(user_root, run).read("bench-b.figures.json", "bench/here") == {"train_sps": 1000.0}
    (user_root / "bench" / "here" / "bench-b.figures.json").write_text(json.dumps({"train_sps": 1e9}))
    assert user.read("bench-b.figures.json", "bench/here") == {}
    # a Rust library: kept signed, lent; replaced behind the daemon's back, refused
    built = run / "rust" / "abc-123"
    built.mkdir(parents=True)
    (built / "libcartpole_v1.so").write_bytes(b"\x7fELF built by the daemon")
    assert user.keep_library("abc-123")
    shutil.rmtree(built)
    assert user.lend_library("abc-123") and (built / "libcartpole_v1.so").read_bytes().endswith(b"daemon")
    shutil.rmtree(built)
    (user_root / "rust" / "abc-123" / "libcartpole_v1.so").write_bytes(b"\x7fELF written by train.py")
    assert not user.lend_library("abc-123") and not built.exists()
