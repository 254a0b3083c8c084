"""Score a uniformly random policy with the fixed harness: the floor a trained policy must clear.

    python -m bench.random_policy ENV_ID [--episodes 1000] [--seed S] [--policy-seed S]

The policy is a TorchScript module drawing each action uniformly from the action space (Discrete:
every action, legal or not; Box: uniform between the bounds), scored by evaluate.evaluate_policy
exactly as a trained artifact is, in one process so its draws follow --policy-seed. Prints the
figures, then one JSON line."""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
import evaluate  # noqa: E402


class UniformDiscrete(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.randint(0, self.n, (obs.shape[0],))


class UniformBox(torch.nn.Module):
    def __init__(self, low, high):
        super().__init__()
        self.register_buffer("low", torch.as_tensor(low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        noise = torch.rand((obs.shape[0],) + self.low.shape)
        return self.low + noise * (self.high - self.low)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("env_id")
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=12345, help="episode i is reset with seed + i")
    parser.add_argument("--policy-seed", type=int, default=0, help="seeds the policy's draws")
    args = parser.parse_args()

    space = evaluate.make_env(args.env_id).action_space
    module = UniformDiscrete(int(space.n)) if hasattr(space, "n") else UniformBox(space.low, space.high)
    torch.manual_seed(args.policy_seed)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "policy.pt"
        torch.jit.save(torch.jit.script(module), str(path))
        result = evaluate.evaluate_policy(path, args.env_id, args.episodes, args.seed, workers=1)
    result.pop("returns"), result.pop("lengths")
    print(f"{args.env_id}, uniformly random policy: mean {result['mean']:.3f} ± {result['se']:.3f} (se) over "
          f"{args.episodes} episodes, iqm {result['iqm']:.3f}, mean length {result['mean_length']:.1f}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
