"""Single-file PPO for the autorl experiment, in the spirit of CleanRL's ppo_continuous_action.py
(host path) and PureJaxRL (end-to-end path), with a fixed wall-clock budget.

Trains ENV_ID for TIME_BUDGET seconds and exports $AUTORL_OUTPUT_DIR/policy.pt: a TorchScript module
with observation normalisation baked in that maps an observation batch to deterministic actions.
The score is NOT computed here: the daemon evaluates the artifact with the fixed harness.

Two paths, one algorithm, one artifact. The backend is what evaluate.make_vec_env(backend="auto")
would train on (envs_fast.choose_backend: the fastest *verified* backend), then:
- jax-e2e: a functional JAX backend (a verified translation envs_fast/<slug>.py, or gymnax) is
  trained end to end under jit, PureJaxRL's shape: one compiled call runs the rollout (lax.scan over
  JAX_NUM_STEPS steps of JAX_NUM_ENVS vmapped envs, autoreset and time limit included), GAE and
  the PPO epochs (optax); the host only decides when to stop. The networks are the torch Agent's,
  copied to JAX at the start and back at the end, so the export is the same as the host path's.
- host: anything else (envpool, gymnasium; e.g. BipedalWalker-v3) is stepped from a torch loop,
  the networks on DEVICE.

What makes it a strong start rather than a textbook one:
- observation normalisation and reward scaling by running statistics;
- gymnasium's NEXT_STEP autoreset handled exactly: time-limit truncations bootstrap from the
  final observation instead of being treated as deaths, and the reset steps are masked out;
- learning rate and entropy annealed over the *time* budget (on the jax-e2e path, over the time
  left after compiling), not a step count;
- state-independent log-std, orthogonal init, separate actor and critic;
- the budget counts JAX compilation, and no update is launched that would overrun it.
"""
import os
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root
import evaluate  # noqa: E402  (the fixed harness: constants and env factories)

# >>> hyperparameters
NUM_ENVS = 32  # parallel environments (host path)
NUM_STEPS = 256  # steps per env per rollout (host path)
LEARNING_RATE = 3e-4  # Adam, annealed linearly to 0 over the time budget (host path)
ANNEAL_LR = True
GAMMA = 0.99  # discount
GAE_LAMBDA = 0.95  # GAE lambda
UPDATE_EPOCHS = 10  # passes over each rollout (host path)
NUM_MINIBATCHES = 32  # minibatches per epoch (host path)
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
DEVICE = "auto"  # torch device of the host path: "auto" (cuda when available), "cuda" or "cpu"
BACKEND = "auto"  # evaluate.make_vec_env backend ("auto": the fastest verified one)
JAX_NUM_ENVS = 32  # parallel environments (jax-e2e path)
JAX_NUM_STEPS = 64  # steps per env per rollout (jax-e2e path)
JAX_LEARNING_RATE = 2e-3  # Adam, annealed like LEARNING_RATE (jax-e2e path)
JAX_UPDATE_EPOCHS = 2  # passes over each rollout (jax-e2e path)
JAX_NUM_MINIBATCHES = 16  # minibatches per epoch (jax-e2e path)
# <<< hyperparameters

ENV_ID = evaluate.ENV_ID
TIME_BUDGET = evaluate.TIME_BUDGET
SEED = int(os.environ.get("AUTORL_SEED", 1))
OUTPUT_DIR = Path(os.environ.get("AUTORL_OUTPUT_DIR", "out"))
HOST_SPECS = ("envpool", "gymnasium", "reference")  # vector backends: stepped from the torch loop


