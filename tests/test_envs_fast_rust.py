"""The Rust backend kind (envs_fast/rust/: build.py, backend.py, vector.py): building and
its cache, the ABI checks, the two worked examples against gymnasium step by step, and the
VectorEnv adapter's semantics."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from envs_fast.rust import build as rust_build, toolchain as rust_toolchain
from envs_fast.protocol import BackendError, BuildError
from envs_fast.rust.backend import load_rust
from envs_fast.rust.build import build, rustc_available
from envs_fast.rust.vector import RustVectorEnv
from envs_fast.verify import main as verify_main

pytestmark = [pytest.mark.skipif(not rustc_available(), reason="rustc not found on PATH"),
              pytest.mark.usefixtures("module_private_cache")]

ENVS_FAST = Path(__file__).resolve().parent.parent / "envs_fast"
EXAMPLES = {"CartPole-v1": ENVS_FAST / "translations" / "cartpole_v1.rs",
            "Acrobot-v1": ENVS_FAST / "translations" / "acrobot_v1.rs"}
TOLERANCE = 1e-9


@pytest.fixture(scope="module")
def backends(module_private_cache):
    return {env_id: load_rust(path, env_id) for env_id, path in EXAMPLES.items()}


def copy_example(env_id: str, folder: Path, replace: tuple[str, str] | None = None, sync: bool = True) -> Path:
    """The example's source (optionally with one text replacement) and its sync companion in `folder`."""
    source = EXAMPLES[env_id]
    text = source.read_text()
    if replace:
        assert replace[0] in text
        text = text.replace(*replace)
    target = folder / source.name
    target.write_text(text)
    if sync:
        shutil.copy(source.with_name(source.stem + "_sync.py"), folder)
    return target


# ---------------------------------------------------------------- building and loading

def test_build_reuses_the_cached_library(backends, monkeypatch):
    library = build(EXAMPLES["CartPole-v1"])
    assert library.is_file() and library.name == "libcartpole_v1.so"
    assert library.parent.parent.parent == rust_build.cache_dir()
    built_at = library.stat().st_mtime_ns

    def no_compiler(*args, **kwargs):
        raise AssertionError(f"rustc was invoked again: {args}")

    monkeypatch.setattr(rust_build.subprocess, "run", no_compiler)
    assert build(EXAMPLES["CartPole-v1"]) == library
    assert library.stat().st_mtime_ns == built_at


FEATURES = ("sse4.1", "popcnt", "avx", "avx2", "fma", "bmi2")
PROBE = """#[no_mangle]
pub extern "C" fn probe_panic_abort() -> u8 { cfg!(panic = "abort") as u8 }
#[no_mangle]
pub extern "C" fn probe_debug_assertions() -> u8 { cfg!(debug_assertions) as u8 }
""" + "".join(f'''#[no_mangle]
pub extern "C" fn probe_{name.replace(".", "_")}() -> u8 {{ cfg!(target_feature = "{name}") as u8 }}
''' for name in FEATURES)


def test_the_build_flags_reach_rustc_and_the_library(tmp_path):
    """RUSTC_FLAGS compile the library: optimised (no debug assertions), panic=abort, and with exactly
    the CPU features target-cpu=native enables on this host (those `host_target` keys the cache by)."""
    import ctypes

    source = tmp_path / "flag_probe.rs"
    source.write_text(PROBE)
    library = ctypes.CDLL(str(build(source)))
    assert library.probe_panic_abort() == 1
    assert library.probe_debug_assertions() == 0
    native = subprocess.run([rust_build.rustc_path(), "-C", "target-cpu=native", "--print", "cfg"],
                            capture_output=True, text=True, check=True).stdout
    for name in FEATURES:  # baseline x86-64 (no target-cpu) has none of them
        enabled = f'target_feature="{name}"' in native
        assert getattr(library, f"probe_{name.replace('.', '_')}")() == enabled, name
    features = lambda cfg: sorted(line for line in cfg.splitlines() if line.startswith("target_feature="))  # noqa: E731
    assert features(rust_build.host_target()) == features(native)  # what the cache key holds


