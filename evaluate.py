"""The FIXED evaluation harness of autorl. Nobody edits this file during a run.

It owns the constants of the experiment, the reference environment factories, the loading of
an exported policy artifact (without importing any candidate code), and the evaluation that
produces the score. The daemon runs a hashed copy of this file in a fresh process:

    python evaluate.py --policy PATH [--env ENV_ID] [--episodes N] [--seed S] [--out FILE.json]

The last line of stdout (and --out) is one JSON object: mean, std, se, iqm, min, max,
episodes, returns, lengths, ... It exits non-zero with a one-line reason on a missing or
unreadable artifact, a wrong output shape, NaN actions or an unknown env id.

`module:Class` ids (a created environment, `envs.<name>.env:Env`) are imported from the repository
root: $AUTORL_ENV_ROOT when the daemon names one (the commit's snapshot), else the directory
holding this file. With $AUTORL_ENV_SHA256 set, the env's folder must still have that content
hash (the environment is frozen during a search), else it exits 3 with one line saying so.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import math
import os
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Sequence

import gymnasium as gym
import numpy as np

# ---------------------------------------------------------------- the experiment's constants
TIME_BUDGET = float(os.environ.get("AUTORL_TIME_BUDGET", 720))  # seconds of training
if TIME_BUDGET.is_integer():
    TIME_BUDGET = int(TIME_BUDGET)
ENV_ID = os.environ.get("AUTORL_ENV_ID", "BipedalWalker-v3")
NUM_EVAL_EPISODES = 100
# An env registered without a time limit is capped here, so an episode that never ends cannot
# hang an evaluation or a training run.
MAX_EPISODE_STEPS = 10_000

POLICY_SUFFIXES = (".pt", ".pt2")
ENV_ROOT_VARIABLE = "AUTORL_ENV_ROOT"      # where `module:Class` ids are imported from
ENV_SHA256_VARIABLE = "AUTORL_ENV_SHA256"  # the frozen content hash of that module's folder
ENV_CHANGED_EXIT = 3


class HarnessError(Exception):
    """A bad artifact, env id or policy output: the message is the one-line reason."""


class EnvChanged(HarnessError):
    """The env's folder is not the one the run started with."""


# ---------------------------------------------------------------- environments
def _check_supported_spaces(env: gym.Env, env_id: str) -> None:
    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(obs_space, (gym.spaces.Box, gym.spaces.Discrete)):
        raise HarnessError(f"{env_id}: observation space {obs_space} is not Box or Discrete")
    if not isinstance(act_space, (gym.spaces.Box, gym.spaces.Discrete)):
        raise HarnessError(f"{env_id}: action space {act_space} is not Box or Discrete")


def make_env(env_id: str = ENV_ID, seed: int | None = None) -> gym.Env:
    """The reference gymnasium env, its episodes capped at MAX_EPISODE_STEPS if unlimited.

    `module:EnvName-v0` ids import `module` first (gymnasium's own syntax), `module:Class` ids
    make that gymnasium.Env subclass; the module is imported from `repository_root()`."""
    try:
        env = gym.make(_make_argument(env_id))
    except (gym.error.Error, ModuleNotFoundError, ImportError) as exc:
        raise HarnessError(f"unknown env id {env_id!r}: {exc}") from None
    if env.spec is None or env.spec.max_episode_steps is None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps=MAX_EPISODE_STEPS)
    _check_supported_spaces(env, env_id)
    if seed is not None:
        env.reset(seed=seed)
        env.action_space.seed(seed)
    return env


def repository_root() -> Path:
    """Where `module:...` ids are imported from: the root the daemon names, else this file's directory."""
    return Path(os.environ.get(ENV_ROOT_VARIABLE) or Path(__file__).resolve().parent)


