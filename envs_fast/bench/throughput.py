"""Timed loops: how fast each kind of backend steps, as a benchmark or a training run would drive it.

A `Runner` runs a chunk of steps per call; `measure` times several of them in interleaved rounds,
so all see the same machine load. envs_fast.bench composes these into its figures.
"""
from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

from envs_fast.backends.load import load_functional
from envs_fast.protocol import BackendError


class Runner:
    """Something to time: `run_once()` runs a chunk of steps and returns how many; `close()`."""

    def __init__(self, run_once, close=lambda: None):
        self.run_once, self.close = run_once, close


def measure(runners: dict[str, Runner], seconds: float, rounds: int = 4,
            per_round: dict[str, list[float]] | None = None) -> dict[str, float]:
    """Steps per second of each runner, `seconds` each, measured in interleaved rounds so that all
    figures (and hence their ratios) see the same load on a shared machine; every other round in
    reverse order, so that none is always measured first. `per_round`, when given, receives each
    runner's figure of every round (paired by round: what a ratio's spread is estimated from)."""
    steps = {name: 0 for name in runners}
    spent = {name: 0.0 for name in runners}
    try:
        for index in range(rounds):
            order = list(runners.items())
            for name, runner in (order if index % 2 == 0 else order[::-1]):
                started, done = time.perf_counter(), 0
                while True:
                    done += runner.run_once()
                    elapsed = time.perf_counter() - started
                    if elapsed >= seconds / rounds:
                        break
                steps[name] += done
                spent[name] += elapsed
                if per_round is not None:
                    per_round.setdefault(name, []).append(done / elapsed)
    finally:
        for runner in runners.values():
            runner.close()
    return {name: steps[name] / spent[name] for name in runners}


