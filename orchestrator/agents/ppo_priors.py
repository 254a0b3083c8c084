"""Where each constant of train.py's hyperparameter block usually sits, from the literature: the
prior of the optuna agent (a constant far outside its usual range is the likeliest mistake in a
train.py, whatever its name) and of the night benchmark's drawn detunes (bench/nights.py).

Sources: CleanRL's ppo.py (classic control) and ppo_continuous_action.py defaults; Stable-Baselines3's
PPO defaults and the rl-baselines3-zoo tuned hyperparameters (hyperparams/ppo.yml: the ranges its
tuned configs span); PureJaxRL's ppo.py / ppo_continuous_action.py configs (the jax-e2e path);
Andrychowicz et al. 2021, "What matters in on-policy RL". A range is where tuned configs sit, not
every value that can work: a value outside it is tried towards it first, not refused.

A name matches with or without its path's JAX_ prefix, the JAX_ entry first. A constant with no
entry (one the agent added) has no prior: the screening pass measures it like the others.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

Number = Union[int, float]


@dataclass(frozen=True)
class Prior:
    default: Union[Number, bool]          # the usual default (CleanRL's where it has one)
    low: Optional[Number] = None          # the usual range (numbers); None for a flag
    high: Optional[Number] = None
    usual: tuple = ()                     # a flag's usual values (both when either is common)
    source: str = ""

    def atypical(self, value) -> bool:
        """Whether `value` is outside where this constant usually sits."""
        if isinstance(value, bool) or self.low is None:
            return bool(self.usual) and value not in self.usual
        return not (self.low <= value <= self.high)


PRIORS: dict[str, Prior] = {
    # sizes of a rollout and of the update (jax-host path)
    "NUM_ENVS": Prior(4, 1, 64, source="CleanRL 4 (classic) / 1 (continuous); zoo n_envs 1-64"),
    "NUM_STEPS": Prior(128, 8, 4096, source="CleanRL 128 / 2048; zoo n_steps 8-4096"),
    "UPDATE_EPOCHS": Prior(10, 2, 30, source="CleanRL 4 / 10; zoo n_epochs 2-30"),
    "NUM_MINIBATCHES": Prior(32, 1, 64, source="CleanRL 4 / 32"),
    "HIDDEN_SIZE": Prior(64, 32, 256, source="CleanRL, SB3 64; zoo net_arch 64-256"),
    # the optimiser
    "LEARNING_RATE": Prior(3e-4, 1e-4, 3e-3, source="CleanRL 2.5e-4 / 3e-4; zoo 1e-4-3e-3"),
    "ANNEAL_LR": Prior(True, usual=(True,), source="CleanRL anneal_lr=True"),
    "MAX_GRAD_NORM": Prior(0.5, 0.3, 5.0, source="CleanRL, SB3 0.5; zoo 0.3-5"),
    # the objective
    "GAMMA": Prior(0.99, 0.95, 0.999, source="CleanRL, SB3 0.99; zoo 0.95-0.9999"),
    "GAE_LAMBDA": Prior(0.95, 0.9, 0.99, source="CleanRL, SB3 0.95; zoo 0.9-0.99"),
    "CLIP_COEF": Prior(0.2, 0.1, 0.3, source="CleanRL, SB3 0.2; zoo 0.1-0.4"),
    "CLIP_VLOSS": Prior(True, usual=(False, True), source="CleanRL True, SB3 no value clipping"),
    "ENT_COEF": Prior(0.0, 0.0, 0.02, source="CleanRL 0.01 / 0.0; zoo 0-0.01"),
    "VF_COEF": Prior(0.5, 0.25, 1.0, source="CleanRL, SB3 0.5; zoo 0.2-1"),
    "TARGET_KL": Prior(0.0, 0.0, 0.05, source="CleanRL None (0 here: off); SB3 None; zoo up to 0.05"),
    "INIT_LOG_STD": Prior(0.0, -1.0, 0.5, source="CleanRL, SB3 log_std_init 0; zoo -2..0"),
    # normalisation (CleanRL's wrappers, SB3's VecNormalize)
    "NORM_OBS": Prior(True, usual=(True,), source="CleanRL NormalizeObservation; SB3 VecNormalize"),
    "NORM_REWARD": Prior(True, usual=(True,), source="CleanRL NormalizeReward; SB3 VecNormalize"),
    "OBS_CLIP": Prior(10.0, 5.0, 10.0, source="CleanRL clip 10; SB3 clip_obs 10"),
    "REWARD_CLIP": Prior(10.0, 5.0, 10.0, source="CleanRL clip 10; SB3 clip_reward 10"),
    # the jax-host path's envs over NUM_ENVS from a long budget (no literature value of its own: a
    # factor that keeps NUM_ENVS x it within PureJaxRL's 4-4096 envs at CleanRL's 4-64)
    "JAX_HOST_ENVS_FACTOR": Prior(1, 1, 64, source="none of its own: NUM_ENVS x factor within PureJaxRL's 4-4096 envs"),
    # the jax-e2e path: PureJaxRL's configs (classic control: 4 envs x 128 steps, 4 epochs, 4 minibatches)
    "JAX_NUM_ENVS": Prior(4, 4, 4096, source="PureJaxRL 4 (classic) / 2048 (brax)"),
    "JAX_NUM_STEPS": Prior(128, 8, 512, source="PureJaxRL 128 (classic) / 10 (brax)"),
    "JAX_UPDATE_EPOCHS": Prior(4, 1, 16, source="PureJaxRL 4"),
    "JAX_NUM_MINIBATCHES": Prior(4, 1, 64, source="PureJaxRL 4 (classic) / 32 (brax)"),
    "JAX_LEARNING_RATE": Prior(2.5e-4, 1e-4, 3e-3, source="PureJaxRL 2.5e-4 / 3e-4; tuned up to 3e-3"),
}


def prior_of(name: str) -> Optional[Prior]:
    """The constant's prior: its own entry, else its jax-host twin's (JAX_GAMMA -> GAMMA), else None."""
    if name in PRIORS:
        return PRIORS[name]
    return PRIORS.get(name[4:]) if name.startswith("JAX_") else None
