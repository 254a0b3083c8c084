"""Throughput of a backend against its gymnasium reference, measured in the same run.

    python -m envs_fast.bench --env ENV_ID --backend SPEC [--num-envs N] [--seconds S] [--json FILE]

Figures (steps per second; measured in interleaved rounds so that all see the same machine load):
  backend_sps        the backend itself: for JAX backends a jitted lax.scan rollout of random actions
                     over num_envs envs with auto-reset and time limit (no host round trips); for Rust
                     backends `autorl_step` called in a loop over num_envs envs (auto-reset through the
                     resets array, actions drawn beforehand); envpool at num_envs
  reference_sps      one gymnasium env (gym.make), stepped in Python
  reference_vec_sps  gymnasium's own vector env (gym.make_vec) at the adapter's num_envs
  adapter_sps        the backend through the gymnasium VectorEnv adapter at the num_envs a train.py
                     uses (its NUM_ENVS), actions sampled on the host as a PPO would send them
  e2e_sps            JAX backends only, when candidate/train.py trains them end to end (its block has
                     JAX_NUM_ENVS): the rollout half of that path as train.py runs it, a jitted
                     lax.scan of JAX_NUM_STEPS steps over JAX_NUM_ENVS envs, each step an MLP policy
                     (two tanh layers of HIDDEN_SIZE, random weights) sampling the actions from the
                     observations, then the backend's step with auto-reset and time limit. The PPO
                     update is left out: it costs the same whatever the backend. None otherwise.
  host_sps           backends train.py steps from its torch loop (envpool, reference, a Rust
                     translation, or any backend with a train.py without the end-to-end path): the
                     adapter at its NUM_ENVS with each step's actions sampled from a torch MLP policy
                     (two tanh layers of HIDDEN_SIZE, random weights) on the observations, as that loop
                     does; like e2e_sps, the PPO update is left out. None otherwise.
  train_sps          the figure that says how fast training will go on this backend: e2e_sps where
                     train.py trains the backend end to end, host_sps where it steps it from its torch
                     loop. Both include the policy, so a host backend is not ranked above an
                     end-to-end one for stepping faster without one.
                     The translate phase compares this one, and it is the figure cached for `auto`
                     (envs_fast.choose_backend ranks verified backends by it).
  ratio              backend_sps / reference_sps

`--figures train` measures only train_sps and reference_sps (the others are null): what ranking
verified backends needs (the daemon's setup), at a fraction of the cost.

train.py's constants are read from its hyperparameter block as text: no candidate code is imported.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np

from envs_fast import cache
from envs_fast.backend import load_functional
from envs_fast.protocol import BackendError, check_env_id, is_rust_spec, resolve_spec

DEFAULT_NUM_ENVS = 65536  # JAX backends: large batches amortise the per-step dispatch
DEFAULT_VECTOR_NUM_ENVS = 64  # envpool/reference: one process, threads per core
DEFAULT_ADAPTER_NUM_ENVS = 8
REPO_ROOT = Path(__file__).resolve().parent.parent


def train_constant(name: str, root: Path = REPO_ROOT) -> int | None:
    """An integer constant `NAME = 123` of candidate/train.py (read as text, never imported)."""
    try:
        text = (Path(root) / "candidate" / "train.py").read_text()
    except OSError:
        return None
    match = re.search(rf"^{name}\s*=\s*(\d+)", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def train_num_envs(root: Path = REPO_ROOT) -> int:
    """NUM_ENVS from the hyperparameter block of candidate/train.py, else a typical PPO value."""
    return train_constant("NUM_ENVS", root) or DEFAULT_ADAPTER_NUM_ENVS


def e2e_shape(root: Path = REPO_ROOT) -> tuple[int, int, int] | None:
    """(JAX_NUM_ENVS, JAX_NUM_STEPS, HIDDEN_SIZE) when train.py trains JAX backends end to end, else None."""
    envs, steps = train_constant("JAX_NUM_ENVS", root), train_constant("JAX_NUM_STEPS", root)
    if not envs or not steps:
        return None
    return envs, steps, train_constant("HIDDEN_SIZE", root) or 64


class Runner:
    """Something to time: `run_once()` runs a chunk of steps and returns how many; `close()`."""

    def __init__(self, run_once, close=lambda: None):
        self.run_once, self.close = run_once, close


def measure(runners: dict[str, Runner], seconds: float, rounds: int = 4) -> dict[str, float]:
    """Steps per second of each runner, `seconds` each, measured in interleaved rounds so that all
    figures (and hence their ratios) see the same load on a shared machine."""
    steps = {name: 0 for name in runners}
    spent = {name: 0.0 for name in runners}
    try:
        for _ in range(rounds):
            for name, runner in runners.items():
                started = time.perf_counter()
                while True:
                    steps[name] += runner.run_once()
                    elapsed = time.perf_counter() - started
                    if elapsed >= seconds / rounds:
                        break
                spent[name] += elapsed
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

    from envs_fast.vector import mix32

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

    from envs_fast.vector import make_batched_functions, max_episode_steps, reference_spaces

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

    from envs_fast.vector import make_batched_functions, max_episode_steps, reference_spaces

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


def host_runner(venv: gym.vector.VectorEnv, hidden: int, seed: int = 0, chunk: int = 16, threads: int = 1) -> Runner:
    """train.py's host loop without its update: each step a torch MLP policy (two tanh layers of
    `hidden`, random weights, on train.py's TORCH_THREADS threads) samples the actions from the
    observations, then the VectorEnv steps."""
    import torch

    torch.set_num_threads(threads)  # (torch's default, every core, is ~30x slower for such small layers)

    obs_space, act_space = venv.single_observation_space, venv.single_action_space
    categories = int(obs_space.n) if isinstance(obs_space, gym.spaces.Discrete) else 0
    obs_dim = categories or int(np.prod(obs_space.shape))
    discrete = isinstance(act_space, gym.spaces.Discrete)
    if not discrete and not isinstance(act_space, gym.spaces.Box):
        raise BackendError(f"bench needs a Discrete or Box action space, got {act_space}")
    out_dim = int(act_space.n) if discrete else int(np.prod(act_space.shape))
    torch.manual_seed(seed)
    policy = torch.nn.Sequential(torch.nn.Linear(obs_dim, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                 torch.nn.Tanh(), torch.nn.Linear(hidden, out_dim))
    obs, _ = venv.reset(seed=seed)

    def act(obs):
        x = np.eye(categories, dtype=np.float32)[np.asarray(obs, np.int64)] if categories else \
            np.asarray(obs, np.float32).reshape(venv.num_envs, -1)
        with torch.no_grad():
            out = policy(torch.from_numpy(x))
            if discrete:
                return (torch.distributions.Categorical(logits=out).sample().numpy() + act_space.start)
            sample = torch.distributions.Normal(out, 1.0).sample().numpy().reshape((venv.num_envs,) + act_space.shape)
        return np.clip(sample, act_space.low, act_space.high).astype(act_space.dtype)

    def run_once():
        nonlocal obs
        for _ in range(chunk):
            obs, *_ = venv.step(act(obs))
        return chunk * venv.num_envs

    run_once()  # warm-up (jit compilation for the JAX adapter)
    return Runner(run_once, venv.close)


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
    from envs_fast.rust_backend import load_rust

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


FIGURES = ("all", "train")


def bench(env_id: str, spec: str, num_envs: int | None = None, seconds: float = 3.0,
          adapter_num_envs: int | None = None, seed: int = 0, root=None, figures: str = "all") -> dict:
    """Measure the figures described in the module docstring (`figures="train"`: train_sps and
    reference_sps only); cache train_sps for `auto`."""
    from envs_fast import make_vec_env

    check_env_id(env_id)
    adapter_num_envs = adapter_num_envs or train_num_envs()
    if spec == "auto":  # what make_vec_env(backend="auto") trains on in this checkout
        from envs_fast import choose_backend

        spec = choose_backend(env_id, adapter_num_envs, root)
    spec = resolve_spec(spec, env_id, root)
    vector_backend, rust = spec in ("envpool", "reference"), is_rust_spec(spec)
    num_envs = num_envs or (DEFAULT_VECTOR_NUM_ENVS if vector_backend else DEFAULT_NUM_ENVS)
    # train.py trains functional JAX backends end to end; it steps the others from its torch loop
    root_path = Path(root) if root is not None else REPO_ROOT
    e2e = None if vector_backend or rust else e2e_shape(root_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        everything = figures == "all"
        runners = {"reference": reference_runner(env_id, seed)}
        if everything:
            runners["backend"] = (vector_runner(make_vec_env(spec, env_id, num_envs, seed, verified_only=False), seed) if vector_backend
                                  else rust_runner(spec, env_id, num_envs, seed) if rust
                                  else jax_runner(spec, env_id, num_envs, seed))
            runners["reference_vec"] = vector_runner(
                gym.make_vec(env_id, num_envs=adapter_num_envs, vectorization_mode="sync"), seed)
        if everything:
            runners["adapter"] = vector_runner(make_vec_env(spec, env_id, adapter_num_envs, seed, root, verified_only=False), seed)
        if e2e:
            runners["e2e"] = e2e_runner(spec, env_id, *e2e, seed=seed)
        else:
            runners["host"] = host_runner(make_vec_env(spec, env_id, adapter_num_envs, seed, root, verified_only=False),
                                          train_constant("HIDDEN_SIZE", root_path) or 64, seed,
                                          threads=train_constant("TORCH_THREADS", root_path) or 1)
        sps = measure(runners, seconds)
    backend, single, reference_vec, adapter = sps.get("backend"), sps["reference"], sps.get("reference_vec"), \
        sps.get("adapter")
    e2e_sps, host_sps = sps.get("e2e"), sps.get("host")
    train_sps = e2e_sps if e2e_sps is not None else host_sps
    cache.store_throughput(spec, env_id, adapter_num_envs, train_sps)  # what "auto" compares: training speed
    return {
        "env_id": env_id,
        "backend": spec,
        "num_envs": num_envs,
        "adapter_num_envs": adapter_num_envs,
        "seconds": seconds,
        "backend_sps": backend,
        "reference_sps": single,
        "reference_vec_sps": reference_vec,
        "adapter_sps": adapter,
        "e2e_sps": e2e_sps,
        "e2e_num_envs": e2e[0] if e2e else None,
        "host_sps": host_sps,
        "train_path": "jax-e2e" if e2e else "host",
        "train_sps": train_sps,
        "ratio": backend / single if backend is not None else None,
        "adapter_ratio": adapter / single if adapter is not None else None,
    }


def format_result(result: dict) -> str:
    lines = [
        ("backend_sps", f"  backend           {{:>14,.0f}} steps/s  ({result['num_envs']} envs)"),
        ("reference_sps", "  reference (1 env) {:>14,.0f} steps/s"),
        ("reference_vec_sps", f"  reference vector  {{:>14,.0f}} steps/s  ({result['adapter_num_envs']} envs, gym.make_vec)"),
        ("adapter_sps", f"  adapter           {{:>14,.0f}} steps/s  ({result['adapter_num_envs']} envs, VectorEnv)"),
        ("e2e_sps", f"  end to end        {{:>14,.0f}} steps/s  ({result['e2e_num_envs']} envs, "
                    f"train.py's jax-e2e rollout with a policy)"),
        ("host_sps", f"  host loop         {{:>14,.0f}} steps/s  ({result['adapter_num_envs']} envs, "
                     f"train.py's host rollout with a torch policy)"),
        ("train_sps", f"  training will see {{:>14,.0f}} steps/s  (train_sps: {result['train_path']} path)"),
        ("ratio", "  ratio             {:>14,.1f}x backend / reference (1 env)"),
    ]
    return "\n".join([f"bench {result['env_id']} with backend {result['backend']}"]
                     + [line.format(result[key]) for key, line in lines if result.get(key) is not None])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description="Steps per second of a backend and its reference.")
    parser.add_argument("--env", required=True)
    parser.add_argument("--backend", required=True, help="translation file path (.py JAX, .rs Rust), jax/translation, rust, "
                             "envpool, gymnax, reference, or auto "
                             "(what make_vec_env(backend='auto') would train on here)")
    parser.add_argument("--num-envs", type=int, default=None,
                        help=f"envs for the backend figure (default {DEFAULT_NUM_ENVS} for JAX and Rust backends, "
                             f"{DEFAULT_VECTOR_NUM_ENVS} for envpool/reference)")
    parser.add_argument("--adapter-num-envs", type=int, default=None, help="envs for the adapter figure (default: train.py's NUM_ENVS)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per measurement")
    parser.add_argument("--figures", choices=FIGURES, default="all",
                        help="all (default), or train: only train_sps and the reference's, to rank backends")
    parser.add_argument("--json", metavar="FILE")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if (args.num_envs is not None and args.num_envs < 1) or args.seconds <= 0 or (args.adapter_num_envs is not None and args.adapter_num_envs < 1):
        print("error: --num-envs/--adapter-num-envs must be >= 1 and --seconds > 0", file=sys.stderr)
        return 2
    try:
        result = bench(args.env, args.backend, args.num_envs, args.seconds, args.adapter_num_envs,
                       figures=args.figures)
    except BackendError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_result(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