def test_the_cache_key_holds_the_flags_and_the_host_cpu(tmp_path, monkeypatch):
    """A library built with other flags, or on a CPU with other features (target-cpu=native), is
    never reused: both are part of its folder's name."""
    source = tmp_path / "flag_probe.rs"
    source.write_text(PROBE)
    here = rust_build.library_path(source)
    assert 'target_feature="' in rust_build.host_target()
    assert rust_build.library_path(source) == here
    with monkeypatch.context() as patch:  # the flags without target-cpu=native
        patch.setattr(rust_build, "RUSTC_FLAGS", tuple("target-cpu=x86-64" if f == "target-cpu=native" else f
                                                       for f in rust_build.RUSTC_FLAGS))
        assert rust_build.library_path(source).parent.name != here.parent.name
    with monkeypatch.context() as patch:  # a host with one more CPU feature
        other_cpu = rust_build.host_target() + '\ntarget_feature="avx512f"'
        patch.setattr(rust_build, "host_target", lambda: other_cpu)
        moved = rust_build.library_path(source)
    assert moved.parent.name != here.parent.name
    assert moved.parent.name.split("-")[0] == here.parent.name.split("-")[0]  # same source, another toolchain key


def test_compile_error_is_a_build_error_with_rustcs_message(tmp_path):
    broken = copy_example("CartPole-v1", tmp_path, ("let costheta = theta.cos();", "let costheta: u32 = theta.cos();"))
    with pytest.raises(BuildError) as caught:
        build(broken)
    message = str(caught.value)
    assert "error[E0308]" in message and str(broken) in message  # the error, located in the agent's file
    assert len(message.splitlines()) <= rust_build.ERROR_LINES + 2


def test_missing_rustc_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(rust_toolchain.shutil, "which", lambda name: None)
    assert not rustc_available()
    with pytest.raises(BackendError, match=r"^rustc not found on PATH: .*rustup\.rs\)$"):
        build(EXAMPLES["CartPole-v1"])


def test_env_id_mismatch_is_a_backend_error(backends):
    with pytest.raises(BackendError, match="ENV_ID is 'CartPole-v1', expected 'Acrobot-v1'"):
        load_rust(EXAMPLES["CartPole-v1"], "Acrobot-v1")


def test_without_its_sync_companion_a_translation_is_refused_as_protocol_incomplete(tmp_path):
    source = copy_example("CartPole-v1", tmp_path, sync=False)
    with pytest.raises(BackendError, match=r"protocol incomplete, missing its state-sync companion .*cartpole_v1_sync\.py"):
        load_rust(source, "CartPole-v1")
    (tmp_path / "cartpole_v1_sync.py").write_text("def state_from_reference(env):\n    return list(env.unwrapped.state)\n")
    with pytest.raises(BackendError, match=r"cartpole_v1_sync\.py: protocol incomplete, missing state_to_reference\(state, env\)"):
        load_rust(source, "CartPole-v1")


@pytest.mark.parametrize("env_id", list(EXAMPLES))
def test_protocol_declarations(backends, env_id):
    backend = backends[env_id]
    reference = gym.make(env_id)
    assert backend.name == str(EXAMPLES[env_id]) and backend.env_id == env_id and backend.syncs_state
    assert backend.protocol_problems(reference.observation_space, reference.action_space) == []
    other = gym.make("Acrobot-v1" if env_id == "CartPole-v1" else "CartPole-v1")
    assert any("autorl_obs_size" in p for p in backend.protocol_problems(other.observation_space, reference.action_space))

    obs, state = backend.reset(np.arange(5, dtype=np.uint32))
    assert obs.shape == (5,) + reference.observation_space.shape and obs.dtype == np.float32
    assert type(state)._fields == tuple(backend.state_fields) and all(v.shape == (5,) and v.dtype == np.float64 for v in state)
    actions = np.random.default_rng(0).integers(0, reference.action_space.n, (5, 4))
    flat, rewards, terminated = backend.rollout(np.arange(5, dtype=np.uint32), state, actions)
    for t in range(4):  # a rollout is consecutive steps (these envs draw no randomness in a step)
        obs, state, reward, term = backend.step(np.arange(5, dtype=np.uint32), state, actions[:, t])
        assert np.array_equal(flat[:, t], obs.astype(np.float64)) and np.array_equal(rewards[:, t], reward)
        assert np.array_equal(terminated[:, t], term)