def reference_runner(env_id: str, seed: int = 0) -> Runner:
    """One gymnasium env (gym.make, with its standard wrappers), random actions, reset when done."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    env.reset(seed=seed)

    def run_once(chunk=256):
        for _ in range(chunk):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        return chunk

    return Runner(run_once, env.close)


def vector_runner(venv: gym.vector.VectorEnv, seed: int = 0) -> Runner:
    """A VectorEnv stepped with actions sampled on the host, as a PPO loop does."""
    venv.reset(seed=seed)
    venv.action_space.seed(seed)

    def run_once(chunk=16):
        for _ in range(chunk):
            venv.step(venv.action_space.sample())
        return chunk * venv.num_envs

    run_once(2)  # warm-up (jit compilation for the JAX adapter)
    return Runner(run_once, venv.close)


def reference_sps(env_id: str, seconds: float, seed: int = 0) -> float:
    return measure({"reference": reference_runner(env_id, seed)}, seconds, rounds=1)["reference"]


def vector_sps(venv: gym.vector.VectorEnv, seconds: float, seed: int = 0) -> float:
    return measure({"vector": vector_runner(venv, seed)}, seconds, rounds=1)["vector"]


def _hash_bits(seed, step, num_envs: int):
    """32 uniform bits per env from a cheap integer hash of (seed, step, env index). A threefry draw
    per env costs more than a classic-control step; the benchmark times the env, not the action
    generator, so actions come from this hash instead."""
    import jax.numpy as jnp

    from envs_fast.backends.jax_vector import mix32

    return mix32(jnp.arange(num_envs, dtype=jnp.uint32) * jnp.uint32(0x9E3779B1)
                 + jnp.asarray(step, jnp.uint32) * jnp.uint32(0x85EBCA77) + jnp.asarray(seed, jnp.uint32))


def random_actions(space: gym.Space):
    """`sample(seed, step, n)`: uniform random actions for n envs at a given step."""
    import jax.numpy as jnp

    if isinstance(space, gym.spaces.Discrete):
        return lambda seed, step, n: (_hash_bits(seed, step, n) % jnp.uint32(space.n)).astype(jnp.int32) + space.start
    if isinstance(space, gym.spaces.Box):
        low = jnp.asarray(np.where(np.isfinite(space.low), space.low, -1.0), jnp.float32)
        high = jnp.asarray(np.where(np.isfinite(space.high), space.high, 1.0), jnp.float32)
        size = int(np.prod(space.shape))

        def sample(seed, step, n):
            bits = _hash_bits(seed, step, n * size).reshape((n,) + space.shape)
            unit = (bits >> 8).astype(jnp.float32) / float(1 << 24)
            return low + unit * (high - low)

        return sample
    raise BackendError(f"bench needs a Discrete or Box action space, got {space}")


def jax_runner(spec: str, env_id: str, num_envs: int, seed: int = 0, scan_steps: int = 256) -> Runner:
    """A jitted lax.scan of random-action steps over num_envs envs, auto-reset and time limit included."""
    import jax
    import jax.numpy as jnp

    from envs_fast.backends.jax_vector import make_batched_functions, max_episode_steps, reference_spaces

    backend = load_functional(spec, env_id, verified_only=False)
    batched_reset, batched_step = make_batched_functions(backend, max_episode_steps(env_id))
    sample = random_actions(reference_spaces(env_id)[1])

    @jax.jit
    def rollout(carry):
        def body(carry, _):
            key, step, state, elapsed, needs_reset = carry
            key, step_key = jax.random.split(key)
            _, state, reward, _, _, elapsed, needs_reset = batched_step(
                step_key, state, elapsed, needs_reset, sample(seed, step, num_envs))
            return (key, step + 1, state, elapsed, needs_reset), reward.sum()

        carry, rewards = jax.lax.scan(body, carry, None, length=scan_steps)
        return carry, rewards.sum()

    key = jax.random.PRNGKey(seed)
    _, state = jax.jit(batched_reset)(jax.random.split(key, num_envs))
    carry = (key, jnp.uint32(0), state, jnp.zeros(num_envs, jnp.int32), jnp.zeros(num_envs, bool))
    return _scan_runner(rollout, carry, scan_steps * num_envs)


def e2e_runner(spec: str, env_id: str, num_envs: int, num_steps: int, hidden: int, seed: int = 0) -> Runner:
    """The rollout of train.py's end-to-end path (see e2e_sps in the module docstring): a jitted lax.scan
    of num_steps steps over num_envs envs, an MLP policy sampling each step's actions."""
    import jax
    import jax.numpy as jnp

    from envs_fast.backends.jax_vector import make_batched_functions, max_episode_steps, reference_spaces

    backend = load_functional(spec, env_id, verified_only=False)
    batched_reset, batched_step = make_batched_functions(backend, max_episode_steps(env_id))
    obs_space, act_space = reference_spaces(env_id)
    categories = int(obs_space.n) if isinstance(obs_space, gym.spaces.Discrete) else 0
    obs_dim = categories or int(np.prod(obs_space.shape))
    if isinstance(act_space, gym.spaces.Discrete):
        out_dim = int(act_space.n)
    elif isinstance(act_space, gym.spaces.Box):
        out_dim = int(np.prod(act_space.shape))
        low, high = (jnp.asarray(np.where(np.isfinite(b), b, s), jnp.float32).reshape(-1)
                     for b, s in ((act_space.low, -1.0), (act_space.high, 1.0)))
    else:
        raise BackendError(f"bench needs a Discrete or Box action space, got {act_space}")
    rng = np.random.default_rng(seed)
    sizes = [(obs_dim, hidden), (hidden, hidden), (hidden, out_dim)]
    weights = [(jnp.asarray(rng.normal(0, 1 / np.sqrt(i), (i, o)), jnp.float32), jnp.zeros(o, jnp.float32))
               for i, o in sizes]

    def policy(obs, step):
        x = (jax.nn.one_hot(obs.reshape(-1), categories) if categories
             else obs.reshape(num_envs, -1).astype(jnp.float32))
        for w, b in weights[:-1]:
            x = jnp.tanh(x @ w + b)
        out = x @ weights[-1][0] + weights[-1][1]
        unit = ((_hash_bits(seed, step, num_envs * out_dim) >> 9).astype(jnp.float32) + 0.5) / float(1 << 23)  # in (0, 1)
        unit = unit.reshape(num_envs, out_dim)
        if isinstance(act_space, gym.spaces.Discrete):  # Gumbel-max sampling, as a categorical policy
            return (jnp.argmax(out - jnp.log(-jnp.log(unit)), axis=-1) + act_space.start).astype(jnp.int32)
        action = jnp.clip(out + jax.scipy.special.ndtri(unit), low, high)  # a Gaussian policy
        return action.reshape((num_envs,) + act_space.shape)

    @jax.jit
    def rollout(carry):
        def body(carry, _):
            key, step, obs, state, elapsed, needs_reset = carry
            key, step_key = jax.random.split(key)
            obs, state, reward, _, _, elapsed, needs_reset = batched_step(
                step_key, state, elapsed, needs_reset, policy(obs, step))
            return (key, step + 1, obs, state, elapsed, needs_reset), reward.sum()

        carry, rewards = jax.lax.scan(body, carry, None, length=num_steps)
        return carry, rewards.sum()

    import jax.scipy.special  # noqa: F401  (ndtri)

    key = jax.random.PRNGKey(seed)
    obs, state = jax.jit(batched_reset)(jax.random.split(key, num_envs))
    carry = (key, jnp.uint32(0), obs, state, jnp.zeros(num_envs, jnp.int32), jnp.zeros(num_envs, bool))
    return _scan_runner(rollout, carry, num_steps * num_envs)


def _policy_shape(venv: gym.vector.VectorEnv) -> tuple[int, int, bool, int]:
    """(categories of a Discrete observation or 0, policy input width, discrete actions, policy output
    width) of a policy over `venv`'s spaces."""
    obs_space, act_space = venv.single_observation_space, venv.single_action_space
    categories = int(obs_space.n) if isinstance(obs_space, gym.spaces.Discrete) else 0
    discrete = isinstance(act_space, gym.spaces.Discrete)
    if not discrete and not isinstance(act_space, gym.spaces.Box):
        raise BackendError(f"bench needs a Discrete or Box action space, got {act_space}")
    return (categories, categories or int(np.prod(obs_space.shape)), discrete,
            int(act_space.n) if discrete else int(np.prod(act_space.shape)))


