"""How far BipedalWalker-v3 is predictable step by step: the reference itself (gymnasium on pybox2d),
started from the same synced state twice, once with the hull's x nudged by one float32 ulp, under
the same actions; the first step at which the two runs' observation or reward differ by more than
L3's tolerance (1e-5 + 1e-4 * |reference|) is where a correct port that rounds one operation
differently could no longer be told from a wrong one. Also: the reference's episode statistics
(return, fall rate, length) and its speed, from which L3's episode counts were chosen.

    .venv/bin/python -m bench.bipedalwalker_horizon [--starts 40] [--steps 400] [--episodes 20]

Start states: step 30 of episodes under random actions and under gymnasium's heuristic walker
(actions recorded from the unperturbed run and replayed open loop, as L3 replays them on the port),
and the standing-still schedule from reset (run past termination until the bodies sleep).
"""
import argparse
import json
import time
import warnings

import gymnasium as gym
import numpy as np


from envs_fast.translations import bipedalwalker_v3_sync as sync  # noqa: E402

ATOL, RTOL = 1e-5, 1e-4


def nudged(state):
    state = list(state)
    cx = np.float32(state[sync.O_BODY])
    state[sync.O_BODY] = float(np.nextafter(cx, np.float32(np.inf)))
    return state


def run(env, start, actions):
    sync.state_to_reference(start, env)
    out = []
    for action in actions:
        obs, reward, terminated, _, _ = env.unwrapped.step(action)
        out.append(np.concatenate([obs, [reward]]))
    return np.array(out)


def horizon(env, start, actions) -> int:
    base, moved = run(env, start, actions), run(env, nudged(start), actions)
    over = np.any(np.abs(moved - base) > ATOL + RTOL * np.abs(base), axis=1)
    return int(np.argmax(over)) if over.any() else len(actions)


def start_and_actions(env, policy_name, seed, steps, rng):
    make = sync.VERIFY_POLICIES[policy_name]["make"] if policy_name in sync.VERIFY_POLICIES else None
    act = make(seed) if make else (lambda obs: rng.uniform(-1, 1, 4).astype(np.float32))
    obs, _ = env.reset(seed=seed)
    warmup = 0 if policy_name == "standing still until asleep" else 30
    for _ in range(warmup):
        obs, *_ = env.step(act(obs))
    start = sync.state_from_reference(env)
    actions = []
    for _ in range(steps):
        action = np.asarray(act(obs), np.float32)
        actions.append(action)
        obs, *_ = env.unwrapped.step(action)
    return start, actions


def episode_statistics(env, policy_name, episodes, rng):
    out = []
    for episode in range(episodes):
        make = sync.VERIFY_POLICIES[policy_name]["make"] if policy_name in sync.VERIFY_POLICIES else None
        act = make(episode) if make else (lambda obs: rng.uniform(-1, 1, 4).astype(np.float32))
        obs, _ = env.reset(seed=50_000 + episode)
        total, length, fell = 0.0, 0, False
        while True:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += reward
            length += 1
            if terminated or truncated:
                fell = bool(terminated and reward == -100)
                break
        out.append((total, length, fell))
    return np.array(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=40)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--episodes", type=int, default=20)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    env = gym.make("BipedalWalker-v3")
    rng = np.random.default_rng(0)
    results = {}
    for policy in ("random actions", "heuristic walker", "standing still until asleep"):
        starts = args.starts if policy != "standing still until asleep" else max(4, args.starts // 8)
        steps = args.steps if policy != "standing still until asleep" else 600
        found = [horizon(env, *start_and_actions(env, policy, 100 + i, steps, rng)) for i in range(starts)]
        q = np.percentile(found, [0, 5, 25, 50])
        results[policy] = {"horizons": found, "min": int(q[0]), "p5": float(q[1]), "p25": float(q[2]), "median": float(q[3])}
        print(f"{policy}: 1-ulp hull nudge exceeds {ATOL:g} + {RTOL:g}*|ref| at step min {q[0]:.0f}, "
              f"5% {q[1]:.0f}, 25% {q[2]:.0f}, median {q[3]:.0f} (of {starts} starts, {steps} steps each)", flush=True)
    for policy in ("random actions", "heuristic walker"):
        began = time.perf_counter()
        stats = episode_statistics(env, policy, args.episodes, rng)
        seconds = time.perf_counter() - began
        results[policy]["episodes"] = {
            "return mean/sd": [float(stats[:, 0].mean()), float(stats[:, 0].std(ddof=1))],
            "length mean/sd": [float(stats[:, 1].mean()), float(stats[:, 1].std(ddof=1))],
            "fall rate": float(stats[:, 2].mean()), "steps/s": float(stats[:, 1].sum() / seconds)}
        print(f"{policy}: {args.episodes} episodes: {results[policy]['episodes']}", flush=True)
    print(json.dumps({p: {k: v for k, v in r.items() if k != "horizons"} for p, r in results.items()}))


if __name__ == "__main__":
    main()