def _make_argument(env_id: str):
    """What gym.make gets: the id, or for `module:Class` (a class, not a registered id) a spec of it."""
    if ":" not in env_id:
        return env_id
    root = str(repository_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    module_name, _, attribute = env_id.partition(":")
    candidate = getattr(importlib.import_module(module_name), attribute, None)
    if isinstance(candidate, type) and issubclass(candidate, gym.Env):
        return gym.envs.registration.EnvSpec(id=env_id, entry_point=candidate)
    return env_id


def env_folder_sha256(folder: Path) -> str:
    """The content hash of an env folder (the same as orchestrator/envfolder.py's): sha256 over its
    files in sorted order of relative path, each as path, NUL, size, NUL, bytes; __pycache__ ignored."""
    digest = hashlib.sha256()
    files = sorted((p.relative_to(folder).as_posix(), p) for p in folder.rglob("*")
                   if p.is_file() and "__pycache__" not in p.relative_to(folder).parts)
    for relative, path in files:
        data = path.read_bytes()
        digest.update(f"{relative}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def check_env_frozen(env_id: str) -> None:
    """With $AUTORL_ENV_SHA256 set, refuse when the folder of `module:...`'s module changed."""
    expected = os.environ.get(ENV_SHA256_VARIABLE)
    if not expected:
        return
    package = env_id.partition(":")[0].split(".")[:-1]
    if ":" not in env_id or not package:
        raise HarnessError(f"{ENV_SHA256_VARIABLE} is set but {env_id!r} is not `package.module:Class`")
    folder = repository_root().joinpath(*package)
    actual = env_folder_sha256(folder) if folder.is_dir() else "(missing)"
    if actual != expected:
        raise EnvChanged(f"{'/'.join(package)}/ changed since the run started (sha256 {actual[:12]}, expected "
                         f"{expected[:12]}): the environment is frozen during a search")


def make_vec_env(env_id: str = ENV_ID, num_envs: int = 8, seed: int = 0, backend: str = "auto"):
    """A `gymnasium.vector.VectorEnv` over the fastest *verified* backend.

    backend: "auto" (`envs_fast.choose_backend`: the fastest of a verified envs_fast translation,
    verified gymnax and envpool, else gymnasium), "gymnasium", "envpool", or any envs_fast spec (a
    translation file, "jax", "gymnax"). Autoreset follows gymnasium's NEXT_STEP mode on every backend."""
    if backend == "auto":
        backend = _auto_backend(env_id, num_envs)
    if backend in ("gymnasium", "reference"):
        make_env(env_id)  # fail early and clearly on a bad id
        vec = gym.vector.SyncVectorEnv(
            [lambda: make_env(env_id) for _ in range(num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
        )
        vec.reset(seed=seed)
        vec.action_space.seed(seed)
        return vec
    import envs_fast  # envpool and the fast backends share one factory

    return envs_fast.make_vec_env(backend, env_id, num_envs, seed)


def _auto_backend(env_id: str, num_envs: int) -> str:
    """envs_fast's choice. The harness copy in a run folder has no envs_fast beside it: envpool
    where it has the env, else gymnasium."""
    try:
        from envs_fast import choose_backend
    except ImportError:
        return "envpool" if _envpool_supports(env_id) else "gymnasium"
    return choose_backend(env_id, num_envs)


def _envpool_supports(env_id: str) -> bool:
    try:
        from envs_fast.envpool_backend import envpool_supports
    except ImportError:
        return False
    return envpool_supports(env_id)


# ---------------------------------------------------------------- the policy artifact
class Policy:
    """A loaded artifact: maps an observation batch to an action batch (numpy in, numpy out).

    TorchScript (`policy.pt`, torch.jit.save) or torch.export (`policy.pt2`). Neither format
    runs Python code from the candidate when loaded."""

    def __init__(self, path: str | os.PathLike):
        import torch

        self.path = Path(path)
        if not self.path.is_file():
            raise HarnessError(f"policy artifact not found: {self.path}")
        if self.path.suffix not in POLICY_SUFFIXES:
            raise HarnessError(f"policy artifact must be .pt (TorchScript) or .pt2 (torch.export): {self.path}")
        self._torch = torch
        try:
            if self.path.suffix == ".pt2":
                self.module = torch.export.load(str(self.path)).module()
            else:
                with warnings.catch_warnings():  # TorchScript is deprecated upstream, still our format
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self.module = torch.jit.load(str(self.path), map_location="cpu")
        except Exception as exc:  # torch raises many kinds for a corrupt archive
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise HarnessError(f"unreadable policy artifact {self.path}: {first_line}") from None
        if hasattr(self.module, "eval"):
            try:
                self.module.eval()
            except Exception:
                pass  # exported modules may refuse eval(); they carry no train-mode state

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            try:
                out = self.module(torch.as_tensor(np.asarray(obs), dtype=torch.float32))
            except Exception as exc:
                first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise HarnessError(f"policy failed on an observation batch of shape {obs.shape}: {first_line}") from None
        if not isinstance(out, torch.Tensor):
            raise HarnessError(f"policy must return one tensor, got {type(out).__name__}")
        return out.detach().cpu().numpy()


def load_policy(path: str | os.PathLike) -> Policy:
    return Policy(path)


def _observation_batch(observations: Sequence, obs_space: gym.Space) -> np.ndarray:
    if isinstance(obs_space, gym.spaces.Discrete):
        return np.asarray(observations, dtype=np.float32).reshape(-1)
    return np.stack([np.asarray(o, dtype=np.float32) for o in observations])


def _actions_from_output(out: np.ndarray, batch: int, act_space: gym.Space) -> np.ndarray:
    """Check the policy's output against the action space; clip Box actions to the bounds."""
    if isinstance(act_space, gym.spaces.Discrete):
        if out.shape != (batch,):
            raise HarnessError(f"policy output shape {out.shape}, expected ({batch},) discrete actions")
        if np.issubdtype(out.dtype, np.floating):
            if not np.all(np.isfinite(out)):
                raise HarnessError("policy returned NaN or infinite actions")
            if not np.all(out == np.round(out)):
                raise HarnessError("policy returned non-integer discrete actions")
        actions = out.astype(np.int64)
        low, high = act_space.start, act_space.start + act_space.n - 1
        if actions.min() < low or actions.max() > high:
            raise HarnessError(f"policy returned discrete actions outside [{low}, {high}]")
        return actions
    expected = (batch, *act_space.shape)
    if out.shape != expected:
        raise HarnessError(f"policy output shape {out.shape}, expected {expected}")
    if not np.all(np.isfinite(out)):
        raise HarnessError("policy returned NaN or infinite actions")
    return np.clip(out, act_space.low, act_space.high).astype(act_space.dtype)


# ---------------------------------------------------------------- evaluation
def _play_episodes(policy: Policy, env_id: str, episode_seeds: Sequence[int], parallel: int):
    """Plays one episode per seed, `parallel` envs stepped in lockstep with one policy call.

    Episode i always runs on its own env reset with episode_seeds[i]: results do not depend on
    how episodes are scheduled."""
    envs = [make_env(env_id) for _ in range(min(parallel, len(episode_seeds)))]
    returns = np.zeros(len(episode_seeds), dtype=np.float64)
    lengths = np.zeros(len(episode_seeds), dtype=np.int64)
    next_episode = 0
    slots: list[int | None] = []  # episode index running in each env
    observations = []
    for env in envs:
        obs, _ = env.reset(seed=int(episode_seeds[next_episode]))
        slots.append(next_episode)
        observations.append(obs)
        next_episode += 1
    obs_space, act_space = envs[0].observation_space, envs[0].action_space
    while any(slot is not None for slot in slots):
        active = [i for i, slot in enumerate(slots) if slot is not None]
        batch = _observation_batch([observations[i] for i in active], obs_space)
        actions = _actions_from_output(policy(batch), len(active), act_space)
        for action, i in zip(actions, active):
            obs, reward, terminated, truncated, _ = envs[i].step(action)
            episode = slots[i]
            returns[episode] += float(reward)
            lengths[episode] += 1
            if terminated or truncated:
                if next_episode < len(episode_seeds):
                    obs, _ = envs[i].reset(seed=int(episode_seeds[next_episode]))
                    slots[i] = next_episode
                    next_episode += 1
                else:
                    slots[i] = None
            observations[i] = obs
    for env in envs:
        env.close()
    return returns, lengths


def _worker_play(args):
    policy_path, env_id, episode_seeds, parallel = args
    import torch

    torch.set_num_threads(1)
    try:
        return _play_episodes(load_policy(policy_path), env_id, episode_seeds, parallel)
    except HarnessError as exc:  # sent back as text: the class may not unpickle across processes
        return str(exc)


def interquartile_mean(values: np.ndarray) -> float:
    from scipy.stats import trim_mean

    return float(trim_mean(values, 0.25))


def evaluate_policy(
    policy: Policy | str | os.PathLike,
    env_id: str = ENV_ID,
    episodes: int = NUM_EVAL_EPISODES,
    seeds: int | Sequence[int] = 0,
    workers: int | None = None,
) -> dict:
    """Plays `episodes` deterministic episodes on the reference env and summarises the returns.

    seeds: a base seed (episode i uses seed + i) or one seed per episode. workers: processes
    to spread episodes over (default: one per core, one when the artifact's path is unknown)."""
    if not isinstance(policy, Policy):
        policy = load_policy(policy)
    if isinstance(seeds, (int, np.integer)):
        episode_seeds = [int(seeds) + i for i in range(episodes)]
    else:
        episode_seeds = [int(s) for s in seeds][:episodes]
        if len(episode_seeds) < episodes:
            raise HarnessError(f"{episodes} episodes need {episodes} seeds, got {len(episode_seeds)}")
    if episodes < 1:
        raise HarnessError("episodes must be at least 1")
    env = make_env(env_id)  # refuses a bad id before any work
    # One batch of two observations checks the output shape before any episode is played.
    probe_obs = [env.observation_space.sample() for _ in range(2)]
    env.close()
    _actions_from_output(policy(_observation_batch(probe_obs, env.observation_space)), 2, env.action_space)

    if workers is None:
        workers = int(os.environ.get("AUTORL_EVAL_WORKERS", os.cpu_count() or 1))
    workers = max(1, min(workers, episodes))
    parallel = 16  # envs per worker stepped in lockstep: one policy call serves them all
    started = time.time()
    if workers == 1:
        returns, lengths = _play_episodes(policy, env_id, episode_seeds, parallel)
    else:
        # Contiguous shares keep each episode on its own seed whatever the worker count.
        shares = np.array_split(np.arange(episodes), workers)
        jobs = [(str(policy.path), env_id, [episode_seeds[i] for i in share], parallel) for share in shares]
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            parts = list(pool.map(_worker_play, jobs))
        for part in parts:
            if isinstance(part, str):
                raise HarnessError(part)
        returns = np.concatenate([p[0] for p in parts])
        lengths = np.concatenate([p[1] for p in parts])
    std = float(returns.std(ddof=1)) if episodes > 1 else 0.0
    return {
        "env_id": env_id,
        "policy": str(policy.path),
        "episodes": episodes,
        "seed": episode_seeds[0],
        "mean": float(returns.mean()),
        "std": std,
        "se": std / math.sqrt(episodes),
        "iqm": interquartile_mean(returns),
        "min": float(returns.min()),
        "max": float(returns.max()),
        "mean_length": float(lengths.mean()),
        "returns": [float(r) for r in returns],
        "lengths": [int(n) for n in lengths],
        "eval_seconds": round(time.time() - started, 3),
    }


# ---------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Score an exported policy on the reference env.")
    parser.add_argument("--policy", required=True, help="policy.pt (TorchScript) or policy.pt2 (torch.export)")
    parser.add_argument("--env", default=ENV_ID, help=f"gymnasium env id (default {ENV_ID})")
    parser.add_argument("--episodes", type=int, default=NUM_EVAL_EPISODES)
    parser.add_argument("--seed", type=int, default=0, help="episode i is reset with seed + i")
    parser.add_argument("--out", help="also write the JSON result here")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    args = parser.parse_args(argv)
    # A batch of at most 16 observations gains nothing from intra-op threads, which only spin: one
    # thread per process, as in the workers (this process plays the episodes when --workers is 1).
    import torch

    torch.set_num_threads(1)
    try:
        check_env_frozen(args.env)
        result = evaluate_policy(args.policy, args.env, args.episodes, args.seed, workers=args.workers)
    except HarnessError as exc:
        print(f"evaluate.py: error: {exc}", file=sys.stderr)
        return ENV_CHANGED_EXIT if isinstance(exc, EnvChanged) else 1
    line = json.dumps(result)
    if args.out:
        Path(args.out).write_text(line + "\n")
    print(
        f"{args.env}: mean {result['mean']:.2f} ± {result['se']:.2f} (se) over {args.episodes} episodes, "
        f"iqm {result['iqm']:.2f}, min {result['min']:.2f}, max {result['max']:.2f}"
    )
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