def _policy_loop(venv: gym.vector.VectorEnv, act, obs, chunk: int) -> Runner:
    """A Runner stepping `venv` with `act(obs)` `chunk` times per call, run once first (compilation)."""
    def run_once():
        nonlocal obs
        for _ in range(chunk):
            obs, *_ = venv.step(act(obs))
        return chunk * venv.num_envs

    run_once()
    return Runner(run_once, venv.close)


def jax_host_runner(venv: gym.vector.VectorEnv, hidden: int, seed: int = 0, chunk: int = 16) -> Runner:
    """train.py's jax-host rollout without its update: each step one call of a compiled JAX MLP
    policy (two tanh layers of `hidden`, random weights) on the observations, with noise drawn on
    the host, then the VectorEnv steps."""
    import jax
    import jax.numpy as jnp

    act_space = venv.single_action_space
    categories, obs_dim, discrete, out_dim = _policy_shape(venv)
    rng = np.random.default_rng(seed)
    weights = [(jnp.asarray(rng.normal(0, 1 / np.sqrt(i), (i, o)), jnp.float32), jnp.zeros(o, jnp.float32))
               for i, o in [(obs_dim, hidden), (hidden, hidden), (hidden, out_dim)]]

    @jax.jit
    def policy(obs, noise):
        x = jax.nn.one_hot(obs.reshape(-1), categories) if categories else obs.reshape(obs.shape[0], -1)
        for w, b in weights[:-1]:
            x = jnp.tanh(x @ w + b)
        out = x @ weights[-1][0] + weights[-1][1]
        if discrete:  # Gumbel-max sampling, as a categorical policy
            return jnp.argmax(out - jnp.log(-jnp.log(noise)), axis=-1)
        return out + noise  # a Gaussian policy's sample

    obs, _ = venv.reset(seed=seed)
    n = venv.num_envs

    def act(obs):
        noise = rng.uniform(1e-6, 1.0, (n, out_dim)) if discrete else rng.standard_normal((n, out_dim))
        sample = np.asarray(policy(np.asarray(obs, np.float32 if not categories else np.int32), noise.astype(np.float32)))
        if discrete:
            return sample + act_space.start
        return np.clip(sample.reshape((n,) + act_space.shape), act_space.low, act_space.high).astype(act_space.dtype)

    return _policy_loop(venv, act, obs, chunk)


def _scan_runner(rollout, carry, steps_per_call: int) -> Runner:
    """Time a jitted `rollout(carry) -> (carry, total)`: compiled here, outside the timing."""
    carry, total = rollout(carry)
    total.block_until_ready()

    def run_once():
        nonlocal carry
        carry, total = rollout(carry)
        total.block_until_ready()
        return steps_per_call

    return Runner(run_once)


def rust_runner(spec: str, env_id: str, num_envs: int, seed: int = 0, chunk: int = 16) -> Runner:
    """`autorl_step` in a loop over num_envs envs: one call's terminated flags are the next call's
    resets (two flag buffers in turn), so finished envs auto-reset at no Python cost; random actions
    are drawn beforehand, so the figure times the env, not the action sampler."""
    from envs_fast.rust.backend import load_rust

    backend = load_rust(spec, env_id)
    library, n = backend.library, num_envs
    seeds = np.arange(n, dtype=np.uint64) + np.uint64(seed) * np.uint64(n)
    state = np.zeros((n, backend.state_size))
    obs = np.zeros((n, backend.obs_size), np.float32)
    reward = np.zeros(n)
    flags = [np.zeros(n, np.uint8), np.zeros(n, np.uint8)]
    actions = [np.ascontiguousarray(_host_actions(backend.action_space, n, seed + k), dtype=np.float64).reshape(n, -1)
               for k in range(8)]
    library.autorl_reset(n, seeds.ctypes.data, state.ctypes.data, obs.ctypes.data)
    address = lambda a: a.ctypes.data  # noqa: E731
    calls = [(n, address(seeds), address(flags[k % 2]), address(state), address(actions[k % 8]), address(obs),
              address(reward), address(flags[(k + 1) % 2])) for k in range(8)]
    stride = np.uint64(n)
    buffers = (state, obs, reward, flags, actions)  # `calls` holds bare addresses: keep the arrays alive

    def run_once():
        assert buffers
        for k in range(chunk):
            np.add(seeds, stride, out=seeds)
            library.autorl_step(*calls[k % 8])
        return chunk * n

    run_once()
    return Runner(run_once)


def _host_actions(space: gym.Space, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, n)
    if isinstance(space, gym.spaces.Box):
        low = np.where(np.isfinite(space.low), space.low, -1.0)
        high = np.where(np.isfinite(space.high), space.high, 1.0)
        return rng.uniform(low, high, (n,) + space.shape)
    raise BackendError(f"bench needs a Discrete or Box action space, got {space}")


def jax_backend_sps(spec: str, env_id: str, num_envs: int, seconds: float, seed: int = 0) -> float:
    return measure({"backend": jax_runner(spec, env_id, num_envs, seed)}, seconds, rounds=1)["backend"]