# ---------------------------------------------------------------- the networks (shared by both paths)
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Tanh MLPs (the JAX path's `mlp` computes the same function from the same Linear layers)."""

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


class Problem:
    """What both paths need to know about the env: spaces and the network's input/output sizes."""

    def __init__(self, env_id):
        env = evaluate.make_env(env_id)
        self.obs_space, self.act_space = env.observation_space, env.action_space
        env.close()
        self.discrete = hasattr(self.act_space, "n")
        self.num_obs_categories = int(self.obs_space.n) if hasattr(self.obs_space, "n") else 0
        self.obs_dim = self.num_obs_categories or int(np.prod(self.obs_space.shape))
        self.act_dim = int(self.act_space.n) if self.discrete else int(np.prod(self.act_space.shape))
        self.normalise_obs = NORM_OBS and self.num_obs_categories == 0


def choose_backend():
    """(spec, why): the backend make_vec_env(backend=BACKEND) trains on, and why."""
    if BACKEND != "auto":
        return BACKEND, "BACKEND is set in train.py"
    try:
        import envs_fast
    except ImportError:  # a checkout without envs_fast: what the harness would do
        return evaluate._auto_backend(ENV_ID, NUM_ENVS), "envs_fast is not importable"
    return envs_fast.choose_backend(ENV_ID, NUM_ENVS), "envs_fast.choose_backend: the fastest verified backend"


def is_jax_functional(spec):
    """True for a JAX translation file or gymnax (trained end to end); False for host backends
    (a Rust translation `.rs` is a native vector env: the torch loop steps it)."""
    return spec not in HOST_SPECS and not str(spec).endswith(".rs")


# ---------------------------------------------------------------- host path: torch loop over a VectorEnv
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


def torch_device():
    if DEVICE == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(DEVICE)


def train_host(spec, problem, agent):
    """PPO from a torch loop over evaluate.make_vec_env. Returns the figures and the obs statistics."""
    p = problem
    device = torch_device()
    agent.to(device)
    print(f"host path: torch on {device}", flush=True)
    envs = evaluate.make_vec_env(ENV_ID, NUM_ENVS, SEED, backend=spec)
    act_space = envs.single_action_space

    def features(raw_obs, obs_rms):
        """Network input from a raw observation batch (the same transform the export bakes in)."""
        if p.num_obs_categories:
            return np.eye(p.num_obs_categories, dtype=np.float32)[raw_obs.astype(np.int64)]
        x = raw_obs.reshape(raw_obs.shape[0], -1).astype(np.float64)
        if p.normalise_obs:
            x = np.clip((x - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -OBS_CLIP, OBS_CLIP)
        return x.astype(np.float32)

    optimizer = torch.optim.Adam(agent.parameters(), lr=LEARNING_RATE, eps=1e-5)
    obs_rms = RunningMeanStd((p.obs_dim,))
    return_rms = RunningMeanStd(())
    discounted_return = np.zeros(NUM_ENVS)

    # Rollout storage. Step t holds the transition from obs[t]; `valid` is False for the
    # NEXT_STEP reset steps (their action is ignored by the env and their reward is 0).
    T, N, discrete = NUM_STEPS, NUM_ENVS, p.discrete
    obs_buf = np.zeros((T + 1, N, p.obs_dim), np.float32)
    act_buf = np.zeros((T, N) if discrete else (T, N, p.act_dim), np.int64 if discrete else np.float32)
    logp_buf = np.zeros((T, N), np.float32)
    rew_buf = np.zeros((T, N), np.float32)
    term_buf = np.zeros((T, N), np.float32)
    done_buf = np.zeros((T, N), np.float32)
    valid_buf = np.zeros((T, N), bool)

    raw_obs, _ = envs.reset(seed=SEED)
    if p.normalise_obs:
        obs_rms.update(raw_obs.reshape(N, -1))
    prev_done = np.zeros(N, bool)
    episode_return = np.zeros(N)
    recent_returns = []
    env_steps = 0
    updates = 0
    approx_kl = 0.0
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
                dist = agent.distribution(torch.from_numpy(obs_buf[t]).to(device))
                action = dist.sample()
                logp = dist.log_prob(action) if discrete else dist.log_prob(action).sum(-1)
            act = action.cpu().numpy()
            env_action = act if discrete else np.clip(act, act_space.low, act_space.high)
            raw_obs, reward, terminated, truncated, _ = envs.step(env_action)
            done = np.logical_or(terminated, truncated)
            act_buf[t], logp_buf[t] = act, logp.cpu().numpy()
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
            if p.normalise_obs:
                obs_rms.update(raw_obs.reshape(N, -1))
            obs_buf[t + 1] = features(raw_obs, obs_rms)

        # ---- advantages (GAE); truncated episodes bootstrap from their final observation
        with torch.no_grad():
            all_obs = torch.from_numpy(obs_buf.reshape((T + 1) * N, p.obs_dim)).to(device)
            values = agent.value(all_obs).cpu().numpy().reshape(T + 1, N)
        advantages = np.zeros((T, N), np.float32)
        last = np.zeros(N, np.float32)
        for t in reversed(range(T)):
            delta = rew_buf[t] + GAMMA * values[t + 1] * (1.0 - term_buf[t]) - values[t]
            last = delta + GAMMA * GAE_LAMBDA * (1.0 - done_buf[t]) * last
            advantages[t] = last
        returns = advantages + values[:T]

        # ---- PPO update on the valid transitions
        idx = np.flatnonzero(valid_buf.reshape(-1))
        on_device = lambda array: torch.from_numpy(array).to(device)
        b_obs = on_device(obs_buf[:T].reshape(T * N, p.obs_dim)[idx])
        b_act = on_device(act_buf.reshape((T * N,) + act_buf.shape[2:])[idx])
        b_logp = on_device(logp_buf.reshape(-1)[idx])
        b_adv = on_device(advantages.reshape(-1)[idx])
        b_ret = on_device(returns.reshape(-1)[idx])
        b_val = on_device(values[:T].reshape(-1)[idx])
        batch = len(idx)
        minibatch = max(1, batch // NUM_MINIBATCHES)
        ent_coef = ENT_COEF * (1.0 - progress)
        stop = False
        for _ in range(UPDATE_EPOCHS):
            perm = torch.randperm(batch, device=device)
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
    agent.cpu()
    obs_mean = obs_rms.mean if p.normalise_obs else np.zeros(p.obs_dim)
    obs_var = obs_rms.var if p.normalise_obs else np.ones(p.obs_dim) - 1e-8
    return {
        "figures": {"device": str(device), "env_steps": env_steps, "training_seconds": training_seconds,
                    "updates": updates, "episode_return": float(np.mean(recent_returns[-20:])) if recent_returns
                    else float("nan"), "episodes": len(recent_returns)},
        "obs_mean": obs_mean, "obs_var": obs_var,
    }


# ---------------------------------------------------------------- jax-e2e path: the whole loop compiled
def make_jax_training(spec, problem, agent):
    """PPO for a functional JAX backend, PureJaxRL's shape. Returns a namespace:
      state                      the initial training state (a pytree: weights, optimiser, envs, statistics)
      update(state, lr, ent)     one PPO iteration, pure: rollout (lax.scan over JAX_NUM_STEPS steps of
                                 JAX_NUM_ENVS vmapped envs), GAE, JAX_UPDATE_EPOCHS epochs; -> (state, metrics)
      env_step(key, ...)         the envs one step on (autoreset, time limit): what `update` calls
      act(state, raw_obs)        the trained policy: raw observations -> deterministic actions
      to_torch(state, agent)     copies the weights into the torch Agent, returns (obs_mean, obs_var)
    The weights start as `agent`'s (so both paths initialise alike) and go back into it for the export."""
    import jax
    import jax.flatten_util
    import jax.numpy as jnp
    import jax.scipy.special
    import optax

    from envs_fast.backend import load_functional
    from envs_fast.vector import derive_keys, max_episode_steps

    p = problem
    backend = load_functional(spec, ENV_ID)
    time_limit = max_episode_steps(ENV_ID) or evaluate.MAX_EPISODE_STEPS
    N, T, E, M = JAX_NUM_ENVS, JAX_NUM_STEPS, JAX_UPDATE_EPOCHS, JAX_NUM_MINIBATCHES
    minibatch = (T * N) // M

    # ---- networks: the Agent's Linear layers as (W, b) pairs, log-std for Box actions, all in one
    # flat vector (the optimiser then runs a few kernels, not a few per layer: shorter compilation)
    def linears(sequential):
        return [(m.weight.detach().cpu().numpy().T, m.bias.detach().cpu().numpy())
                for m in sequential if isinstance(m, nn.Linear)]

    params = {"actor": linears(agent.actor), "critic": linears(agent.critic)}
    if not p.discrete:
        params["log_std"] = agent.actor_logstd.detach().cpu().numpy().reshape(-1)
    flat_params, unravel = jax.flatten_util.ravel_pytree(params)

    def mlp(layers, x):  # the Agent's Sequential: Linear, Tanh, Linear, Tanh, Linear
        for w, b in layers[:-1]:
            x = jnp.tanh(x @ w + b)
        w, b = layers[-1]
        return x @ w + b

    def value(flat, x):
        return mlp(unravel(flat)["critic"], x)[..., 0]

    def log_prob_entropy(flat, x, action):
        params = unravel(flat)
        out = mlp(params["actor"], x)
        if p.discrete:
            logits = jax.nn.log_softmax(out)
            logp = jnp.take_along_axis(logits, action[..., None], axis=-1)[..., 0]
            return logp, -(jnp.exp(logits) * logits).sum(-1)
        log_std = params["log_std"]
        z = (action - out) / jnp.exp(log_std)
        logp = (-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)
        return logp, jnp.broadcast_to((log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e)).sum(), logp.shape)

    def sample(flat, x, noise):
        """An action from the policy, given uniform(0, 1) noise drawn for it beforehand."""
        params = unravel(flat)
        out = mlp(params["actor"], x)
        if p.discrete:  # Gumbel-max: argmax(logits + Gumbel noise) is a categorical sample
            action = jnp.argmax(out - jnp.log(-jnp.log(noise)), axis=-1)
        else:
            action = out + jnp.exp(params["log_std"]) * jax.scipy.special.ndtri(noise)
        return action, log_prob_entropy(flat, x, action)[0]

    # ---- running statistics (mean, var, count), as RunningMeanStd, over the rows where mask is set
    def rms_init(shape):
        return (np.zeros(shape, np.float32), np.ones(shape, np.float32), np.float32(1e-4))

    def rms_update(rms, x, mask):
        mean, var, count = rms
        w = mask.astype(jnp.float32).reshape((-1,) + (1,) * (x.ndim - 1))
        n = w.sum()
        batch_mean = (w * x).sum(0) / jnp.maximum(n, 1.0)
        batch_var = (w * (x - batch_mean) ** 2).sum(0) / jnp.maximum(n, 1.0)
        total = count + n
        delta = batch_mean - mean
        new_mean = mean + delta * n / total
        new_var = (var * count + batch_var * n + delta**2 * count * n / total) / total
        return (new_mean, new_var, total)

    def features(raw_obs, obs_rms):
        """Network input from a raw observation batch (the same transform the export bakes in)."""
        if p.num_obs_categories:
            return jax.nn.one_hot(raw_obs.reshape(-1).astype(jnp.int32), p.num_obs_categories)
        x = raw_obs.reshape(raw_obs.shape[0], -1).astype(jnp.float32)
        if p.normalise_obs:
            x = jnp.clip((x - obs_rms[0]) / jnp.sqrt(obs_rms[1] + 1e-8), -OBS_CLIP, OBS_CLIP)
        return x

    if p.discrete:
        to_env = lambda action: action.astype(jnp.int32)
    else:
        low = jnp.asarray(p.act_space.low, jnp.float32).reshape(-1)
        high = jnp.asarray(p.act_space.high, jnp.float32).reshape(-1)
        to_env = lambda action: jnp.clip(action, low, high).reshape((N,) + p.act_space.shape)

    # ---- the envs
    def env_step(key, env_state, elapsed, needs_reset, action):
        """The N envs one step on, with gymnasium's NEXT_STEP autoreset and the registered time limit,
        as envs_fast/vector.py's adapter does: an env whose previous step ended its episode is reset
        instead (reward 0, flags False). When any env is due, resets are drawn for all of them at
        once: a single call site of the backend's reset (each jax.random call site costs compile time)."""
        obs, stepped, reward, terminated = jax.vmap(backend.step)(derive_keys(key, N), env_state, action)

        def reset(_):
            fresh = jax.vmap(backend.reset)(derive_keys(key ^ jnp.uint32(0x5BD1E995), N))
            pick = lambda new, old: jnp.where(needs_reset.reshape((N,) + (1,) * (old.ndim - 1)),
                                              new.astype(old.dtype), old)
            return jax.tree_util.tree_map(pick, fresh, (obs, stepped))

        obs, stepped = jax.lax.cond(needs_reset.any(), reset, lambda _: (obs, stepped), None)
        elapsed = jnp.where(needs_reset, 0, elapsed + 1)
        terminated = jnp.asarray(terminated, bool).reshape(N) & ~needs_reset
        truncated = (elapsed >= time_limit) & ~needs_reset
        reward = jnp.where(needs_reset, 0.0, jnp.asarray(reward, jnp.float32).reshape(N))
        return obs, stepped, reward, terminated, truncated, elapsed, terminated | truncated

    # ---- the training state (built on the host: nothing to compile). Every env starts flagged
    # `needs_reset`, so the first step resets them all, as an autoreset env does.
    tx = optax.chain(optax.clip_by_global_norm(MAX_GRAD_NORM), optax.scale_by_adam(eps=1e-5))
    obs_shape, env_shape = jax.eval_shape(jax.vmap(backend.reset), jax.ShapeDtypeStruct((N, 2), jnp.uint32))
    zeros = lambda tree: jax.tree_util.tree_map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), tree)
    state = {
        "params": flat_params, "opt": tx.init(flat_params), "key": np.array([0, SEED], np.uint32),
        "raw_obs": zeros(obs_shape), "env": zeros(env_shape), "elapsed": np.zeros(N, np.int32),
        "needs_reset": np.ones(N, bool),  # the previous step ended the episode: this one resets
        "obs_rms": rms_init((p.obs_dim,)), "ret_rms": rms_init(()), "discounted_return": np.zeros(N, np.float32),
        "episode_return": np.zeros(N, np.float32),
    }

    def rollout_step(s, noise_and_key):
        noise, env_key = noise_and_key
        x = features(s["raw_obs"], s["obs_rms"])
        action, logp = sample(s["params"], x, noise)
        raw_obs, env_state, reward, terminated, _, elapsed, done = env_step(
            env_key, s["env"], s["elapsed"], s["needs_reset"], to_env(action))
        valid = ~s["needs_reset"]  # a reset step's action is ignored and its reward is 0
        episode_return = s["episode_return"] + reward
        finished = (jnp.where(done, episode_return, 0.0).sum(), done.sum())
        ret_rms, discounted_return = s["ret_rms"], s["discounted_return"]
        if NORM_REWARD:
            discounted_return = discounted_return * GAMMA * valid + reward
            ret_rms = rms_update(ret_rms, discounted_return, valid)
            reward = jnp.clip(reward / jnp.sqrt(ret_rms[1] + 1e-8), -REWARD_CLIP, REWARD_CLIP)
        obs_rms = s["obs_rms"]
        if p.normalise_obs:
            obs_rms = rms_update(obs_rms, raw_obs.reshape(N, -1).astype(jnp.float32), jnp.ones(N, bool))
        s = dict(s, env=env_state, raw_obs=raw_obs, elapsed=elapsed, needs_reset=done, obs_rms=obs_rms,
                 ret_rms=ret_rms, discounted_return=discounted_return,
                 episode_return=jnp.where(done, 0.0, episode_return))
        transition = {"x": x, "action": action, "logp": logp, "reward": reward,
                      "terminated": terminated.astype(jnp.float32), "done": done.astype(jnp.float32),
                      "valid": valid}
        return s, (transition, finished)

    def loss_fn(flat, mb, ent_coef):
        w = mb["valid"].astype(jnp.float32)  # reset steps carry no learning signal
        n = jnp.maximum(w.sum(), 1.0)
        mean = lambda v: (w * v).sum() / n
        new_logp, entropy = log_prob_entropy(flat, mb["x"], mb["action"])
        log_ratio = new_logp - mb["logp"]
        ratio = jnp.exp(log_ratio)
        adv = mb["advantage"]
        adv_mean = mean(adv)
        adv_std = jnp.sqrt((w * (adv - adv_mean) ** 2).sum() / jnp.maximum(n - 1.0, 1.0))
        adv = (adv - adv_mean) / (adv_std + 1e-8)
        pg_loss = mean(jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1 - CLIP_COEF, 1 + CLIP_COEF)))
        new_value = value(flat, mb["x"])
        if CLIP_VLOSS:
            clipped = mb["value"] + jnp.clip(new_value - mb["value"], -CLIP_COEF, CLIP_COEF)
            v_loss = 0.5 * mean(jnp.maximum((new_value - mb["return"]) ** 2, (clipped - mb["return"]) ** 2))
        else:
            v_loss = 0.5 * mean((new_value - mb["return"]) ** 2)
        loss = pg_loss - ent_coef * mean(entropy) + VF_COEF * v_loss
        return loss, mean((ratio - 1) - log_ratio)

    def update(s, lr, ent_coef):
        # The iteration's random numbers in one draw (each jax.random call site costs compile time):
        # uniform noise in (0, 1) for the actions (23 bits + 1/2: exact in float32, never 0 or 1) and
        # sort keys for the minibatch permutations
        key, env_key, next_key = derive_keys(s["key"], 3)
        bits = jax.random.bits(key, (T * N * p.act_dim + E * T * N,))
        noise = ((bits[: T * N * p.act_dim] >> 9).astype(jnp.float32) + 0.5).reshape(T, N, p.act_dim) / 2.0**23
        orders = jnp.argsort(bits[T * N * p.act_dim:].reshape(E, T * N), axis=-1)[:, : M * minibatch]

        s, (traj, finished) = jax.lax.scan(rollout_step, s, (noise, derive_keys(env_key, T)))

        # GAE; truncated episodes bootstrap from their final observation (the NEXT_STEP reset step
        # after it holds that observation, and is itself masked out of the loss)
        values = value(s["params"], traj["x"])
        last_value = value(s["params"], features(s["raw_obs"], s["obs_rms"]))
        next_values = jnp.concatenate([values[1:], last_value[None]])

        def gae_step(last, t):
            delta = t["reward"] + GAMMA * t["next_value"] * (1.0 - t["terminated"]) - t["value"]
            last = delta + GAMMA * GAE_LAMBDA * (1.0 - t["done"]) * last
            return last, last

        _, advantages = jax.lax.scan(gae_step, jnp.zeros(N), dict(traj, value=values, next_value=next_values),
                                     reverse=True)
        batch = dict(traj, advantage=advantages, value=values, **{"return": advantages + values})
        batch = jax.tree_util.tree_map(lambda v: v.reshape((T * N,) + v.shape[2:]), batch)

        def minibatch_step(carry, mb):
            flat, opt, stopped = carry
            (_, approx_kl), grads = jax.value_and_grad(loss_fn, has_aux=True)(flat, mb, ent_coef)
            step, new_opt = tx.update(grads, opt, flat)
            new_flat = flat - lr * step
            if TARGET_KL:  # past the target KL, the rest of the iteration's steps are skipped
                keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(stopped, b, a), new, old)
                new_flat, new_opt = keep(new_flat, flat), keep(new_opt, opt)
                stopped = stopped | (approx_kl > TARGET_KL)
            return (new_flat, new_opt, stopped), approx_kl

        def epoch(carry, order):
            mbs = jax.tree_util.tree_map(lambda v: v[order].reshape((M, minibatch) + v.shape[1:]), batch)
            return jax.lax.scan(minibatch_step, carry, mbs)

        (flat, opt, _), kls = jax.lax.scan(epoch, (s["params"], s["opt"], jnp.bool_(False)), orders)
        s = dict(s, params=flat, opt=opt, key=next_key)
        metrics = {"env_steps": traj["valid"].sum(), "return_sum": finished[0].sum(),
                   "episodes": finished[1].sum(), "kl": kls[-1, -1]}
        return s, metrics

    def act(s, raw_obs):
        out = mlp(unravel(s["params"])["actor"], features(raw_obs, s["obs_rms"]))
        return jnp.argmax(out, -1) if p.discrete else out

    def to_torch(s, agent):
        params = jax.device_get(unravel(s["params"]))
        with torch.no_grad():
            for sequential, layers in ((agent.actor, params["actor"]), (agent.critic, params["critic"])):
                for module, (w, b) in zip([m for m in sequential if isinstance(m, nn.Linear)], layers):
                    module.weight.copy_(torch.from_numpy(np.array(w).T))
                    module.bias.copy_(torch.from_numpy(np.array(b)))
            if not p.discrete:
                agent.actor_logstd.copy_(torch.from_numpy(np.array(params["log_std"])).reshape(1, -1))
        if not p.normalise_obs:
            return np.zeros(p.obs_dim), np.ones(p.obs_dim) - 1e-8
        mean, var, _ = jax.device_get(s["obs_rms"])
        return np.asarray(mean, np.float64), np.asarray(var, np.float64)

    return SimpleNamespace(state=state, update=update, env_step=env_step, act=act, to_torch=to_torch,
                           num_envs=N, num_steps=T)


