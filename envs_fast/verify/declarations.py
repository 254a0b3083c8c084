"""What a translation may declare about its own verification, in its state-sync companion (Rust:
`envs_fast/translations/<slug>_sync.py`) or its JAX file; every name is optional and without any the levels run as
for classic control. A physics scene needs them: chaos bounds step comparisons, and the states worth
stepping from (a foot strike, a joint at its limit, bodies asleep) are rare under random actions.

    VERIFY_POLICIES = {name: {"make": seed -> act(observation) -> action,   # one per episode
                              "l2_episodes": int, "l2_steps": int,       # L2: reference episodes gathered
                              "past_termination": bool,                  # keep stepping after the end
                              "statistics": bool}}                       # L3: compare episode statistics
    STATE_CATEGORIES = {name: (state, next_state) -> bool}  # L2 counts each; none of a kind fails it
    CHAOTIC = True   # L3: each synced trajectory is compared up to its own predictable horizon (where the
                     # reference rerun from its start moved by one float32 rounding departs from its own run),
                     # instead of float32 shadows; past it, episode statistics by TOST
    EPISODE_OUTCOMES = {name: (final reward, terminated) -> bool}  # L3: rates compared, e.g. falls
    TRANSFER_PPO = {"env_steps": int, "seeds": int, "margin": float, "min_score": float,
                    "train_py": {name: value}}  # optional: train.py constants set on both sides
                     # L4: PPO trained on the backend scores on the reference within the margin of PPO trained
                     # on the reference for the same env steps (ppo_transfer.py), instead of the CEM check
    CAPACITY = {name: (count: state -> number, limit)}  # what a fixed-shape port cannot hold beyond `limit`
                     # (a JAX port's contact slots): L2 fails if a state of the reference's own episodes, or
                     # its step, goes beyond it; a boundary state beyond it (the search writes states no
                     # episode reaches, a body metres from its joints) is counted and reported, not compared
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from envs_fast.protocol import import_file, is_rust_spec, sync_companion


@dataclass(frozen=True)
class Policy:
    name: str
    make: Callable[[int], Callable[[Any], Any]]
    l2_episodes: int = 0
    l2_steps: int | None = None
    past_termination: bool = False
    statistics: bool = False


@dataclass(frozen=True)
class Declarations:
    policies: tuple[Policy, ...] = ()
    state_categories: dict = field(default_factory=dict)
    chaotic: bool = False
    episode_outcomes: dict = field(default_factory=dict)
    transfer_ppo: dict | None = None
    capacity: dict = field(default_factory=dict)


def declarations_of(spec: str) -> Declarations:
    """The declarations of the translation SPEC (a resolved spec); none for other backends."""
    if is_rust_spec(spec):
        source = sync_companion(spec)
    elif str(spec).endswith(".py"):
        source = spec
    else:
        return Declarations()
    module = import_file(source, "_envs_fast_verify_declarations")
    policies = tuple(Policy(name, **options) for name, options in (getattr(module, "VERIFY_POLICIES", None) or {}).items())
    return Declarations(policies=policies,
                        state_categories=dict(getattr(module, "STATE_CATEGORIES", None) or {}),
                        chaotic=bool(getattr(module, "CHAOTIC", False)),
                        episode_outcomes=dict(getattr(module, "EPISODE_OUTCOMES", None) or {}),
                        transfer_ppo=getattr(module, "TRANSFER_PPO", None),
                        capacity=dict(getattr(module, "CAPACITY", None) or {}))