# ---------------------------------------------------------------- faithful to the reference

def step_deviation(backend, env_id: str, steps: int = 2000, seed: int = 0) -> tuple[float, int]:
    """(largest |backend - reference| over observation, reward and next state, number of differing
    terminated flags) over `steps` random reference steps, each from a state synced both ways."""
    env = gym.make(env_id)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    starts, actions, outcomes = [], [], []
    for i in range(steps):
        backend.state_to_reference(backend.state_from_reference(env), env)
        starts.append(backend.state_from_reference(env))
        actions.append(int(rng.integers(env.action_space.n)))
        obs, reward, terminated, _, _ = env.unwrapped.step(actions[-1])
        outcomes.append((obs, reward, terminated, backend.state_from_reference(env)))
        if terminated or rng.random() < 0.01:
            env.reset(seed=seed + 1 + i)
    state = backend.State(*np.array(starts, dtype=np.float64).T)
    obs, next_state, reward, terminated = backend.step(np.arange(steps, dtype=np.uint32), state, np.array(actions))
    ref_obs, ref_reward, ref_terminated, ref_next = (np.array(column) for column in zip(*outcomes))
    deviation = max(np.abs(obs - ref_obs).max(), np.abs(reward - ref_reward).max(),
                    np.abs(np.stack(next_state, axis=1) - ref_next).max())
    return float(deviation), int(np.sum(terminated != ref_terminated))


@pytest.mark.parametrize("env_id", list(EXAMPLES))
def test_steps_match_gymnasium(backends, env_id):
    deviation, flag_mismatches = step_deviation(backends[env_id], env_id)
    assert deviation <= TOLERANCE and flag_mismatches == 0


def test_a_changed_constant_is_detected(backends, tmp_path):
    """The comparison above can fail: gravity 9.81 instead of 9.8 is far outside its tolerance."""
    mutated = copy_example("CartPole-v1", tmp_path, ("const GRAVITY: f64 = 9.8;", "const GRAVITY: f64 = 9.81;"))
    deviation, _ = step_deviation(load_rust(mutated, "CartPole-v1"), "CartPole-v1", steps=300)
    assert deviation > 1000 * TOLERANCE


def test_threaded_batches_equal_serial_ones(backends):
    backend, n, part = backends["CartPole-v1"], 65_536, 1000  # 65,536 envs run on threads, 1000 serially
    seeds = np.arange(n, dtype=np.uint32) + 7
    rng = np.random.default_rng(1)

    def arrays(out):  # outputs as plain arrays, a state NamedTuple as one (n, fields) array
        return [np.stack(x, axis=1) if isinstance(x, tuple) else np.asarray(x) for x in out]

    def part_of(x, index):
        return type(x)(*(v[index] for v in x)) if isinstance(x, tuple) else x[index]

    def in_parts(call, *batched):
        pieces = [arrays(call(*(part_of(x, slice(i, i + part)) for x in batched))) for i in range(0, n, part)]
        return [np.concatenate(column) for column in zip(*pieces)]

    obs, state = backend.reset(seeds)
    assert all(np.array_equal(a, b) for a, b in zip(arrays((obs, state)), in_parts(backend.reset, seeds)))
    for _ in range(3):
        actions = rng.integers(0, 2, n)
        whole = backend.step(seeds, state, actions)
        assert all(np.array_equal(a, b) for a, b in zip(arrays(whole), in_parts(backend.step, seeds, state, actions)))
        state = whole[1]


# ---------------------------------------------------------------- the VectorEnv adapter

def balance(obs):
    """A linear controller that keeps CartPole-v1 up for all 500 steps (tests/handmade_policies.py)."""
    x, x_dot, theta, theta_dot = obs.T
    return (0.1 * x + 0.5 * x_dot + 10.0 * theta + 2.0 * theta_dot > 0).astype(np.int64)


