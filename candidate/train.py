"""PPO for the autorl experiment: one learner, in JAX, in the spirit of CleanRL's
ppo_continuous_action.py and PureJaxRL, under a fixed wall-clock budget.

Trains ENV_ID for TIME_BUDGET seconds and exports $AUTORL_OUTPUT_DIR/policy.pt, the harness's
TorchScript artifact, written by policy_export.py from `policy` below (normalisation included). The
daemon scores it; nothing here is the score. This file is the PPO: hyperparameters, networks,
rollouts, GAE, loss and update. The plumbing (the run's variables, the budget clock, the verified
backend's choice, the compilation cache, the curve line, the export check) is train_plumbing.py,
which no experiment may change.

One learner, fed two ways, by the backend train_plumbing.choose_backend picks (the fastest verified):
- jax-e2e: a functional JAX backend (envs_fast/translations/<slug>.py, gymnax) with END_TO_END: the rollout (a
  lax.scan over JAX_NUM_STEPS steps of JAX_NUM_ENVS vmapped envs) and `learn` are one compiled call.
- jax-host: any other backend (a Rust port envs_fast/translations/<slug>.rs, envpool, gymnasium), stepped from
  Python with one compiled policy call per step; `learn` takes each rollout of NUM_STEPS x NUM_ENVS.
The clock starts with the process (imports and compiling count); no iteration starts that would end
past the budget. What makes it strong: observation and reward normalisation; NEXT_STEP autoreset
handled exactly (truncations bootstrap, reset steps are masked); learning rate and entropy annealed
over the time budget; state-independent log-std, orthogonal init, separate actor and critic.
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root
import train_plumbing as plumbing  # noqa: E402  (fixed: read before the heavy imports, which the clock counts)
from train_plumbing import ENV_ID, OUTPUT_DIR, SEED, TIME_BUDGET  # noqa: E402

START = plumbing.process_start_time() if __name__ == "__main__" else time.time()  # the budget clock

import os  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import evaluate  # noqa: E402  (the fixed harness: env factories)
from envs_fast.backends.jax_vector import derive_keys  # noqa: E402  (counter-based keys: cheap to compile)
from policy_export import Unexportable, check_exportable, export_policy  # noqa: E402

# >>> hyperparameters
NUM_ENVS = 32  # parallel environments (jax-host path)
JAX_HOST_ENVS_FACTOR = 4  # NUM_ENVS x this from a budget of JAX_HOST_BIG_BATCH_BUDGET (jax-host path)
NUM_STEPS = 256  # steps per env per rollout (jax-host path)
LEARNING_RATE = 3e-4  # Adam, annealed linearly over the time budget (jax-host path)
UPDATE_EPOCHS = 10  # passes over each rollout (jax-host path)
NUM_MINIBATCHES = 32  # minibatches per epoch (jax-host path)
JAX_NUM_ENVS = 32  # parallel environments (jax-e2e path)
JAX_NUM_STEPS = 64  # steps per env per rollout (jax-e2e path)
JAX_LEARNING_RATE = 2e-3  # Adam, annealed like LEARNING_RATE (jax-e2e path)
JAX_UPDATE_EPOCHS = 2  # passes over each rollout (jax-e2e path)
JAX_NUM_MINIBATCHES = 16  # minibatches per epoch (jax-e2e path)
ANNEAL_LR = True
GAMMA = 0.99  # discount
GAE_LAMBDA = 0.95  # GAE lambda
CLIP_COEF = 0.2  # PPO ratio clip
CLIP_VLOSS = False  # clip the value loss too
ENT_COEF = 0.0  # entropy bonus, annealed to 0
VF_COEF = 0.5  # value loss weight
MAX_GRAD_NORM = 0.5  # gradient clipping
TARGET_KL = 0.0  # skip the rest of an update's minibatches past this KL (0 = never)
HIDDEN_SIZE = 64  # width of both MLPs
INIT_LOG_STD = 0.0  # initial log-std of the Gaussian policy (continuous actions)
NORM_OBS = True  # running observation normalisation (the export computes it too)
NORM_REWARD = True  # scale rewards by the running std of the discounted return
OBS_CLIP = 10.0  # clip normalised observations
REWARD_CLIP = 10.0  # clip scaled rewards
BACKEND = "auto"  # evaluate.make_vec_env backend ("auto": the fastest verified one)
END_TO_END = True  # a functional JAX backend trains end to end (False: stepped from the host as any other)
# <<< hyperparameters
# From this budget the jax-host path steps NUM_ENVS x JAX_HOST_ENVS_FACTOR envs: its compiled update costs
# little per sample, so a larger batch buys env steps where there is time for enough updates
# (BipedalWalker-v3 at 720 s: 128 envs scored 321 and 318, 32 envs 288 and 289; docs/results/throughput.md)
JAX_HOST_BIG_BATCH_BUDGET = 480.0

SCALARS = ("logp", "reward", "valid", "terminated", "done", "finished_return", "discounted_return")  # per step


# ---------------------------------------------------------------- the problem and the networks
class Problem:
    """The env's spaces and the networks' input and output sizes."""

    def __init__(self, env_id):
        env = evaluate.make_env(env_id)
        self.obs_space, self.act_space = env.observation_space, env.action_space
        env.close()
        self.discrete = hasattr(self.act_space, "n")
        self.num_obs_categories = int(self.obs_space.n) if hasattr(self.obs_space, "n") else 0
        self.obs_dim = self.num_obs_categories or int(np.prod(self.obs_space.shape))
        self.act_dim = int(self.act_space.n) if self.discrete else int(np.prod(self.act_space.shape))
        self.normalise_obs = NORM_OBS and self.num_obs_categories == 0


def init_params(p, rng):
    """Separate actor and critic tanh MLPs, orthogonal init (drawn in numpy: nothing to compile)."""
    def layer(fan_in, fan_out, scale):
        q, r = np.linalg.qr(rng.standard_normal((max(fan_in, fan_out), min(fan_in, fan_out))))
        q = q * np.sign(np.diag(r))  # a uniformly random orthogonal matrix
        w = q if fan_in >= fan_out else q.T
        return {"w": (scale * w).astype(np.float32), "b": np.zeros(fan_out, np.float32)}

    def mlp(out, last_scale):
        return [layer(p.obs_dim, HIDDEN_SIZE, np.sqrt(2)), layer(HIDDEN_SIZE, HIDDEN_SIZE, np.sqrt(2)),
                layer(HIDDEN_SIZE, out, last_scale)]

    params = {"actor": mlp(p.act_dim, 0.01), "critic": mlp(1, 1.0)}
    if not p.discrete:
        params["log_std"] = np.full(p.act_dim, INIT_LOG_STD, np.float32)
    return params


def mlp(layers, x):
    for layer in layers[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x @ layers[-1]["w"] + layers[-1]["b"]


def features(p, raw_obs, obs_rms):
    """Network input from a raw observation batch (the policy the export writes computes it too)."""
    if p.num_obs_categories:
        return jax.nn.one_hot(raw_obs.reshape(-1).astype(jnp.int32), p.num_obs_categories)
    x = raw_obs.reshape(raw_obs.shape[0], -1).astype(jnp.float32)
    if p.normalise_obs:
        x = jnp.clip((x - obs_rms[0]) / jnp.sqrt(obs_rms[1] + 1e-8), -OBS_CLIP, OBS_CLIP)
    return x


def log_prob_entropy(p, params, out, action):
    if p.discrete:
        logits = jax.nn.log_softmax(out)
        logp = (logits * jax.nn.one_hot(action, p.act_dim)).sum(-1)  # (a gather's gradient is a scatter)
        return logp, -(jnp.exp(logits) * logits).sum(-1)
    log_std = params["log_std"]
    z = (action - out) / jnp.exp(log_std)
    logp = (-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)
    return logp, jnp.broadcast_to((log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e)).sum(), logp.shape)


def sample(p, params, x, noise):
    """An action and its log-probability, given uniform(0, 1) noise drawn for it beforehand."""
    out = mlp(params["actor"], x)
    if p.discrete:  # Gumbel-max: argmax(logits + Gumbel noise) is a categorical sample
        action = jnp.argmax(out - jnp.log(-jnp.log(noise)), axis=-1)
    else:
        action = out + jnp.exp(params["log_std"]) * jax.scipy.special.ndtri(noise)
    return action, log_prob_entropy(p, params, out, action)[0]


def policy(p, params, obs_rms):
    """The trained policy as the harness runs it: raw observations -> deterministic actions."""
    def act(raw_obs):
        out = mlp(params["actor"], features(p, raw_obs, obs_rms))
        return jnp.argmax(out, -1) if p.discrete else out
    return act


# ---------------------------------------------------------------- the learner
def make_learner(p, params, N, T, E, M):
    """PPO's learning from rollouts of T steps of N envs: `learn(state, first_raw_obs, next_raw_obs,
    actions, scalars, key, lr, ent_coef) -> (learned fields, metrics)` updates the running statistics,
    computes GAE and runs E epochs of M minibatches, optax's Adam on one flat weight vector (fewer
    kernels to compile than one per layer; built in numpy, as the state: an eager jnp op compiles)."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    flat = np.concatenate([np.ravel(leaf) for leaf in leaves]).astype(np.float32)
    offsets = np.cumsum([0] + [np.size(leaf) for leaf in leaves])

    def unravel(flat):
        return treedef.unflatten([flat[a:b].reshape(np.shape(x)) for a, b, x in zip(offsets, offsets[1:], leaves)])

    minibatch = (T * N) // M
    tx = optax.chain(optax.clip_by_global_norm(MAX_GRAD_NORM), optax.scale_by_adam(eps=1e-5))
    check_stride = max(1, T // 16)  # raw observations kept from each rollout for export_check

    def rms_update(rms, x, w):
        """Running (mean, var, count) updated with the rows of x (weights w: 1 counts a row, 0 skips it).
        The count is a float32 pair (hi + lo, what rounding dropped from hi): past ~1e8 samples one
        float32 would round each rollout's increment."""
        mean, var, count_hi, count_lo = rms
        w = w.reshape((-1,) + (1,) * (x.ndim - 1))
        n = w.sum()
        delta = (w * (x - mean)).sum(0) / jnp.maximum(n, 1.0)  # the batch mean minus the running one
        batch_var = jnp.maximum((w * (x - mean) ** 2).sum(0) / jnp.maximum(n, 1.0) - delta**2, 0.0)
        share = n / (count_hi + count_lo + n)
        new_var = var * (1 - share) + batch_var * share + delta**2 * share * (1 - share)
        hi = count_hi + n
        rounded = hi - count_hi  # TwoSum: what of n the float32 sum kept
        return mean + delta * share, new_var, hi, count_lo + ((count_hi - (hi - rounded)) + (n - rounded))

    def learn(s, first_raw_obs, next_raw_obs, actions, scalars, key, lr, ent_coef):
        column = lambda name: scalars[..., SCALARS.index(name)]  # noqa: E731  (T, N)
        seen = jnp.concatenate([first_raw_obs[None], next_raw_obs])  # T + 1 observations per env
        x = features(p, seen.reshape(((T + 1) * N,) + seen.shape[2:]), s["obs_rms"])  # as the rollout saw them
        ret_rms, obs_rms = s["ret_rms"], s["obs_rms"]
        reward = column("reward")
        if NORM_REWARD:
            ret_rms = rms_update(ret_rms, column("discounted_return").reshape(-1), column("valid").reshape(-1))
            reward = jnp.clip(reward / jnp.sqrt(ret_rms[1] + 1e-8), -REWARD_CLIP, REWARD_CLIP)
        if p.normalise_obs:
            obs_rms = rms_update(obs_rms, next_raw_obs.reshape(T * N, -1).astype(jnp.float32), jnp.ones(T * N))

        # GAE; a truncated episode bootstraps from its final observation (the NEXT_STEP reset step
        # after it holds that observation, and is itself masked out of the loss)
        values = mlp(unravel(s["params"])["critic"], x)[:, 0].reshape(T + 1, N)

        def gae_step(last, t):
            reward, terminated, done, value, next_value = t
            delta = reward + GAMMA * next_value * (1.0 - terminated) - value
            last = delta + GAMMA * GAE_LAMBDA * (1.0 - done) * last
            return last, last

        _, advantages = jax.lax.scan(gae_step, jnp.zeros(N), (reward, column("terminated"), column("done"),
                                                               values[:-1], values[1:]), reverse=True)
        # every epoch's minibatches gathered at once from one matrix (a row per step and env)
        A = 1 if p.discrete else p.act_dim
        columns = [x[: T * N], actions.reshape(T * N, -1).astype(jnp.float32)] + [
            v.reshape(T * N, 1) for v in (column("logp"), column("valid"), advantages, values[:-1])]
        orders = jnp.argsort(plumbing.random_bits(key, E * T * N).reshape(E, T * N), axis=-1)[:, : M * minibatch]
        rows = jnp.concatenate(columns, -1)[orders.reshape(-1)].reshape(E * M, minibatch, -1)

        def loss_fn(flat, mb):
            net = unravel(flat)
            x, action = mb[:, : p.obs_dim], mb[:, p.obs_dim: p.obs_dim + A]
            old_logp, w, adv, old_value = (mb[:, p.obs_dim + A + i] for i in range(4))
            action = action[:, 0].astype(jnp.int32) if p.discrete else action
            n = jnp.maximum(w.sum(), 1.0)  # reset steps (w = 0) carry no learning signal
            mean = lambda v: (w * v).sum() / n  # noqa: E731
            new_logp, entropy = log_prob_entropy(p, net, mlp(net["actor"], x), action)
            log_ratio = new_logp - old_logp
            ratio = jnp.exp(log_ratio)
            target = adv + old_value
            adv = (adv - mean(adv)) / (jnp.sqrt((w * (adv - mean(adv)) ** 2).sum() / jnp.maximum(n - 1, 1)) + 1e-8)
            pg_loss = mean(jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1 - CLIP_COEF, 1 + CLIP_COEF)))
            new_value = mlp(net["critic"], x)[:, 0]
            v_loss = (new_value - target) ** 2
            if CLIP_VLOSS:
                clipped = old_value + jnp.clip(new_value - old_value, -CLIP_COEF, CLIP_COEF)
                v_loss = jnp.maximum(v_loss, (clipped - target) ** 2)
            loss = pg_loss - ent_coef * mean(entropy) + VF_COEF * 0.5 * mean(v_loss)
            return loss, mean((ratio - 1) - log_ratio)

        def minibatch_step(carry, mb):  # every epoch's minibatches in one scan
            flat, opt, stopped = carry
            (_, approx_kl), grads = jax.value_and_grad(loss_fn, has_aux=True)(flat, mb)
            step, new_opt = tx.update(grads, opt, flat)
            new_flat = flat - lr * step
            if TARGET_KL:  # past the target KL, the rest of the update's minibatches are skipped
                keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(stopped, b, a), new, old)  # noqa
                new_flat, new_opt = keep(new_flat, flat), keep(new_opt, opt)
                stopped = stopped | (approx_kl > TARGET_KL)
            return (new_flat, new_opt, stopped), approx_kl

        (flat, opt, _), kls = jax.lax.scan(minibatch_step, (s["params"], s["opt"], jnp.bool_(False)), rows)
        check_obs = next_raw_obs[::check_stride].reshape(s["check_obs"].shape)
        totals = scalars.sum((0, 1))
        metrics = {"env_steps": totals[SCALARS.index("valid")], "return_sum": totals[SCALARS.index("finished_return")],
                   "episodes": totals[SCALARS.index("done")], "kl": kls[-1]}
        return {"params": flat, "opt": opt, "obs_rms": obs_rms, "ret_rms": ret_rms, "check_obs": check_obs}, metrics

    def record_step(e, logp, reward, terminated, done):
        """One step's SCALARS, and each env's bookkeeping (needs_reset, returns so far) after it."""
        valid = ~e["needs_reset"]  # a reset step's action is ignored and its reward is 0
        episode_return = e["episode_return"] + reward
        discounted_return = e["discounted_return"] * GAMMA * valid + reward
        bookkeeping = {"needs_reset": done, "episode_return": jnp.where(done, 0.0, episode_return),
                       "discounted_return": discounted_return}
        scalars = jnp.stack([logp, reward, valid, terminated, done, jnp.where(done, episode_return, 0.0),
                             discounted_return], -1).astype(jnp.float32)
        return bookkeeping, scalars

    zeros = lambda tree: jax.tree_util.tree_map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), tree)
    rms = lambda shape: (np.zeros(shape, np.float32), np.ones(shape, np.float32), np.float32(1e-4), np.float32(0))
    state = {"params": flat, "opt": zeros(jax.eval_shape(tx.init, flat)), "obs_rms": rms(p.obs_dim), "ret_rms": rms(()),
             "key": np.array([0, SEED], np.uint32)}
    return SimpleNamespace(learn=learn, record_step=record_step, unravel=unravel, state=state,
                           check_rows=len(range(0, T, check_stride)) * N)


def anneal(base_lr, progress):
    """(learning rate, entropy coefficient) this far through the budget: numpy scalars (a jnp one
    would compile on its own)."""
    return (np.float32(base_lr * (max(1.0 - progress, 0.02) if ANNEAL_LR else 1.0)),
            np.float32(ENT_COEF * (1.0 - progress)))


# ---------------------------------------------------------------- jax-e2e: the whole iteration compiled
def train_end_to_end(spec, p, params):
    from envs_fast.backends.load import load_functional
    from envs_fast.backends.jax_vector import max_episode_steps

    backend = load_functional(spec, ENV_ID)
    time_limit = max_episode_steps(ENV_ID) or evaluate.MAX_EPISODE_STEPS
    N, T = JAX_NUM_ENVS, JAX_NUM_STEPS
    learner = make_learner(p, params, N, T, JAX_UPDATE_EPOCHS, JAX_NUM_MINIBATCHES)
    low, high = (None, None) if p.discrete else (p.act_space.low.reshape(-1), p.act_space.high.reshape(-1))

    def env_step(key, env_state, elapsed, needs_reset, action):
        """The N envs one step on with NEXT_STEP autoreset and the time limit, as envs_fast's vector
        adapter: an env whose last step ended its episode resets instead (reward 0, flags False).
        When any is due, resets are drawn for all at once (one call site of the backend's reset)."""
        obs, stepped, reward, terminated = jax.vmap(backend.step)(derive_keys(key, N), env_state, action)

        def reset(_):
            fresh = jax.vmap(backend.reset)(derive_keys(key ^ jnp.uint32(0x5BD1E995), N))
            pick = lambda new, old: jnp.where(needs_reset.reshape((N,) + (1,) * (old.ndim - 1)),  # noqa: E731
                                              new.astype(old.dtype), old)
            return jax.tree_util.tree_map(pick, fresh, (obs, stepped))

        obs, stepped = jax.lax.cond(needs_reset.any(), reset, lambda _: (obs, stepped), None)
        elapsed = jnp.where(needs_reset, 0, elapsed + 1)
        terminated = jnp.asarray(terminated, bool).reshape(N) & ~needs_reset
        done = terminated | ((elapsed >= time_limit) & ~needs_reset)
        return obs, stepped, jnp.where(needs_reset, 0.0, jnp.asarray(reward, jnp.float32).reshape(N)), terminated, \
            elapsed, done

    # every env starts flagged needs_reset, so the first step resets them all, as an autoreset env does
    obs_shape, env_shape = jax.eval_shape(jax.vmap(backend.reset), jax.ShapeDtypeStruct((N, 2), jnp.uint32))
    zeros = lambda tree: jax.tree_util.tree_map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), tree)
    envs = {"env": zeros(env_shape), "raw_obs": zeros(obs_shape), "elapsed": np.zeros(N, np.int32),
            "needs_reset": np.ones(N, bool), "episode_return": np.zeros(N, np.float32),
            "discounted_return": np.zeros(N, np.float32)}
    state = {**learner.state, "envs": envs,
             "check_obs": np.zeros((learner.check_rows,) + obs_shape.shape[1:], obs_shape.dtype)}

    def update(s, lr, ent_coef):
        net = learner.unravel(s["params"])
        key, env_key, learn_key, next_key = derive_keys(s["key"], 4)
        noise = plumbing.uniform_noise(plumbing.random_bits(key, T * N * p.act_dim)).reshape(T, N, p.act_dim)

        def rollout_step(e, step_inputs):  # the weights and statistics are fixed during a rollout
            noise, env_key = step_inputs
            action, logp = sample(p, net, features(p, e["raw_obs"], s["obs_rms"]), noise)
            to_env = action.astype(jnp.int32) if p.discrete else jnp.clip(action, low, high).reshape(
                (N,) + p.act_space.shape)
            raw_obs, env_state, reward, terminated, elapsed, done = env_step(
                env_key, e["env"], e["elapsed"], e["needs_reset"], to_env)
            bookkeeping, scalars = learner.record_step(e, logp, reward, terminated, done)
            return {"env": env_state, "raw_obs": raw_obs, "elapsed": elapsed, **bookkeeping}, (raw_obs, action, scalars)

        envs, (next_raw_obs, actions, scalars) = jax.lax.scan(rollout_step, s["envs"], (noise, derive_keys(env_key, T)))
        learned, metrics = learner.learn(s, s["envs"]["raw_obs"], next_raw_obs, actions, scalars, learn_key, lr,
                                         ent_coef)
        return {**s, **learned, "key": next_key, "envs": envs}, metrics

    compiled = plumbing.compile_or_refuse(update, state, *anneal(JAX_LEARNING_RATE, 0.0), donate=True)
    return SimpleNamespace(state=state, steps=N * T, learner=learner, env_step=env_step,
                           iterate=lambda s, progress: compiled(s, *anneal(JAX_LEARNING_RATE, progress)))


# ---------------------------------------------------------------- jax-host: envs stepped from Python
def host_num_envs():
    return NUM_ENVS * (JAX_HOST_ENVS_FACTOR if TIME_BUDGET >= JAX_HOST_BIG_BATCH_BUDGET else 1)


def train_from_host(spec, p, params):
    N = host_num_envs()
    T, W = NUM_STEPS, 1 if p.discrete else p.act_dim
    learner = make_learner(p, params, N, T, UPDATE_EPOCHS, NUM_MINIBATCHES)
    envs = evaluate.make_vec_env(ENV_ID, N, SEED, backend=spec)
    obs_space = envs.single_observation_space
    buffers = {"raw_obs": np.zeros((T + 1, N) + obs_space.shape, obs_space.dtype),
               "actions": np.zeros((T, N, W), np.float32), "logp": np.zeros((T, N), np.float32),
               "reward": np.zeros((T, N), np.float32), "terminated": np.zeros((T, N), bool),
               "truncated": np.zeros((T, N), bool)}
    bookkeeping = {"needs_reset": np.zeros(N, bool), "episode_return": np.zeros(N, np.float32),
                   "discounted_return": np.zeros(N, np.float32)}  # the envs were reset on the host: none is due
    state = {**learner.state, "bookkeeping": bookkeeping,
             "check_obs": np.zeros((learner.check_rows,) + obs_space.shape, obs_space.dtype)}
    rng = np.random.default_rng(SEED)

    def policy_step(flat, obs_rms, raw_obs, noise):
        """[action | env action | logp] in one array: each array read back costs a transfer."""
        action, logp = sample(p, learner.unravel(flat), features(p, raw_obs, obs_rms), noise)
        to_env = action if p.discrete else jnp.clip(action, p.act_space.low.reshape(-1), p.act_space.high.reshape(-1))
        return jnp.concatenate([action.reshape(N, W).astype(jnp.float32), to_env.reshape(N, W).astype(jnp.float32),
                                logp.reshape(N, 1)], -1)

    def learn(s, b, lr, ent_coef):
        key, next_key = derive_keys(s["key"], 2)

        def record(e, step):
            logp, reward, terminated, truncated = step
            return learner.record_step(e, logp, reward, terminated, terminated | truncated)

        steps = (b["logp"], b["reward"], b["terminated"], b["truncated"])
        bookkeeping, scalars = jax.lax.scan(record, s["bookkeeping"], steps)
        learned, metrics = learner.learn(s, b["raw_obs"][0], b["raw_obs"][1:], b["actions"], scalars, key, lr, ent_coef)
        return {**s, **learned, "key": next_key, "bookkeeping": bookkeeping}, metrics

    draw_noise = lambda: plumbing.uniform_noise(rng.integers(0, 2**32, (T, N, p.act_dim), np.uint32))  # noqa: E731
    noise = draw_noise()
    step = plumbing.compile_or_refuse(policy_step, state["params"], state["obs_rms"], buffers["raw_obs"][0], noise[0])
    learn_compiled = plumbing.compile_or_refuse(learn, state, buffers, *anneal(LEARNING_RATE, 0.0), donate=True)
    last_obs = {"raw": envs.reset(seed=SEED)[0]}

    def restart_episodes(s, seed):
        """A resumed run's envs start new episodes (their state is not checkpointed), seeded apart."""
        last_obs["raw"] = envs.reset(seed=seed)[0]
        return {**s, "bookkeeping": jax.tree_util.tree_map(np.zeros_like, bookkeeping)}

    def rollout(s, give_up):
        """One rollout into `buffers`; None when give_up(t) says it cannot finish in time. (Written only
        here: the last `learn`, which may still be reading them, was waited for.)"""
        b = buffers
        b["raw_obs"][0] = last_obs["raw"]
        noise = draw_noise()
        for t in range(T):
            if give_up(t):
                return None
            packed = np.asarray(step(s["params"], s["obs_rms"], b["raw_obs"][t], noise[t]))
            env_action = packed[:, W].astype(np.int64) if p.discrete else packed[:, W:2 * W].reshape(
                (N,) + p.act_space.shape)
            b["raw_obs"][t + 1], b["reward"][t], b["terminated"][t], b["truncated"][t], _ = envs.step(env_action)
            b["actions"][t], b["logp"][t] = packed[:, :W], packed[:, -1]
        last_obs["raw"] = b["raw_obs"][-1].copy()
        return b

    def iterate(s, progress, give_up=lambda t: False):
        if rollout(s, give_up) is None:
            return None
        return learn_compiled(s, buffers, *anneal(LEARNING_RATE, progress))

    # the first iteration's learning, before any was timed: one `learn` on a copy of the state, x1.5
    probe_started = time.time()
    jax.block_until_ready(learn_compiled(jax.tree_util.tree_map(np.array, state), buffers, *anneal(0.0, 0.0)))
    return SimpleNamespace(state=state, steps=N * T, learner=learner, iterate=iterate, num_steps=T, envs=envs,
                           learn_seconds=1.5 * (time.time() - probe_started), restart_episodes=restart_episodes,
                           rollout=rollout, buffers=buffers, learn=learn_compiled)


# ---------------------------------------------------------------- the budget loop, the export, the summary
def trained_policy(p, learner, state):
    """(policy, actor outputs) of a training state: what is exported, and what export_check holds it
    to (training's actor: logits for Discrete actions, the mean for Box)."""
    trained = jax.device_get({"params": learner.unravel(state["params"]), "obs_rms": state["obs_rms"][:2]})
    # the weights as arguments, not constants: the compiled program is the same in every run (cached)
    outputs = jax.jit(lambda params, obs_rms, raw: mlp(params["actor"], features(p, raw, obs_rms)))

    def policy_outputs(raw):
        with jax.default_matmul_precision("highest"):  # a GPU multiplies in TF32 by default
            return np.asarray(outputs(trained["params"], trained["obs_rms"], raw))

    return policy(p, trained["params"], trained["obs_rms"]), policy_outputs


def train(path, spec, p, params):
    """Builds and compiles the path's training, then iterates within the budget (train_plumbing's loop).
    Returns the final state, the learner and the figures."""
    plumbing.configure_compilation_cache(jax)
    device = jax.devices()[0]
    print(f"{path} path: jax on {device.platform} ({device})", flush=True)
    compile_start = time.time()
    training = (train_end_to_end if path == "jax-e2e" else train_from_host)(spec, p, params)
    start = time.time()
    print(f"compiled in {start - compile_start:.1f}s ({start - START:.1f}s since the process started)", flush=True)
    host = {} if path == "jax-e2e" else {"rollout_steps": NUM_STEPS, "learn_seconds": training.learn_seconds,
                                         "restart_episodes": training.restart_episodes}
    state, figures = plumbing.train_within_budget(training.iterate, training.state, training.steps, START, start,
                                                  **host)
    if path == "jax-host":
        training.envs.close()
    return state, training.learner, {**figures, "device": device.platform, "compile_seconds": start - compile_start}


def choose_path(spec):
    """jax-e2e for a functional JAX backend (unless END_TO_END is False), jax-host for any other."""
    return "jax-e2e" if END_TO_END and plumbing.is_jax_functional(spec) else "jax-host"


def main():
    p = Problem(ENV_ID)
    spec, why = plumbing.choose_backend(BACKEND, ENV_ID, NUM_ENVS)
    path = choose_path(spec)
    print(f"backend {spec} ({why}) -> path {path}", flush=True)
    params = init_params(p, np.random.default_rng(SEED))
    example = np.stack([p.obs_space.sample() for _ in range(2)])
    try:  # a network the export cannot carry, or a learner JAX cannot compile, fails now, not after the budget
        check_exportable(policy(p, params, (np.zeros(p.obs_dim, np.float32), np.ones(p.obs_dim, np.float32))), example)
        state, learner, figures = train(path, spec, p, params)
    except (Unexportable, plumbing.Refused) as exc:
        print(f"refused: {exc}", flush=True)
        return 1
    act, policy_outputs = trained_policy(p, learner, state)
    policy_path = OUTPUT_DIR / "policy.pt"
    export_policy(act, example, policy_path)
    # observations from training; before any update, samples of the observation space
    check_obs = np.asarray(state["check_obs"])
    if not figures["updates"]:
        check_obs = np.stack([p.obs_space.sample() for _ in range(len(check_obs))]).astype(check_obs.dtype)
    ok, check_line = plumbing.check_export(policy_path, p.discrete, p.act_dim, check_obs, policy_outputs)
    plumbing.print_summary({"backend": spec, "backend_reason": why, "path": path}, figures, check_line)
    return 0 if ok else 1


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # skips the interpreter's teardown of jax (a second or two); everything is written
