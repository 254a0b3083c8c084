"""Single-file PPO (PyTorch) for the autorl experiment, in the spirit of CleanRL's
ppo_continuous_action.py, updated for gymnasium 1.x and a fixed wall-clock budget.

Trains on evaluate.make_vec_env (the fastest verified backend), stops after TIME_BUDGET seconds
of training, and exports $AUTORL_OUTPUT_DIR/policy.pt: a TorchScript module with observation
normalisation baked in that maps an observation batch to deterministic actions. The score is
NOT computed here: the daemon evaluates the artifact with the fixed harness.

What makes it a strong start rather than a textbook one:
- observation normalisation and reward scaling by running statistics;
- gymnasium's NEXT_STEP autoreset handled exactly: time-limit truncations bootstrap from the
  final observation instead of being treated as deaths, and the reset steps are masked out;
- learning rate and entropy annealed over the *time* budget, not a step count;
- state-independent log-std, orthogonal init, separate actor and critic;
- thread counts chosen for small CPUs.
"""
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root
import evaluate  # noqa: E402  (the fixed harness: constants and env factories)

# >>> hyperparameters
NUM_ENVS = 32  # parallel environments
NUM_STEPS = 256  # steps per env per rollout
LEARNING_RATE = 3e-4  # Adam, annealed linearly to 0 over the time budget
ANNEAL_LR = True
GAMMA = 0.99  # discount
GAE_LAMBDA = 0.95  # GAE lambda
UPDATE_EPOCHS = 10  # passes over each rollout
NUM_MINIBATCHES = 32  # minibatches per epoch
CLIP_COEF = 0.2  # PPO ratio clip
CLIP_VLOSS = False  # clip the value loss too
ENT_COEF = 0.0  # entropy bonus
VF_COEF = 0.5  # value loss weight
MAX_GRAD_NORM = 0.5  # gradient clipping
TARGET_KL = 0.0  # stop an update early past this KL (0 = never)
HIDDEN_SIZE = 64  # width of both MLPs
INIT_LOG_STD = 0.0  # initial log-std of the Gaussian policy (continuous actions)
NORM_OBS = True  # running observation normalisation (baked into the export)
NORM_REWARD = True  # scale rewards by the running std of the discounted return
OBS_CLIP = 10.0  # clip normalised observations
REWARD_CLIP = 10.0  # clip scaled rewards
TORCH_THREADS = 1  # small MLPs are fastest single-threaded; the env backend uses the rest
BACKEND = "auto"  # evaluate.make_vec_env backend
# <<< hyperparameters

ENV_ID = evaluate.ENV_ID
TIME_BUDGET = evaluate.TIME_BUDGET
SEED = int(os.environ.get("AUTORL_SEED", 1))
OUTPUT_DIR = Path(os.environ.get("AUTORL_OUTPUT_DIR", "out"))


class RunningMeanStd:
    """Running mean and variance over batches (parallel algorithm of Chan et al.)."""

    def __init__(self, shape=()):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = 1e-4

    def update(self, x):
        if x.shape[0] == 0:
            return
        batch_mean, batch_var, batch_count = x.mean(axis=0), x.var(axis=0), x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        self.var = m2 / total
        self.count = total


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim, act_dim, discrete):
        super().__init__()
        self.discrete = discrete
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, HIDDEN_SIZE)), nn.Tanh(),
            layer_init(nn.Linear(HIDDEN_SIZE, HIDDEN_SIZE)), nn.Tanh(),
            layer_init(nn.Linear(HIDDEN_SIZE, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, HIDDEN_SIZE)), nn.Tanh(),
            layer_init(nn.Linear(HIDDEN_SIZE, HIDDEN_SIZE)), nn.Tanh(),
            layer_init(nn.Linear(HIDDEN_SIZE, act_dim), std=0.01),
        )
        if not discrete:
            self.actor_logstd = nn.Parameter(torch.full((1, act_dim), float(INIT_LOG_STD)))

    def value(self, x):
        return self.critic(x).squeeze(-1)

    def distribution(self, x):
        out = self.actor(x)
        if self.discrete:
            return torch.distributions.Categorical(logits=out)
        return torch.distributions.Normal(out, self.actor_logstd.expand_as(out).exp())