def train_jax(spec, problem, agent):
    """Compiles `update` once (the budget counts it), then calls it until the next call would
    overrun the budget; the host only times the calls. Returns figures, obs statistics and the
    final state and training (for checking the export against the policy in JAX)."""
    import jax
    import jax.numpy as jnp

    device = jax.devices()[0]
    print(f"jax-e2e path: jax on {device.platform} ({device})", flush=True)
    start = time.time()  # the budget counts building and compiling from here
    deadline = start + TIME_BUDGET
    training = make_jax_training(spec, problem, agent)
    state = training.state
    lr_at = lambda progress: jnp.float32(JAX_LEARNING_RATE * (max(1.0 - progress, 0.02) if ANNEAL_LR else 1.0))
    ent_at = lambda progress: jnp.float32(ENT_COEF * (1.0 - progress))
    update = jax.jit(training.update, donate_argnums=0).lower(state, lr_at(0.0), ent_at(0.0)).compile()
    train_start = time.time()
    compile_seconds = train_start - start
    print(f"compiled the update in {compile_seconds:.1f}s", flush=True)

    env_steps, updates, update_seconds, last_print = 0, 0, 0.0, 0.0
    episode_log = []  # (sum of returns, episodes) per update
    while True:
        now = time.time()
        if now >= deadline or now + update_seconds > deadline:
            break
        progress = min(1.0, (now - train_start) / max(deadline - train_start, 1e-9))  # over the time left
        state, metrics = update(state, lr_at(progress), ent_at(progress))
        metrics = jax.device_get(metrics)  # waits for the update: the timing is real
        update_seconds = max(time.time() - now, 0.9 * update_seconds)  # a slow call raises the estimate
        env_steps += int(metrics["env_steps"])
        updates += 1
        episode_log.append((float(metrics["return_sum"]), int(metrics["episodes"])))
        elapsed = time.time() - start
        if elapsed - last_print >= 1.0:
            last_print = elapsed
            print(f"update {updates} steps {env_steps} sps {env_steps / elapsed:.0f} "
                  f"return(last 20 episodes) {recent_mean(episode_log):.2f} kl {float(metrics['kl']):.4f} "
                  f"time {elapsed:.1f}s", flush=True)
    training_seconds = time.time() - start

    obs_mean, obs_var = training.to_torch(state, agent)  # the export is the host path's
    return {
        "figures": {"device": device.platform, "env_steps": env_steps, "training_seconds": training_seconds,
                    "compile_seconds": compile_seconds, "updates": updates,
                    "episode_return": recent_mean(episode_log), "episodes": sum(n for _, n in episode_log)},
        "obs_mean": obs_mean, "obs_var": obs_var, "state": state, "training": training,
    }


