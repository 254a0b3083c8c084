"""Verification of fast backends: shipped translations pass, seeded bugs are caught with a report
that names the check, envpool passes statistically, bad input exits 2."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from envs_fast.backends.load import BackendError
from envs_fast.verify import Settings, main, verify

pytestmark = pytest.mark.usefixtures("private_cache")

REPO = Path(__file__).resolve().parent.parent
SHIPPED = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Pendulum-v1"]
# Smaller than the CLI defaults so the suite stays within its time budget; still thousands of steps.
QUICK = Settings(reset_samples=300, l2_target=800, l3_trajectories=10, rollout_steps=150)


@pytest.mark.parametrize("env_id", SHIPPED)
def test_shipped_translation_passes_levels_1_to_3(env_id):
    report = verify(env_id, "jax", (1, 2, 3), QUICK)
    assert report.passed, report.to_text()
    assert [level.status for level in report.levels] == ["pass", "pass", "pass"]
    assert not report.statistical_only and "statistical" not in report.to_text().splitlines()[0]
    l2_checks = {check.name: check.detail for check in report.levels[1].checks}
    # thousands of real states plus states probed at the boundaries
    assert int(l2_checks["step from rollout states"].split(" of ")[1].split()[0]) >= 800
    assert int(l2_checks["step from boundary states"].split(" of ")[1].split()[0]) > 50
    assert report.levels[1].largest_deviation["fraction of allowed"] <= 1.0


def _mutant(tmp_path, source: str, old: str, new: str) -> Path:
    text = (REPO / "envs_fast" / "translations" / source).read_text()
    assert old in text, f"mutation anchor {old!r} not found"
    path = tmp_path / source
    path.write_text(text.replace(old, new))
    return path


CARTPOLE_BUGS = {
    "wrong constant": ("GRAVITY = 9.8\n", "GRAVITY = 9.81\n", "theta_dot"),
    "bound off by a little": ("X_THRESHOLD = 2.4\n", "X_THRESHOLD = 2.5\n", "terminated"),
    "dropped side of a bound": ("(new.x < -X_THRESHOLD)\n        | ", "", "terminated"),
    "wrong reward on the terminal step": ("reward = jnp.float32(1.0)",
                                          "reward = jnp.where(terminated, 0.0, 1.0).astype(jnp.float32)", "reward"),
    "swapped action": ("jnp.where(action == 1, FORCE_MAG", "jnp.where(action == 0, FORCE_MAG", "x_dot"),
    "time step off by 5%": ("TAU = 0.02 ", "TAU = 0.021 ", "theta_dot"),  # passes a return-distribution TOST
}


@pytest.mark.parametrize("bug", sorted(CARTPOLE_BUGS))
def test_seeded_bug_is_caught_at_l2_with_a_report_naming_the_check(tmp_path, bug):
    old, new, field = CARTPOLE_BUGS[bug]
    report = verify("CartPole-v1", str(_mutant(tmp_path, "cartpole_v1.py", old, new)), (2,), QUICK)
    assert not report.passed
    level = report.levels[0]
    assert level.status == "fail"
    failure = level.failure
    assert failure["check"] in ("step from rollout states", "step from boundary states")
    assert any(field in item["field"] for item in failure["fields"]), failure
    text = report.to_text()
    assert f"first failure (check '{failure['check']}')" in text
    assert "state: .x=" in text and "action:" in text  # the exact state and action to repair from


def test_clip_bound_dropped_on_one_side_is_caught(tmp_path):
    path = _mutant(tmp_path, "pendulum_v1.py", "theta_dot = jnp.clip(theta_dot, -MAX_SPEED, MAX_SPEED)",
                   "theta_dot = jnp.minimum(theta_dot, MAX_SPEED)")
    report = verify("Pendulum-v1", str(path), (2,), QUICK)
    assert not report.passed
    failure = report.levels[0].failure
    assert failure["check"] in ("step from rollout states", "step from boundary states")
    assert any("theta_dot" in item["field"] for item in failure["fields"])


def test_wrong_constant_fails_l3_trajectories(tmp_path):
    path = _mutant(tmp_path, "acrobot_v1.py", "G = 9.8\n", "G = 9.9\n")
    report = verify("Acrobot-v1", str(path), (3,), QUICK)
    assert not report.passed
    assert report.levels[0].failure["check"] == "trajectories from synced starts"


def test_reset_distribution_bug_fails_l1(tmp_path):
    path = _mutant(tmp_path, "mountaincar_v0.py", "minval=-0.6, maxval=-0.4", "minval=-0.6, maxval=-0.3")
    report = verify("MountainCar-v0", str(path), (1,), QUICK)
    assert not report.passed
    assert report.levels[0].failure["check"] == "reset distribution"


def test_envpool_bipedalwalker_passes_l1_and_statistical_l3():
    report = verify("BipedalWalker-v3", "envpool", (1, 2, 3),
                    Settings(vector_reset_samples=200, episodes=200, horizon=60))
    assert report.passed, report.to_text()
    statuses = {level.level: level.status for level in report.levels}
    assert statuses == {1: "pass", 2: "not applicable", 3: "pass"}
    assert "TOST" in report.levels[2].checks[0].name
    assert_says_statistical_only(report)


def assert_says_statistical_only(report):
    """A backend without state sync passes only the weaker, statistical verification: its report
    (text and JSON) says so in its first line (the verdict the cache keeps) and at L2 and L3."""
    text, data = report.to_text(), json.loads(report.to_json())
    assert "statistical only, the weaker kind" in text.splitlines()[0]
    assert data["statistical_only"] is True
    assert "L2 interactions: NOT APPLICABLE - statistical only, the weaker verification" in text
    for level in [level for level in data["levels"] if level["level"] in (2, 3)]:
        assert level["note"].startswith("statistical only, the weaker verification: "), level
        assert "L2 is not applicable and L3 compares return distributions" in level["note"]
        assert "a translation must sync state" in level["note"]


def test_gymnax_is_verified_statistically_and_its_report_says_so():
    pytest.importorskip("gymnax", reason="gymnax is not installed")
    report = verify("CartPole-v1", "gymnax", (2, 3), Settings(episodes=100, horizon=60))
    assert report.passed, report.to_text()
    assert [level.status for level in report.levels] == ["not applicable", "pass"]
    assert_says_statistical_only(report)


def test_cli_exit_codes_and_json(tmp_path):
    bad_bound = _mutant(tmp_path, "cartpole_v1.py", "X_THRESHOLD = 2.4\n", "X_THRESHOLD = 2.5\n")
    out = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, "-m", "envs_fast.verify", "--env", "CartPole-v1", "--backend", str(bad_bound),
         "--levels", "2", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 1, result.stderr
    assert "L2 interactions: FAIL" in result.stdout
    data = json.loads(out.read_text())
    assert data["passed"] is False
    assert data["levels"][0]["failure"]["fields"][0]["field"] == "terminated"


@pytest.mark.parametrize("argv, message", [
    (["--env", "NoSuchEnv-v9", "--backend", "jax"], "unknown environment id"),
    (["--env", "CartPole-v1", "--backend", "/nonexistent/cartpole.py"], "does not exist"),
    (["--env", "CartPole-v1", "--backend", "jax", "--levels", "1,7"], "levels must be among"),
    (["--env", "CartPole-v1", "--backend", "jax", "--levels", "one"], "--levels"),
    (["--env", "MountainCar-v0", "--backend", "gymnax-typo"], "does not exist"),
])
def test_bad_input_exits_2_with_a_clear_message(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_translation_that_does_not_import_or_lacks_a_function_exits_2(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("import jax\nENV_ID = 'CartPole-v1'\ndef reset(key:\n")
    assert main(["--env", "CartPole-v1", "--backend", str(broken)]) == 2
    assert "import failed" in capsys.readouterr().err
    partial = tmp_path / "partial.py"
    partial.write_text("ENV_ID = 'CartPole-v1'\ndef reset(key): pass\ndef step(key, state, action): pass\n")
    assert main(["--env", "CartPole-v1", "--backend", str(partial)]) == 2
    err = capsys.readouterr().err
    assert "protocol incomplete, missing state_from_reference, state_to_reference" in err
    with pytest.raises(BackendError, match="ENV_ID is 'CartPole-v1', expected 'Acrobot-v1'"):
        verify("Acrobot-v1", str(REPO / "envs_fast" / "translations" / "cartpole_v1.py"), (1,), QUICK)


FROZEN_LAKE = '''
"""FrozenLake-v1 (4x4, slippery) in JAX: Discrete observations, stochastic transitions."""
import jax
import jax.numpy as jnp
import numpy as np

ENV_ID = "FrozenLake-v1"
MAP = "SFFFFHFHFFFHHFFG"
TERMINAL = jnp.array([c in "HG" for c in MAP])
GOAL = MAP.index("G")


def reset(key):
    return jnp.int32(0), jnp.int32(0)


def step(key, state, action):
    move = (action + jax.random.randint(key, (), -1, 2)) % 4  # SLIP
    row, col = state // 4, state % 4
    col = jnp.where(move == 0, jnp.maximum(col - 1, 0), jnp.where(move == 2, jnp.minimum(col + 1, 3), col))
    row = jnp.where(move == 1, jnp.minimum(row + 1, 3), jnp.where(move == 3, jnp.maximum(row - 1, 0), row))
    nxt = jnp.where(TERMINAL[state], state, row * 4 + col).astype(jnp.int32)
    reward = jnp.where(~TERMINAL[state] & (nxt == GOAL), 1.0, 0.0).astype(jnp.float32)
    return nxt, nxt, reward, TERMINAL[nxt]


def state_from_reference(env):
    return np.int32(env.unwrapped.s)


def state_to_reference(state, env):
    env.unwrapped.s = int(state)
'''


def test_discrete_observation_stochastic_env_is_compared_in_distribution(tmp_path):
    good = tmp_path / "frozenlake_v1.py"
    good.write_text(FROZEN_LAKE)
    report = verify("FrozenLake-v1", str(good), (1, 2, 3), QUICK)
    assert report.passed, report.to_text()
    assert "stochastic" in report.levels[1].note and "TOST" in report.levels[2].checks[0].name

    biased = tmp_path / "biased.py"
    biased.write_text(FROZEN_LAKE.replace("jax.random.randint(key, (), -1, 2)", "jax.random.randint(key, (), 0, 2)"))
    report = verify("FrozenLake-v1", str(biased), (2,), QUICK)
    assert not report.passed
    assert report.levels[0].failure["check"] == "next-step distribution"
    assert "reference outcomes" in report.to_text()


def test_state_sync_that_does_not_write_fails_instead_of_looking_stochastic(tmp_path):
    path = _mutant(tmp_path, "cartpole_v1.py", "env.unwrapped.state = np.array", "env.unwrapped.stale = np.array")
    report = verify("CartPole-v1", str(path), (2, 3), QUICK)
    assert [level.status for level in report.levels] == ["fail", "fail"]
    assert report.levels[0].failure["check"] == "state sync round trip"
    assert "read back" in report.levels[0].failure


def test_l4_policy_trained_on_the_backend_transfers_to_the_reference():
    report = verify("CartPole-v1", "jax", (4,), Settings(episodes=100, horizon=150, l4_iterations=5))
    assert report.passed, report.to_text()
    check = report.levels[0].checks[0]
    assert check.name == "trained policy transfers (TOST)"
    start, end = check.detail.split("mean return ")[1].split(")")[0].split(" -> ")
    assert float(end) > float(start)  # the policy did learn on the backend


def test_protocol_violation_is_reported_by_name(tmp_path):
    path = _mutant(tmp_path, "cartpole_v1.py", "return _obs(new), new, reward, terminated",
                   "return _obs(new), new, reward, terminated, {}")
    report = verify("CartPole-v1", str(path), (1,), QUICK)
    assert report.levels[0].failure["check"] == "step signature"
    assert "the protocol is (obs, state, reward, terminated)" in report.to_text()


def test_sync_status_is_computed_once_even_when_l2_and_l3_both_run(monkeypatch):
    from envs_fast.verify import context

    calls = []
    compute = context.compute_sync_status

    def counting(ctx):
        calls.append(ctx.env_id)
        return compute(ctx)

    monkeypatch.setattr(context, "compute_sync_status", counting)
    report = verify("CartPole-v1", "jax", (2, 3), QUICK)
    assert report.passed, report.to_text()
    assert calls == ["CartPole-v1"]


def test_a_backend_that_does_not_build_fails_l1_builds_with_the_compiler_message(monkeypatch, capsys):
    import envs_fast.backends.load
    from envs_fast.protocol import BuildError

    message = "error[E0425]: cannot find value `GRAVITY` in this scope"

    def does_not_build(spec, env_id, root=None):
        raise BuildError(message)

    monkeypatch.setattr(envs_fast.backends.load, "load_batched", does_not_build)
    report = verify("CartPole-v1", "jax", (1, 2, 3), QUICK)
    assert not report.passed
    assert [level.level for level in report.levels] == [1]
    assert report.levels[0].failure["check"] == "builds"
    assert report.levels[0].checks[0].detail == message
    assert main(["--env", "CartPole-v1", "--backend", "jax"]) == 1  # a failed verification, not bad input
    assert message in capsys.readouterr().out


def test_a_jax_backend_answers_every_batch_size_with_one_compiled_program():
    """The verifier's batches (64, 446, 1024, ...) run padded to one size: the rows a caller gets
    are those it would get alone, and reset and step compile once each."""
    import numpy as np

    from envs_fast.backends.load import load_batched
    from envs_fast.backends.jax_batched import BATCH

    backend = load_batched("envs_fast/translations/cartpole_v1.py", "CartPole-v1")
    seeds = np.arange(BATCH + 300, dtype=np.uint32)  # past one chunk
    obs, state = backend.reset(seeds)
    actions = np.arange(len(seeds)) % 2
    everything = backend.step(seeds, state, actions)
    few = backend.step(seeds[:5], jax_rows(state, 5), actions[:5])
    for whole, part in zip(jax_leaves(everything), jax_leaves(few)):
        assert whole.shape[0] == len(seeds) and part.shape[0] == 5
        assert np.array_equal(whole[:5], part)
    assert np.array_equal(jax_leaves(backend.reset(seeds[:3]))[0], jax_leaves(obs)[0][:3])
    assert backend._step._cache_size() == 1 and backend._reset._cache_size() == 1


def jax_rows(tree, rows):
    import jax

    return jax.tree_util.tree_map(lambda x: x[:rows], tree)


def jax_leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def test_loading_gymnax_leaves_seaborn_until_something_renders():
    """gymnax imports seaborn for two renderers: 2 s of every gymnax training run's budget."""
    code = ("import sys\nfrom envs_fast.backends.gymnax_backend import load_gymnax\nload_gymnax('CartPole-v1')\n"
            "print('seaborn.palettes' in sys.modules)\n"
            "import gymnax.environments.misc.pong as pong\nprint(len(pong.sns.color_palette('cubehelix', 3)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "3"]


def test_l1_tells_distributions_apart_but_not_two_roundings_of_one_constant():
    """A reset component both sides hold at one value up to float rounding (the BipedalWalker JAX
    port's lidar reading 0.5341 +- 4e-7) is one value, as L2 would call it; KS alone fails it."""
    from envs_fast.verify.stats import same_distribution_p
    from envs_fast.verify.properties import component_p

    rng = np.random.default_rng(0)
    rtol, atol = Settings.rtol, Settings.atol
    reference = 0.5341 + rng.normal(0, 4e-7, 1000)
    rounded_apart = reference + 3e-7
    assert same_distribution_p(rounded_apart, reference)[0] < 1e-10
    assert component_p(rounded_apart, reference, rtol, atol) == (1.0, "constant within tolerance")
    # beyond the tolerance, or a real spread, the test decides as before
    assert component_p(reference + 1e-3, reference, rtol, atol)[0] < 1e-10
    spread = rng.normal(0, 1, 1000)
    assert component_p(spread + 0.3, rng.normal(0, 1, 1000), rtol, atol)[0] < 1e-6
    assert component_p(rng.normal(0, 1, 1000), spread, rtol, atol)[0] > 1e-4
    # a backend that is constant where the reference spreads is told apart
    assert component_p(np.zeros(1000), rng.normal(0, 1e-3, 1000), rtol, atol)[0] < 1e-10
    # NaN (a field the reference leaves unset) is a value of its own
    with_nan = np.where(np.arange(1000) % 2 == 0, np.nan, reference)
    assert component_p(with_nan, reference, rtol, atol)[0] < 1e-10


# CartPole's translation made wrong for carts written beyond |x| = 3 (the episode ends at 2.4, so no
# episode goes there; L2's boundary search does): what a fixed-shape port's capacity looks like
BEYOND_THREE = ("x=state.x + TAU * state.x_dot,", "x=state.x + TAU * state.x_dot + jnp.where(jnp.abs(state.x) > 3.0, "
                "jnp.float32(0.5), jnp.float32(0.0)),")


def _declaring_capacity(tmp_path, limit):
    tmp_path.mkdir(exist_ok=True)
    path = _mutant(tmp_path, "cartpole_v1.py", *BEYOND_THREE)
    path.write_text(path.read_text() + f'\nCAPACITY = {{"|x|": (lambda state: abs(float(state.x)), {limit})}}\n')
    return path


def test_a_declared_capacity_leaves_out_boundary_states_beyond_it_and_says_how_many(tmp_path):
    undeclared = _mutant(tmp_path, "cartpole_v1.py", *BEYOND_THREE)
    assert not verify("CartPole-v1", str(undeclared), (2,), QUICK).passed  # the wrong step is found there
    report = verify("CartPole-v1", str(_declaring_capacity(tmp_path / "declared", 3.0)), (2,), QUICK)
    assert report.passed, report.to_text()
    checks = {check.name: check for check in report.levels[0].checks}
    capacity = checks["within the port's declared capacity (|x| <= 3)"]
    reached = float(capacity.detail.split("the episodes' states reach |x| ")[1].split(";")[0])
    assert 0 < reached < 2.4  # 2.4 ends an episode
    assert "boundary states go beyond it (|x| up to" in capacity.detail and "are not compared" in capacity.detail
    assert int(checks["step from boundary states"].detail.split(" of ")[1].split()[0]) > 50  # the rest still are


def test_a_capacity_the_envs_own_episodes_exceed_fails_l2(tmp_path):
    report = verify("CartPole-v1", str(_declaring_capacity(tmp_path, 0.1)), (2,), QUICK)
    assert not report.passed
    check = next(c for c in report.levels[0].checks if c.name.startswith("within the port's declared capacity"))
    assert not check.passed and "states of the reference's own episodes go beyond it" in check.detail


def test_the_report_of_l1_to_l3_is_told_before_l4_starts():
    """A physics port's L4 trains for hours and may be stopped, to resume another day: what L1-L3 found is
    told (progress lines, on the CLI's stderr) before it starts, not only in the report at the end."""
    told = []

    class Stopped(Exception):
        pass

    def progress(line):
        told.append(line)
        if line.startswith("L4 transfer: started"):
            raise Stopped

    with pytest.raises(Stopped):
        verify("CartPole-v1", "jax", (1, 2, 3, 4), QUICK, progress=progress)
    before = [line[len("before L4: "):] for line in told if line.startswith("before L4: ")]
    assert before[0].startswith("verify CartPole-v1 with backend") and "L3 rollouts: PASS" in before
    assert any("step from rollout states" in line for line in before)  # the checks, not only the verdict


def test_the_boundary_search_checks_the_same_states_however_slow_the_machine(monkeypatch):
    """L2's coverage is counted, not timed: a machine on which every reference step looks slow (here the
    clock jumps 5 s at each reading) searches exactly the states a quiet one does, flips bisected
    included. Stopping at a slow step once made which states L2 compared, and a verdict, depend on load."""
    import time

    import envs_fast.translations.cartpole_v1 as port
    from envs_fast.verify.probes import ReferenceStepper, collect_boundary_samples, flat_values, probe_actions

    def search() -> list[str]:
        stepper = ReferenceStepper("CartPole-v1", port)
        try:
            bases = [stepper.reset(seed) for seed in (0, 1)]
            values = np.stack([flat_values(state) for state in bases])
            samples = collect_boundary_samples(stepper, bases, np.std(values, axis=0) + 0.05,
                                               np.max(np.abs(values), axis=0) + 0.2,
                                               probe_actions(stepper.env.action_space, np.random.default_rng(0)))
        finally:
            stepper.close()
        return [sample.origin for sample in samples]

    quiet = search()
    assert any(origin.startswith("termination boundary of") for origin in quiet)   # it found and bisected flips
    clock = [time.perf_counter()]

    def slow_clock() -> float:
        clock[0] += 5.0
        return clock[0]

    monkeypatch.setattr(time, "perf_counter", slow_clock)
    assert search() == quiet