def test_adapter_spaces_and_types(backends):
    reference = gym.make("CartPole-v1")
    venv = RustVectorEnv(backends["CartPole-v1"], 6, seed=3)
    assert venv.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert venv.single_observation_space == reference.observation_space
    assert venv.action_space == batch_space(reference.action_space, 6)
    with pytest.raises(RuntimeError, match="reset"):
        venv.step(np.zeros(6, np.int64))
    obs, info = venv.reset(seed=11)
    assert info == {} and venv.observation_space.contains(obs)
    first = obs
    out = venv.step(np.ones(6, np.int64))
    assert out[0].dtype == np.float32 and out[1].dtype == np.float64 and out[2].dtype == out[3].dtype == bool
    kept = [x.copy() for x in out[:4]]
    venv.step(np.zeros(6, np.int64))
    assert all(np.array_equal(a, b) for a, b in zip(kept, out[:4]))  # returned arrays are never reused in place
    assert np.array_equal(first, venv.reset(seed=11)[0])
    with pytest.raises(ValueError, match="outside"):
        venv.step(np.full(6, 2))


def test_adapter_autoresets_on_the_next_step(backends):
    venv = RustVectorEnv(backends["CartPole-v1"], 4, seed=0)
    venv.reset(seed=0)
    ended, episodes = np.zeros(4, bool), 0
    for _ in range(60):  # always pushing right ends every episode within a few dozen steps
        obs, reward, terminated, truncated, _ = venv.step(np.ones(4, np.int64))
        assert not truncated.any()
        after = ended  # envs whose episode ended on the previous step
        assert np.all(reward[after] == 0.0) and not terminated[after].any()
        assert np.all(np.abs(obs[after]) <= 0.05)  # the reset observation
        assert np.all(reward[~after] == 1.0)
        ended = terminated
        episodes += int(terminated.sum())
    assert episodes >= 8


def test_adapter_truncates_cartpole_at_500(backends):
    venv = RustVectorEnv(backends["CartPole-v1"], 4, seed=2)
    obs, _ = venv.reset(seed=2)
    for step in range(1, 501):
        obs, reward, terminated, truncated, _ = venv.step(balance(obs))
        assert not terminated.any() and np.all(reward == 1.0)
        assert truncated.all() == (step == 500) and truncated.any() == (step == 500)
    obs, reward, terminated, truncated, _ = venv.step(balance(obs))  # the autoreset step
    assert np.all(reward == 0.0) and not terminated.any() and not truncated.any() and np.all(np.abs(obs) <= 0.05)
    obs, reward, terminated, truncated, _ = venv.step(balance(obs))  # a new episode, counted from 0
    assert np.all(reward == 1.0) and not truncated.any()


@pytest.mark.parametrize("env_id", list(EXAMPLES))
def test_adapter_reset_seed_repeats_trajectories(backends, env_id):
    actions = np.random.default_rng(0).integers(0, gym.make(env_id).action_space.n, (300, 8))

    def trajectory(venv, seed):
        rows = [venv.reset(seed=seed)[0].ravel()]
        for a in actions:
            rows.append(np.concatenate([np.ravel(x).astype(np.float64) for x in venv.step(a)[:4]]))
        return rows

    venv = RustVectorEnv(backends[env_id], 8)
    first, second = trajectory(venv, 5), trajectory(venv, 5)
    assert all(np.array_equal(a, b) for a, b in zip(first, second))
    other = trajectory(RustVectorEnv(backends[env_id], 8), 6)
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


# ---------------------------------------------------------------- verify and bench, as the user runs them

