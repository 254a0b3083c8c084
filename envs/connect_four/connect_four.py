"""Connect Four against a random opponent: rules, state, reward and termination (stdlib only).

The board has 6 rows and 7 columns; cell (row, column) is index row * 7 + column, row 0 being
the bottom row. The agent plays first; after each of its moves the opponent drops a disc in a
uniformly random legal column, drawn from the state's own random.Random (so one seed fixes the
whole game).
"""
from __future__ import annotations

import random

NAME = "connect_four"
DESCRIPTION = ("Play Connect Four (6 rows, 7 columns) as the first player against an opponent that drops its disc "
               "in a uniformly random legal column. Connect four of your own discs in a row, a column or a "
               "diagonal before the opponent does: +1 for a win, -1 for a loss, 0 for a draw. Dropping a disc "
               "into a full column is illegal: -1 and the game ends.")
ROWS, COLUMNS = 6, 7
ACTIONS = [f"drop in column {column + 1}" for column in range(COLUMNS)]
OBSERVATION_SIZE = ROWS * COLUMNS
OBSERVATION_LOW, OBSERVATION_HIGH = -1.0, 1.0
REWARD_RANGE = (-1.0, 1.0)
MAX_STEPS = 21          # the agent's moves in a full game: 42 cells, two discs per step

AGENT, OPPONENT, EMPTY = 1, -1, 0
WIN, LOSS, DRAW, ILLEGAL = 1.0, -1.0, 0.0, -1.0
DIRECTIONS = ((0, 1), (1, 0), (1, 1), (1, -1))


def reset(seed: int, task: dict | None = None) -> dict:
    """An empty board, the agent to move. There are no tasks: `task` is ignored."""
    return {"board": [EMPTY] * (ROWS * COLUMNS), "rng": random.Random(seed), "done": False,
            "outcome": None, "moves": 0}


def legal_actions(state: dict) -> list[int]:
    if state["done"]:
        return []
    top = (ROWS - 1) * COLUMNS
    return [column for column in range(COLUMNS) if state["board"][top + column] == EMPTY]


def step(state: dict, action: int) -> tuple[dict, float, bool]:
    """The agent drops a disc in column `action`, then the opponent answers (unless the game ended)."""
    if state["done"]:
        raise ValueError("the game has ended: reset it")
    state["moves"] += 1
    if action not in legal_actions(state):
        return _end(state, "illegal move", ILLEGAL)
    if _drop(state["board"], action, AGENT):
        return _end(state, "win", WIN)
    if not legal_actions(state):
        return _end(state, "draw", DRAW)
    reply = state["rng"].choice(legal_actions(state))
    if _drop(state["board"], reply, OPPONENT):
        return _end(state, "loss", LOSS)
    if not legal_actions(state):
        return _end(state, "draw", DRAW)
    return state, 0.0, False


def observation(state: dict) -> list[float]:
    """The 42 cells from the agent's point of view: +1 its discs, -1 the opponent's, 0 empty."""
    return [float(cell) for cell in state["board"]]


def render(state: dict) -> str:
    symbols = {AGENT: "X", OPPONENT: "O", EMPTY: "."}
    board = state["board"]
    lines = [" ".join(symbols[board[row * COLUMNS + column]] for column in range(COLUMNS))
             for row in reversed(range(ROWS))]
    lines.append(" ".join(str(column + 1) for column in range(COLUMNS)))
    status = state["outcome"] or "X (the agent) to move"
    return "\n".join(lines) + f"\nmove {state['moves']}: {status}"


def _end(state: dict, outcome: str, reward: float) -> tuple[dict, float, bool]:
    state["done"], state["outcome"] = True, outcome
    return state, reward, True


def _drop(board: list[int], column: int, player: int) -> bool:
    """Drop `player`'s disc in `column` (which has room); True when it connects four."""
    row = next(r for r in range(ROWS) if board[r * COLUMNS + column] == EMPTY)
    board[row * COLUMNS + column] = player
    for d_row, d_column in DIRECTIONS:
        count = 1
        for sign in (1, -1):
            r, c = row + sign * d_row, column + sign * d_column
            while 0 <= r < ROWS and 0 <= c < COLUMNS and board[r * COLUMNS + c] == player:
                count += 1
                r, c = r + sign * d_row, c + sign * d_column
        if count >= 4:
            return True
    return False
