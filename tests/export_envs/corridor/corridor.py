"""A 1-D corridor: the fixture domain of tests/test_export.py (the DOMAIN PROTOCOL, stdlib only).

The agent starts in cell START (or a task's start) and must reach the goal in the last cell.
Every step costs STEP_REWARD; reaching the goal pays GOAL_REWARD. The left wall makes
"step left" illegal in cell 0, so legal_actions changes with the state.
"""
from __future__ import annotations

NAME = "corridor"
DESCRIPTION = ("You stand in a corridor of 5 cells and the goal is the last cell. Each step costs "
               "0.1; reaching the goal pays 1. You cannot step left from the first cell.")
ACTIONS = ["step left", "step right"]
LENGTH = 5
OBSERVATION_SIZE = LENGTH
OBSERVATION_LOW, OBSERVATION_HIGH = 0.0, 1.0
STEP_REWARD = -0.1
GOAL_REWARD = 1.0
REWARD_RANGE = (STEP_REWARD, GOAL_REWARD)
MAX_STEPS = 8
START = 0


def reset(seed: int, task: dict | None = None) -> dict:
    start = (task or {}).get("start", START)
    return {"position": int(start) % (LENGTH - 1), "seed": seed}


def legal_actions(state: dict) -> list[int]:
    return [1] if state["position"] == 0 else [0, 1]


def step(state: dict, action: int) -> tuple[dict, float, bool]:
    if action not in legal_actions(state):
        raise ValueError(f"illegal action {action} in cell {state['position']}")
    state["position"] += 1 if action == 1 else -1
    if state["position"] == LENGTH - 1:
        return state, GOAL_REWARD, True
    return state, STEP_REWARD, False


def observation(state: dict) -> list[float]:
    return [1.0 if cell == state["position"] else 0.0 for cell in range(LENGTH)]


def render(state: dict) -> str:
    cells = ["A" if cell == state["position"] else ("G" if cell == LENGTH - 1 else ".")
             for cell in range(LENGTH)]
    return "|" + " ".join(cells) + "|"