def _orchestrator(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ENVS_FAST.parent))
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("env_id", sorted(EXAMPLES))
def test_verify_passes_the_shipped_rust_translations_at_l1_to_l3(env_id):
    proc = _orchestrator("verify", "--env", env_id, "--backend", f"envs_fast/translations/{EXAMPLES[env_id].name}",
                         cwd=ENVS_FAST.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "L1 properties: PASS" in proc.stdout and "L2 interactions: PASS" in proc.stdout
    assert "L3 rollouts: PASS" in proc.stdout and "state sync round trip" in proc.stdout


@pytest.mark.parametrize("env_id, change, field", [
    ("CartPole-v1", ("const GRAVITY: f64 = 9.8;", "const GRAVITY: f64 = 9.81;"), "theta_dot"),    # a constant
    ("CartPole-v1", ("const X_THRESHOLD: f64 = 2.4;", "const X_THRESHOLD: f64 = 2.5;"), "terminated"),  # a boundary
    ("Acrobot-v1", ("const LINK_MASS_2: f64 = 1.0;", "const LINK_MASS_2: f64 = 1.1;"), "dtheta"),
    ("Acrobot-v1", ("const MAX_VEL_1: f64 = 4.0 * PI;", "const MAX_VEL_1: f64 = 3.0 * PI;"), "dtheta1"),
])
def test_verify_fails_a_changed_constant_or_boundary_naming_level_field_and_state(tmp_path, env_id, change, field):
    source = copy_example(env_id, tmp_path, replace=change)
    proc = _orchestrator("verify", "--env", env_id, "--backend", str(source), "--levels", "1,2",
                         cwd=ENVS_FAST.parent)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "L2 interactions: FAIL" in proc.stdout
    failure = proc.stdout.split("L2 interactions: FAIL", 1)[1]
    first = failure.split("first failure", 1)[1]
    assert "    state: ." in first and "differing fields" in first, failure[:3000]
    assert field in first.split("differing fields", 1)[1], failure[:3000]


def test_wrong_physics_without_state_sync_is_refused_and_with_it_fails_l2_at_an_exact_state(tmp_path, capsys):
    """TAU 0.021 for 0.02 passes a comparison of return distributions (TOST), so a translation
    without its sync companion must not be verified at all; with the companion, L2 catches it.
    (`python -m envs_fast.verify` is `verify.main`; run in this process to import jax once.)"""
    source = copy_example("CartPole-v1", tmp_path, ("const TAU: f64 = 0.02;", "const TAU: f64 = 0.021;"), sync=False)
    argv = ["--env", "CartPole-v1", "--backend", str(source)]
    assert verify_main(argv) == 2
    out, err = capsys.readouterr()
    message = err.strip()
    assert len(message.splitlines()) == 1 and "protocol incomplete" in message, message
    assert "cartpole_v1_sync.py" in message and "state_from_reference(env)" in message
    assert "state_to_reference(state, env)" in message and out == ""

    shutil.copy(EXAMPLES["CartPole-v1"].with_name("cartpole_v1_sync.py"), tmp_path)
    assert verify_main(argv + ["--levels", "2"]) == 1
    out, err = capsys.readouterr()
    assert "L2 interactions: FAIL" in out
    # a level's start and end reach stderr as they happen (a physics port's levels take an hour)
    assert re.search(r"^verify: L2 interactions: started\nverify: L2 interactions: fail in \d+ s "
                     r"\(\d+/\d+ checks; first failure: step from rollout states\)$", err, re.M), err
    first = out.split("first failure", 1)[1]
    assert "    state: .x=" in first and "    action: " in first, first
    assert "theta_dot" in first.split("differing fields", 1)[1], first


def test_a_compile_error_is_a_failed_verification_showing_rustc(tmp_path):
    source = copy_example("CartPole-v1", tmp_path, replace=("let terminated = x < -X_THRESHOLD", "let terminated = x < -X_THRESHLD"))
    proc = _orchestrator("verify", "--env", "CartPole-v1", "--backend", str(source), cwd=ENVS_FAST.parent)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[FAIL] builds" in proc.stdout and "error[E0425]" in proc.stdout and "X_THRESHLD" in proc.stdout


def test_bench_json_reports_the_rust_figures(tmp_path):
    out = tmp_path / "bench.json"
    proc = _orchestrator("bench", "--env", "CartPole-v1", "--backend", "envs_fast/translations/cartpole_v1.rs", "--num-envs", "4096",
                         "--seconds", "0.4", "--json", str(out), cwd=ENVS_FAST.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    # train.py's path at the default budget (720 s): the JAX learner over the port's vector env
    assert result["backend"] == "envs_fast/translations/cartpole_v1.rs" and result["train_path"] == "jax-host"
    for name in ("backend_sps", "reference_sps", "adapter_sps", "train_sps"):
        assert result[name] > 0, name
    assert result["ratio"] == pytest.approx(result["backend_sps"] / result["reference_sps"])
    assert result["train_sps"] == result["host_sps"] and result["e2e_sps"] is None