class ExportedPolicy(nn.Module):
    """Deterministic policy for the harness: raw observation batch -> action batch."""

    def __init__(self, actor, obs_mean, obs_var, obs_clip, num_obs_categories, discrete):
        super().__init__()
        self.actor = actor
        self.register_buffer("obs_mean", torch.as_tensor(obs_mean, dtype=torch.float32))
        self.register_buffer("obs_std", torch.as_tensor(np.sqrt(obs_var + 1e-8), dtype=torch.float32))
        self.obs_clip = obs_clip
        self.num_obs_categories = num_obs_categories
        self.discrete = discrete

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.num_obs_categories > 0:
            x = nn.functional.one_hot(obs.long(), self.num_obs_categories).float()
        else:
            x = torch.flatten(obs, 1)
            x = torch.clamp((x - self.obs_mean) / self.obs_std, -self.obs_clip, self.obs_clip)
        out = self.actor(x)
        if self.discrete:
            return torch.argmax(out, dim=-1)
        return out


def main():
    torch.set_num_threads(TORCH_THREADS)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    envs = evaluate.make_vec_env(ENV_ID, NUM_ENVS, SEED, backend=BACKEND)
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    discrete = hasattr(act_space, "n")
    num_obs_categories = int(obs_space.n) if hasattr(obs_space, "n") else 0
    obs_dim = num_obs_categories or int(np.prod(obs_space.shape))
    act_dim = int(act_space.n) if discrete else int(np.prod(act_space.shape))
    normalise_obs = NORM_OBS and num_obs_categories == 0

    def features(raw_obs, obs_rms):
        """Network input from a raw observation batch (the same transform the export bakes in)."""
        if num_obs_categories:
            return np.eye(num_obs_categories, dtype=np.float32)[raw_obs.astype(np.int64)]
        x = raw_obs.reshape(raw_obs.shape[0], -1).astype(np.float64)
        if normalise_obs:
            x = np.clip((x - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -OBS_CLIP, OBS_CLIP)
        return x.astype(np.float32)

    agent = Agent(obs_dim, act_dim, discrete)
    optimizer = torch.optim.Adam(agent.parameters(), lr=LEARNING_RATE, eps=1e-5)
    obs_rms = RunningMeanStd((obs_dim,))
    return_rms = RunningMeanStd(())
    discounted_return = np.zeros(NUM_ENVS)

    # Rollout storage. Step t holds the transition from obs[t]; `valid` is False for the
    # NEXT_STEP reset steps (their action is ignored by the env and their reward is 0).
    T, N = NUM_STEPS, NUM_ENVS
    obs_buf = np.zeros((T + 1, N, obs_dim), np.float32)
    act_buf = np.zeros((T, N) if discrete else (T, N, act_dim), np.int64 if discrete else np.float32)
    logp_buf = np.zeros((T, N), np.float32)
    rew_buf = np.zeros((T, N), np.float32)
    term_buf = np.zeros((T, N), np.float32)
    done_buf = np.zeros((T, N), np.float32)
    valid_buf = np.zeros((T, N), bool)

    raw_obs, _ = envs.reset(seed=SEED)
    if normalise_obs:
        obs_rms.update(raw_obs.reshape(N, -1))
    prev_done = np.zeros(N, bool)
    episode_return = np.zeros(N)
    recent_returns = []
    env_steps = 0
    updates = 0
    start = time.time()
    deadline = start + TIME_BUDGET

    while time.time() < deadline:
        progress = min(1.0, (time.time() - start) / TIME_BUDGET)
        if ANNEAL_LR:
            optimizer.param_groups[0]["lr"] = LEARNING_RATE * max(1.0 - progress, 0.02)

        # ---- rollout
        obs_buf[0] = features(raw_obs, obs_rms)
        for t in range(T):
            with torch.no_grad():
                dist = agent.distribution(torch.from_numpy(obs_buf[t]))
                action = dist.sample()
                logp = dist.log_prob(action) if discrete else dist.log_prob(action).sum(-1)
            act = action.numpy()
            env_action = act if discrete else np.clip(act, act_space.low, act_space.high)
            raw_obs, reward, terminated, truncated, _ = envs.step(env_action)
            done = np.logical_or(terminated, truncated)
            act_buf[t], logp_buf[t] = act, logp.numpy()
            valid_buf[t] = ~prev_done
            term_buf[t], done_buf[t] = terminated, done
            env_steps += int((~prev_done).sum())

            episode_return += reward
            for i in np.nonzero(done)[0]:
                recent_returns.append(episode_return[i])
            episode_return[done] = 0.0
            if NORM_REWARD:
                discounted_return = discounted_return * GAMMA * (~prev_done) + reward
                return_rms.update(discounted_return[~prev_done])
                reward = np.clip(reward / np.sqrt(return_rms.var + 1e-8), -REWARD_CLIP, REWARD_CLIP)
            rew_buf[t] = reward
            prev_done = done
            if normalise_obs:
                obs_rms.update(raw_obs.reshape(N, -1))
            obs_buf[t + 1] = features(raw_obs, obs_rms)

        # ---- advantages (GAE); truncated episodes bootstrap from their final observation
        with torch.no_grad():
            values = agent.value(torch.from_numpy(obs_buf.reshape((T + 1) * N, obs_dim))).numpy().reshape(T + 1, N)
        advantages = np.zeros((T, N), np.float32)
        last = np.zeros(N, np.float32)
        for t in reversed(range(T)):
            delta = rew_buf[t] + GAMMA * values[t + 1] * (1.0 - term_buf[t]) - values[t]
            last = delta + GAMMA * GAE_LAMBDA * (1.0 - done_buf[t]) * last
            advantages[t] = last
        returns = advantages + values[:T]

        # ---- PPO update on the valid transitions
        idx = np.flatnonzero(valid_buf.reshape(-1))
        b_obs = torch.from_numpy(obs_buf[:T].reshape(T * N, obs_dim)[idx])
        b_act = torch.from_numpy(act_buf.reshape((T * N,) + act_buf.shape[2:])[idx])
        b_logp = torch.from_numpy(logp_buf.reshape(-1)[idx])
        b_adv = torch.from_numpy(advantages.reshape(-1)[idx])
        b_ret = torch.from_numpy(returns.reshape(-1)[idx])
        b_val = torch.from_numpy(values[:T].reshape(-1)[idx])
        batch = len(idx)
        minibatch = max(1, batch // NUM_MINIBATCHES)
        ent_coef = ENT_COEF * (1.0 - progress)
        stop = False
        for _ in range(UPDATE_EPOCHS):
            perm = torch.randperm(batch)
            for s in range(0, batch - minibatch + 1, minibatch):
                mb = perm[s:s + minibatch]
                dist = agent.distribution(b_obs[mb])
                new_logp = dist.log_prob(b_act[mb]) if discrete else dist.log_prob(b_act[mb]).sum(-1)
                entropy = dist.entropy() if discrete else dist.entropy().sum(-1)
                log_ratio = new_logp - b_logp[mb]
                ratio = log_ratio.exp()
                adv = b_adv[mb]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - CLIP_COEF, 1 + CLIP_COEF)).mean()
                new_value = agent.value(b_obs[mb])
                if CLIP_VLOSS:
                    clipped = b_val[mb] + (new_value - b_val[mb]).clamp(-CLIP_COEF, CLIP_COEF)
                    v_loss = 0.5 * torch.max((new_value - b_ret[mb]) ** 2, (clipped - b_ret[mb]) ** 2).mean()
                else:
                    v_loss = 0.5 * ((new_value - b_ret[mb]) ** 2).mean()
                loss = pg_loss - ent_coef * entropy.mean() + VF_COEF * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), MAX_GRAD_NORM)
                optimizer.step()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean().item()
                if TARGET_KL and approx_kl > TARGET_KL:
                    stop = True
                    break
            if stop or time.time() >= deadline:
                break
        updates += 1
        elapsed = time.time() - start
        last_return = float(np.mean(recent_returns[-20:])) if recent_returns else float("nan")
        print(
            f"update {updates} steps {env_steps} sps {env_steps / elapsed:.0f} "
            f"return(last 20 episodes) {last_return:.2f} kl {approx_kl:.4f} time {elapsed:.0f}s",
            flush=True,
        )

    training_seconds = time.time() - start
    envs.close()

    # ---- export: normalisation baked in, deterministic actions
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    policy = ExportedPolicy(
        agent.actor, obs_rms.mean if normalise_obs else np.zeros(obs_dim),
        obs_rms.var if normalise_obs else np.ones(obs_dim) - 1e-8, OBS_CLIP, num_obs_categories, discrete,
    )
    policy.eval()
    with warnings.catch_warnings():  # TorchScript is deprecated upstream but is the artifact format
        warnings.simplefilter("ignore", DeprecationWarning)
        # Traced, not scripted: tracing needs no source file, so the export cannot break if
        # train.py changes on disk while it runs.
        example = torch.as_tensor(np.stack([obs_space.sample() for _ in range(2)]), dtype=torch.float32)
        torch.jit.save(torch.jit.trace(policy, example), str(OUTPUT_DIR / "policy.pt"))

    print("---")
    print(f"env_id: {ENV_ID}")
    print(f"backend: {type(envs.unwrapped if hasattr(envs, 'unwrapped') else envs).__name__}")
    print(f"env_steps: {env_steps}")
    print(f"sps: {env_steps / training_seconds:.0f}")
    print(f"training_seconds: {training_seconds:.1f}")
    print(f"updates: {updates}")
    print(f"episode_return: {float(np.mean(recent_returns[-20:])) if recent_returns else float('nan'):.2f}")
    print(f"episodes: {len(recent_returns)}")


if __name__ == "__main__":
    main()
