"""Hand-written TorchScript policies for harness tests (no training needed)."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn


class CartPoleController(nn.Module):
    """A linear feedback controller that balances CartPole-v1 for the full 500 steps."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x, x_dot, theta, theta_dot = obs[:, 0], obs[:, 1], obs[:, 2], obs[:, 3]
        return (0.1 * x + 0.5 * x_dot + 10.0 * theta + 2.0 * theta_dot > 0).long()


class ConstantAction(nn.Module):
    """Always the same continuous action vector (shape [B, act_dim])."""

    def __init__(self, action: list[float]):
        super().__init__()
        self.register_buffer("action", torch.tensor(action, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.action.expand(obs.shape[0], self.action.shape[0])


class PendulumEnergy(nn.Module):
    """A nonlinear swing-up heuristic: its return depends on the start state (so on the seed)."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        torque = torch.tanh(3.0 * obs[:, 2] * obs[:, 0] - obs[:, 1]) * 2.0
        return torque.unsqueeze(1)


class WrongShape(nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], 3)


class NaNActions(nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.full((obs.shape[0], 1), float("nan"))


class DiscreteIndexPolicy(nn.Module):
    """For Discrete observations: obs is [B] (the state index as a float); always action 2."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.full((obs.shape[0],), 2, dtype=torch.long) + 0 * obs.long()


class AlwaysZero(nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.zeros(obs.shape[0], dtype=torch.long)


def save(module: nn.Module, path: Path) -> Path:
    torch.jit.save(torch.jit.script(module), str(path))
    return path