def recent_mean(episode_log, episodes=20):
    """Mean return of (about) the last `episodes` episodes from per-update (sum, count) pairs."""
    total, count = 0.0, 0
    for return_sum, n in reversed(episode_log):
        total, count = total + return_sum, count + n
        if count >= episodes:
            break
    return total / count if count else float("nan")


# ---------------------------------------------------------------- export and summary
def export(problem, agent, obs_mean, obs_var, path):
    """TorchScript: normalisation baked in, deterministic actions."""
    p = problem
    policy = ExportedPolicy(agent.actor, obs_mean, obs_var, OBS_CLIP, p.num_obs_categories, p.discrete)
    policy.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # TorchScript is deprecated upstream but is the artifact format
        warnings.simplefilter("ignore", DeprecationWarning)
        # Traced, not scripted: tracing needs no source file, so the export cannot break if
        # train.py changes on disk while it runs.
        example = torch.as_tensor(np.stack([p.obs_space.sample() for _ in range(2)]), dtype=torch.float32)
        torch.jit.save(torch.jit.trace(policy, example), str(path))


def main():
    torch.set_num_threads(TORCH_THREADS)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    problem = Problem(ENV_ID)
    spec, why = choose_backend()
    path = "jax-e2e" if is_jax_functional(spec) else "host"
    print(f"backend {spec} ({why}) -> path {path}", flush=True)
    agent = Agent(problem.obs_dim, problem.act_dim, problem.discrete)
    trained = (train_jax if path == "jax-e2e" else train_host)(spec, problem, agent)
    export(problem, agent, trained["obs_mean"], trained["obs_var"], OUTPUT_DIR / "policy.pt")

    figures = trained["figures"]
    print("---")
    print(f"env_id: {ENV_ID}")
    print(f"backend: {spec}")
    print(f"path: {path}")
    print(f"device: {figures['device']}")
    print(f"env_steps: {figures['env_steps']}")
    print(f"sps: {figures['env_steps'] / figures['training_seconds']:.0f}")
    print(f"training_seconds: {figures['training_seconds']:.1f}")
    if "compile_seconds" in figures:
        print(f"compile_seconds: {figures['compile_seconds']:.1f}")
    print(f"updates: {figures['updates']}")
    print(f"episode_return: {figures['episode_return']:.2f}")
    print(f"episodes: {figures['episodes']}")


if __name__ == "__main__":
    main()
