"""Single-file PPO for the autorl experiment, in the spirit of CleanRL's ppo_continuous_action.py
(host path) and PureJaxRL (end-to-end path), with a fixed wall-clock budget.

Trains ENV_ID for TIME_BUDGET seconds and exports $AUTORL_OUTPUT_DIR/policy.pt: a TorchScript module
with observation normalisation baked in that maps an observation batch to deterministic actions.
The score is NOT computed here: the daemon evaluates the artifact with the fixed harness.

The budget clock starts when this process starts: imports, building the envs and JAX compilation
count, and no update is launched that would end past the budget.

Three paths, one algorithm, one artifact. The backend is what evaluate.make_vec_env(backend="auto")
would train on (envs_fast.choose_backend: the fastest *verified* backend; a BACKEND set by hand
trains only if verified in this run, else on the reference), then:
- jax-e2e: a functional JAX backend (a verified translation envs_fast/<slug>.py, or gymnax) is
  trained end to end under jit, PureJaxRL's shape: one compiled call runs the rollout (lax.scan over
  JAX_NUM_STEPS steps of JAX_NUM_ENVS vmapped envs, autoreset and time limit included), GAE and
  the PPO epochs (optax); the host only decides when to stop. The networks are the torch Agent's,
  translated module by module (a module it cannot translate is refused before training), and
  copied back at the end, so the export is the same as the host path's. The compiling counts in the
  budget: the runner gives every run an empty $AUTORL_JAX_CACHE_DIR, so every run compiles cold.
- jax-host: a vector backend that is not JAX (a verified Rust translation envs_fast/<slug>.rs,
  envpool; e.g. BipedalWalker-v3) stepped from a Python loop, one compiled policy call and one vector
  env step per step, and the rollout learnt from by the jax-e2e path's learner (make_jax_learner:
  the same networks, statistics, GAE and PPO epochs, compiled once) with the host path's constants
  (NUM_STEPS, LEARNING_RATE, UPDATE_EPOCHS, NUM_MINIBATCHES) over NUM_ENVS envs (x JAX_HOST_ENVS_FACTOR
  from a budget of JAX_HOST_BIG_BATCH_BUDGET). Chosen by LEARNER ("auto": from a budget of JAX_HOST_MIN_BUDGET, where its compile pays for
  itself).
- host: the same backends (and gymnasium's own vector env) stepped from a torch loop, the torch
  learner on DEVICE (LEARNER = "torch", or a budget too short to repay the JAX compile).
After exporting, the artifact is reloaded as the harness loads it and its actions compared with the
trained policy's on observations from training (`export_check:`); a mismatch exits non-zero.

What makes it a strong start rather than a textbook one:
- observation normalisation and reward scaling by running statistics;
- gymnasium's NEXT_STEP autoreset handled exactly: time-limit truncations bootstrap from the
  final observation instead of being treated as deaths, and the reset steps are masked out;
- learning rate and entropy annealed over the *time* budget (over the time left once training
  starts), not a step count;
- state-independent log-std, orthogonal init, separate actor and critic.
"""
import os
import time


def process_start_time():
    """When this process started, as a time.time() value: Linux's /proc/self/stat (field 22, clock
    ticks since boot), else now (this line runs before any heavy import)."""
    now = time.time()
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # fields after the command's ")" start at 3
        started = now - time.clock_gettime(time.CLOCK_BOOTTIME) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return started if 0 <= now - started < 600 else now  # a clock that disagrees is not trusted


# The budget clock. Imported as a module (tests, benchmarks), the import is the start.
START = process_start_time() if __name__ == "__main__" else time.time()

import sys  # noqa: E402  (the clock above is read before the heavy imports)
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root
import evaluate  # noqa: E402  (the fixed harness: constants and env factories)

# >>> hyperparameters
# "(host path)" constants are the jax-host path's too: the same PPO, its learning compiled in JAX
NUM_ENVS = 32  # parallel environments (host path)
# The jax-host path steps NUM_ENVS x this many envs from a budget of JAX_HOST_BIG_BATCH_BUDGET: its
# compiled update costs little per sample, so a larger batch buys env steps where there is time for
# enough updates (see JAX_HOST_BIG_BATCH_BUDGET)
JAX_HOST_ENVS_FACTOR = 4  # (jax-host path)
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
LEARNER = "auto"  # who learns on a host backend (Rust, envpool, gymnasium): "torch" (host path), "jax" (jax-host path), "auto"
JAX_NUM_ENVS = 32  # parallel environments (jax-e2e path)
JAX_NUM_STEPS = 64  # steps per env per rollout (jax-e2e path)
JAX_LEARNING_RATE = 2e-3  # Adam, annealed like LEARNING_RATE (jax-e2e path)
JAX_UPDATE_EPOCHS = 2  # passes over each rollout (jax-e2e path)
JAX_NUM_MINIBATCHES = 16  # minibatches per epoch (jax-e2e path)
# <<< hyperparameters

ENV_ID = evaluate.ENV_ID
TIME_BUDGET = evaluate.TIME_BUDGET
SEED = int(os.environ.get("AUTORL_SEED", 1))
# A step budget beside the time budget (0: none), for comparisons at equal env steps: verification's
# L4 trains a backend and the reference for the same steps. Set by whoever runs this, never by a night.
MAX_ENV_STEPS = int(os.environ.get("AUTORL_MAX_ENV_STEPS", 0))
OUTPUT_DIR = Path(os.environ.get("AUTORL_OUTPUT_DIR", "out"))
JAX_CACHE_DIR = os.environ.get("AUTORL_JAX_CACHE_DIR")  # the runner's compilation cache (empty for every run)
# A run longer than one sitting (verification's L4 on a slow backend: hours) saves the host path's
# training here every CHECKPOINT_SECONDS and, started again, goes on from it. Never set by a night.
CHECKPOINT_DIR = os.environ.get("AUTORL_CHECKPOINT_DIR")
CHECKPOINT_SECONDS = float(os.environ.get("AUTORL_CHECKPOINT_SECONDS", 300))
HOST_SPECS = ("envpool", "gymnasium", "reference", "mujoco_batch")  # vector backends: stepped from a Python loop (host, jax-host)
SCALARS = ("logp", "reward", "valid", "terminated", "done", "finished_return", "discounted_return")  # jax-e2e rollout
# LEARNER = "auto" trains a Rust translation or envpool with the JAX learner (jax-host) from this budget
# on (bench/results/bipedal-training-2026-11-26.txt, 2 cores shared with other jobs): at load 2-3 it
# trained CartPole-v1 on envpool 2.0x the host path's env steps at 12 s, 5.5x at 20 s and 5.4x at 30 s,
# BipedalWalker-v3 2.4-3x at 90 s; but at load 6-7 its start-up and compile (which cannot be stopped)
# took 16-20 s, so a 12 s run trained nothing and overran its budget by 4-8 s. From 30 s it won every run.
JAX_HOST_MIN_BUDGET = 30.0
# BipedalWalker-v3 at 720 s on its Rust port, 2 quiet cores, seeds 1 and 2 (bench/results/bipedal-training-720*):
# 128 envs trained 14.9M steps in ~455 updates and scored 321 and 318 on the real env, side by side with
# the host path's 301 and 293; 32 envs, the same day, 12.2M steps in ~1,490 updates, 288 and 289 (against
# 299 and 300). At 120 and 240 s 32 envs scored 293 and 298 (bipedal-training-budgets); CartPole-v1 at
# 30 s on 2 busy cores fits no update of 128 x 256 steps. In between: unmeasured.
JAX_HOST_BIG_BATCH_BUDGET = 480.0
EXPORT_TOLERANCE = 1e-4  # export_check: max |action difference| for Box actions (+1e-5 x |action|)
TIE_TOLERANCE = 1e-5  # export_check, Discrete actions: a logit this close to the best is a tie


# ---------------------------------------------------------------- the networks (shared by both paths)
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Separate actor and critic MLPs. The jax-e2e path translates `actor` and `critic` module by
    module (see `jax_layers` for the modules it knows) and checks that it computes what `value` and
    `distribution` compute."""

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
    """Deterministic policy for the harness: raw observation batch -> action batch, with exactly the
    preprocessing training applied: one-hot for Discrete observations; `obs_normalisation` (mean, var)
    then clipping to +-OBS_CLIP when training normalised, raw observations when it did not (None)."""

    def __init__(self, actor, obs_normalisation, num_obs_categories, discrete):
        super().__init__()
        self.actor = actor
        self.normalise = obs_normalisation is not None
        if self.normalise:
            mean, var = obs_normalisation
            self.register_buffer("obs_mean", torch.as_tensor(mean, dtype=torch.float32))
            self.register_buffer("obs_std", torch.as_tensor(np.sqrt(var + 1e-8), dtype=torch.float32))
        self.obs_clip = OBS_CLIP
        self.num_obs_categories = num_obs_categories
        self.discrete = discrete

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.num_obs_categories > 0:
            x = nn.functional.one_hot(obs.long(), self.num_obs_categories).float()
        else:
            x = torch.flatten(obs, 1)
            if self.normalise:
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
    """(spec, why): the backend training uses, and why. A BACKEND set by hand is used only if this
    run verified it (envs_fast.training_refusal: a passing cached verdict; envpool unless one fails),
    else the reference; envs_fast.make_vec_env and load_functional apply the same rule in a
    training run."""
    try:
        import envs_fast
    except ImportError:  # a checkout without envs_fast: what the harness would do
        spec = evaluate._auto_backend(ENV_ID, NUM_ENVS) if BACKEND == "auto" else BACKEND
        return spec, "envs_fast is not importable"
    if BACKEND == "auto":
        return envs_fast.choose_backend(ENV_ID, NUM_ENVS), "envs_fast.choose_backend: the fastest verified backend"
    from envs_fast.protocol import resolve_spec

    refusal = envs_fast.training_refusal(BACKEND, ENV_ID)
    if refusal:
        return "reference", f"BACKEND = {BACKEND!r} is not verified in this run ({refusal}): training on the reference"
    return resolve_spec(BACKEND, ENV_ID), "BACKEND is set in train.py (verified in this run)"


def choose_path(spec):
    """(path, why): which loop and learner train `spec`.
    - a functional JAX backend: jax-e2e (LEARNER = "torch": the host path over its vector adapter);
    - any other (a Rust translation, envpool, gymnasium): LEARNER = "torch" the host path, "jax" the
      jax-host path, "auto" jax-host for a Rust translation or envpool when the budget is at least
      JAX_HOST_MIN_BUDGET, else the host path (measured, see there). gymnasium's own vector env (the
      reference: any env, any space) stays on the host path: jax-host was not measured there."""
    if LEARNER not in ("auto", "torch", "jax"):
        raise SystemExit(f"LEARNER must be \"auto\", \"torch\" or \"jax\", not {LEARNER!r}")
    if is_jax_functional(spec):
        if LEARNER == "torch":
            return "host", "LEARNER = \"torch\": the torch loop over the JAX backend's vector adapter"
        return "jax-e2e", "a functional JAX backend: trained end to end under jit"
    if LEARNER != "auto":
        return {"torch": "host", "jax": "jax-host"}[LEARNER], f"LEARNER = {LEARNER!r}"
    if spec in ("reference", "gymnasium"):
        return "host", "LEARNER = \"auto\": gymnasium's vector env is stepped by the torch loop"
    if TIME_BUDGET >= JAX_HOST_MIN_BUDGET:
        return "jax-host", f"LEARNER = \"auto\": the JAX learner repays its compile in a {TIME_BUDGET:g} s budget"
    return "host", f"LEARNER = \"auto\": the JAX learner's compile does not pay in a {TIME_BUDGET:g} s budget"


def is_jax_functional(spec):
    """True for a JAX translation file or gymnax (trained end to end); False for host backends
    (a Rust translation `.rs` is a native vector env: a Python loop steps it)."""
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


class Adam:
    """torch.optim.Adam (no weight decay, no amsgrad), its single-tensor arithmetic written out: the
    first torch.optim optimizer built imports torch._dynamo, two seconds of the budget on a small CPU.
    tests/test_train.py checks it steps exactly as torch.optim.Adam does."""

    def __init__(self, params, lr, eps=1e-5, betas=(0.9, 0.999)):
        self.params = list(params)
        self.param_groups = [{"lr": lr}]
        self.eps, self.betas, self.steps = eps, betas, 0
        self.exp_avg = [torch.zeros_like(param) for param in self.params]
        self.exp_avg_sq = [torch.zeros_like(param) for param in self.params]

    def zero_grad(self):
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self):
        (beta1, beta2), lr = self.betas, self.param_groups[0]["lr"]
        self.steps += 1
        step_size = lr / (1 - beta1**self.steps)
        bias_correction2_sqrt = (1 - beta2**self.steps) ** 0.5
        for param, exp_avg, exp_avg_sq in zip(self.params, self.exp_avg, self.exp_avg_sq):
            if param.grad is None:
                continue
            exp_avg.lerp_(param.grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(param.grad, param.grad, value=1 - beta2)
            param.addcdiv_(exp_avg, (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps), value=-step_size)


def torch_device():
    if DEVICE == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(DEVICE)


def gradient_step_seconds(agent, problem, batch, device):
    """What one minibatch gradient step costs, measured on a copy of the agent (the probe trains
    nothing): the host path's prior for its first update, before any update was timed."""
    import copy

    probe = copy.deepcopy(agent)
    optimizer = Adam(probe.parameters(), lr=0.0)
    x = torch.zeros(batch, problem.obs_dim, device=device)
    seconds = []
    for _ in range(2):  # the first call pays one-time costs; the second is the steady state
        started = time.time()
        dist = probe.distribution(x)
        loss = dist.log_prob(dist.sample()).sum() + probe.value(x).sum() - dist.entropy().sum()
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(probe.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        loss.detach().item()  # waits for the device
        seconds.append(time.time() - started)
    return seconds[-1]


def budget_progress(now, start, deadline, env_steps):
    """How far training is through its budget, 0 to 1, the learning rate and entropy anneal over it:
    the time left when training started, or with MAX_ENV_STEPS its env steps, whichever is further."""
    progress = (now - start) / max(deadline - start, 1e-9)
    if MAX_ENV_STEPS:
        progress = max(progress, env_steps / MAX_ENV_STEPS)
    return min(1.0, progress)


def steps_spent(env_steps, next_steps):
    """With MAX_ENV_STEPS, whether an iteration of `next_steps` more env steps would pass it."""
    return bool(MAX_ENV_STEPS) and env_steps + next_steps > MAX_ENV_STEPS


class HostCheckpoint:
    """The host path's training state in CHECKPOINT_DIR/host.pt: the networks, Adam's moments, the
    normalisers, the counters and torch's random state. A resumed run starts new episodes (the envs'
    own state is not kept), seeded apart from the first run's."""

    def __init__(self, directory):
        self.path = Path(directory) / "host.pt"
        self.saved_at = time.time()

    def save(self, agent, optimizer, obs_rms, return_rms, discounted_return, counters):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        state = {"agent": {k: v.cpu() for k, v in agent.state_dict().items()}, "adam_steps": optimizer.steps,
                 "exp_avg": [t.cpu() for t in optimizer.exp_avg], "exp_avg_sq": [t.cpu() for t in optimizer.exp_avg_sq],
                 "obs_rms": vars(obs_rms), "return_rms": vars(return_rms), "discounted_return": discounted_return,
                 "counters": counters, "torch_rng": torch.get_rng_state()}
        partial = self.path.with_suffix(".partial")
        torch.save(state, partial)
        os.replace(partial, self.path)  # a kill while saving leaves the previous checkpoint whole
        self.saved_at = time.time()

    def due(self):
        return time.time() - self.saved_at >= CHECKPOINT_SECONDS

    def restore(self, agent, optimizer, obs_rms, return_rms, device):
        """The saved counters (env_steps, updates, recent_returns) after loading the rest, or None."""
        if not self.path.exists():
            return None
        state = torch.load(self.path, weights_only=False)
        agent.load_state_dict(state["agent"])
        optimizer.steps = state["adam_steps"]
        for mine, saved in zip(optimizer.exp_avg + optimizer.exp_avg_sq, state["exp_avg"] + state["exp_avg_sq"]):
            mine.copy_(saved.to(device))
        vars(obs_rms).update(state["obs_rms"])
        vars(return_rms).update(state["return_rms"])
        torch.set_rng_state(state["torch_rng"])
        return state["counters"], state["discounted_return"]


def train_host(spec, problem, agent):
    """PPO from a torch loop over evaluate.make_vec_env. Returns the figures, the observation
    normalisation and what export_check compares the artifact with."""
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

    optimizer = Adam(agent.parameters(), lr=LEARNING_RATE, eps=1e-5)
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
    check_every = max(1, T // 16)  # raw observations kept from each rollout for export_check
    check_obs = []

    env_steps, updates, recent_returns = 0, 0, []
    checkpoint = HostCheckpoint(CHECKPOINT_DIR) if CHECKPOINT_DIR else None
    restored = checkpoint.restore(agent, optimizer, obs_rms, return_rms, device) if checkpoint else None
    if restored:
        (env_steps, updates, recent_returns), discounted_return = restored
        print(f"resumed from {checkpoint.path}: {env_steps} env steps, {updates} updates", flush=True)
    resumed_at = env_steps
    raw_obs, _ = envs.reset(seed=SEED + 7919 * updates)  # a resumed run's episodes: not the first run's again
    if p.normalise_obs:
        obs_rms.update(raw_obs.reshape(N, -1))
    prev_done = np.zeros(N, bool)
    episode_return = np.zeros(N)
    approx_kl = 0.0
    deadline = START + TIME_BUDGET
    # No iteration (rollout + update) starts that would end past the deadline. The first one's cost
    # is estimated from its own first steps (the very first may pay one-time costs, so it is not
    # extrapolated) and a probed gradient step; later ones from the last iteration.
    probe_steps = min(T, 9)
    update_prior = 1.5 * UPDATE_EPOCHS * NUM_MINIBATCHES * gradient_step_seconds(
        agent, p, max(1, T * N // NUM_MINIBATCHES), device)
    iteration_seconds = None
    start = time.time()  # training proper starts: the learning rate anneals over the time left

    while True:
        iteration_start = time.time()
        if iteration_start >= deadline or iteration_start + (iteration_seconds or 0.0) > deadline:
            break
        if steps_spent(env_steps, T * N):
            break
        progress = budget_progress(iteration_start, start, deadline, env_steps)
        if ANNEAL_LR:
            optimizer.param_groups[0]["lr"] = LEARNING_RATE * max(1.0 - progress, 0.02)

        # ---- rollout
        obs_buf[0] = features(raw_obs, obs_rms)
        rollout_check_obs, rollout_steps, abandoned = [], 0, False
        for t in range(T):
            if iteration_seconds is None and t in (1, probe_steps):  # the first rollout: can it finish?
                if t == 1:
                    second_step = time.time()
                else:
                    estimate = (second_step - iteration_start + (time.time() - second_step) * (T - 1) / (t - 1)
                                + update_prior)
                    abandoned = iteration_start + estimate > deadline
                    if abandoned:
                        break
            if t % check_every == 0:
                rollout_check_obs.append(raw_obs)
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
            rollout_steps += int((~prev_done).sum())

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
        if abandoned:  # its steps are not counted: nothing was trained on them
            print(f"stopping: the first rollout and update need ~{estimate:.1f}s, "
                  f"{deadline - iteration_start:.1f}s were left", flush=True)
            break
        check_obs, env_steps = rollout_check_obs, env_steps + rollout_steps

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
            if stop or time.time() >= deadline:  # a last guard: the estimate should never let this happen
                break
        updates += 1
        # a slow iteration raises the estimate at once, a fast one lowers it slowly
        iteration_seconds = max(time.time() - iteration_start, 0.9 * (iteration_seconds or 0.0))
        if checkpoint and checkpoint.due():
            checkpoint.save(agent, optimizer, obs_rms, return_rms, discounted_return,
                            (env_steps, updates, recent_returns[-100:]))
        elapsed = time.time() - start
        last_return = float(np.mean(recent_returns[-20:])) if recent_returns else float("nan")
        print(
            f"update {updates} steps {env_steps} sps {(env_steps - resumed_at) / elapsed:.0f} "
            f"return(last 20 episodes) {last_return:.2f} kl {approx_kl:.4f} time {time.time() - START:.0f}s",
            flush=True,
        )

    end = time.time()
    envs.close()
    agent.cpu()

    def policy_outputs(raw):
        """The trained actor's outputs (logits or action means) on raw observations."""
        with torch.no_grad():
            return agent.actor(torch.from_numpy(features(np.asarray(raw), obs_rms))).numpy()

    return {
        "figures": {"device": str(device), "env_steps": env_steps, "resumed_at": resumed_at,
                    "training_seconds": end - start,
                    "wall_seconds": end - START, "updates": updates,
                    "episode_return": float(np.mean(recent_returns[-20:])) if recent_returns else float("nan"),
                    "episodes": len(recent_returns)},
        "obs_normalisation": (obs_rms.mean, obs_rms.var) if p.normalise_obs else None,
        "check_observations": np.concatenate(check_obs or [raw_obs]), "policy_outputs": policy_outputs,
    }


# ---------------------------------------------------------------- jax-e2e path: the whole loop compiled
class Untranslatable(Exception):
    """The Agent holds something the jax-e2e path cannot compute exactly as torch does: training it
    in JAX would train something other than what is exported, so training is refused instead."""


def jax_layers(sequential, name):
    """An nn.Sequential as JAX functions: a list of (sources, apply), one per module in order, where
    `sources` names the module's torch parameters ({"w": (Linear.weight, transposed), ...}) and
    apply(params, x) computes what the module computes (params: the sources as arrays)."""
    import jax
    import jax.numpy as jnp

    if type(sequential) is not nn.Sequential:
        raise Untranslatable(f"agent.{name} is a {type(sequential).__name__}, not an nn.Sequential: the jax-e2e path "
                             f"translates only nn.Sequential networks (BACKEND = \"reference\" trains any network)")
    elementwise = {nn.Identity: lambda x: x, nn.Tanh: jnp.tanh, nn.ReLU: jax.nn.relu, nn.Sigmoid: jax.nn.sigmoid,
                   nn.SiLU: jax.nn.silu, nn.Softsign: jax.nn.soft_sign, nn.Mish: jax.nn.mish}
    layers = []
    for index, module in enumerate(sequential):
        kind, where = type(module), f"{name}[{index}]"  # exact types: a subclass may compute something else
        if kind is nn.Sequential:
            layers += jax_layers(module, where)
        elif kind is nn.Linear:
            sources = {"w": (module.weight, True)} | ({"b": (module.bias, False)} if module.bias is not None else {})
            layers.append((sources, lambda q, x: x @ q["w"] + q["b"] if "b" in q else x @ q["w"]))
        elif kind is nn.LayerNorm and len(module.normalized_shape) == 1:
            sources = {key: (param, False) for key, param in (("scale", module.weight), ("offset", module.bias))
                       if param is not None}

            def layer_norm(q, x, eps=module.eps):
                centred = x - x.mean(-1, keepdims=True)
                y = centred * jax.lax.rsqrt((centred**2).mean(-1, keepdims=True) + eps)
                return y * q["scale"] + q["offset"] if "offset" in q else y * q.get("scale", 1.0)

            layers.append((sources, layer_norm))
        elif kind in elementwise:
            layers.append(({}, lambda q, x, f=elementwise[kind]: f(x)))
        elif kind is nn.ELU:
            layers.append(({}, lambda q, x, alpha=module.alpha: jax.nn.elu(x, alpha)))
        elif kind is nn.LeakyReLU:
            layers.append(({}, lambda q, x, slope=module.negative_slope: jax.nn.leaky_relu(x, slope)))
        elif kind is nn.GELU:
            layers.append(({}, lambda q, x, tanh=module.approximate == "tanh": jax.nn.gelu(x, approximate=tanh)))
        elif kind is nn.Softplus:
            layers.append(({}, lambda q, x, beta=module.beta, threshold=module.threshold:
                           jnp.where(x * beta > threshold, x, jax.nn.softplus(x * beta) / beta)))
        elif kind is nn.Dropout and module.p == 0:
            layers.append(({}, lambda q, x: x))
        else:
            known = "Linear, LayerNorm, Dropout(p=0), ELU, GELU, LeakyReLU, Softplus, " + ", ".join(
                k.__name__ for k in elementwise)
            raise Untranslatable(f"the jax-e2e path cannot translate agent.{where} ({module!r}); it translates "
                                 f"{known} (BACKEND = \"reference\" trains any network)")
    return layers


def make_jax_learner(problem, agent, num_envs, num_steps, update_epochs, num_minibatches):
    """The JAX PPO learner both JAX paths share, for rollouts of `num_steps` steps of `num_envs` envs:
    the Agent's networks translated, action sampling, running statistics, the per-step bookkeeping,
    and `learn` (statistics, GAE, `update_epochs` epochs of `num_minibatches` minibatches). Returns a
    namespace (`s` is a training state: a dict holding at least params, opt, obs_rms, ret_rms, check_obs):
      params, opt                the initial weights (one flat vector, `agent`'s) and optimiser state
      sample(flat, x, noise)     an action and its log-probability, given uniform(0, 1) noise
      features(raw_obs, obs_rms) the network input from raw observations (the transform the export bakes in)
      to_env(action)             the action as the env takes it (clipped to the Box; int32 for Discrete)
      rms_init(shape)            fresh running statistics
      random_bits(key, count)    `count` random uint32 from a uint32[2] key
      orders(bits)               the minibatch permutations of all epochs from E*T*N random bits
      record_step(e, logp, reward, terminated, done) -> (bookkeeping, scalars): one step's SCALARS and the
                                 envs' updated needs_reset / episode_return / discounted_return (taken from e)
      check_obs_init(shape, dtype) the buffer of raw observations kept for export_check
      learn(s, first_raw_obs, next_raw_obs, actions, scalars, orders, lr, ent_coef) -> (learned, metrics):
                                 the fields of `s` it updates, and the rollout's figures
      outputs(s, raw_obs), act(s, raw_obs), to_torch(s, agent), num_weights
    The weights start as `agent`'s (so every path initialises alike) and go back into it for the export.
    Raises Untranslatable, before anything is compiled, for an Agent it cannot compute exactly."""
    import jax
    import jax.numpy as jnp
    import jax.scipy.special
    import optax

    from envs_fast.vector import mix32

    p = problem
    N, T, E, M = num_envs, num_steps, update_epochs, num_minibatches
    minibatch = (T * N) // M

    # ---- networks: the Agent's modules translated, their weights (and log-std for Box actions) in one
    # flat vector (the optimiser then runs a few kernels, not a few per layer: shorter compilation)
    layers = {"actor": jax_layers(agent.actor, "actor"), "critic": jax_layers(agent.critic, "critic")}
    log_std = None if p.discrete else getattr(agent, "actor_logstd", None)
    if not p.discrete and not isinstance(log_std, nn.Parameter):
        raise Untranslatable("Box actions need agent.actor_logstd (a state-independent log-std) on the JAX paths")
    trained = {id(param) for net in layers.values() for sources, _ in net for param, _ in sources.values()}
    trained |= {id(log_std)} if log_std is not None else set()
    untrained = [name for name, param in agent.named_parameters() if id(param) not in trained]
    if untrained:
        raise Untranslatable(f"agent parameters outside actor, critic and actor_logstd ({', '.join(untrained)}): "
                             f"the JAX paths would not train them")

    def weights(net):
        return [{key: param.detach().cpu().numpy().T if transposed else param.detach().cpu().numpy()
                 for key, (param, transposed) in sources.items()} for sources, _ in net]

    params = {name: weights(net) for name, net in layers.items()}
    if log_std is not None:
        params["log_std"] = log_std.detach().cpu().numpy().reshape(-1)
    # flattened in numpy: any op run outside the compiled update would compile on its own
    leaves, treedef = jax.tree_util.tree_flatten(params)
    flat_params = np.concatenate([leaf.reshape(-1) for leaf in leaves]).astype(np.float32)
    offsets = np.cumsum([0] + [leaf.size for leaf in leaves])

    def unravel(flat):
        return treedef.unflatten([flat[a:b].reshape(leaf.shape) for a, b, leaf in zip(offsets, offsets[1:], leaves)])

    check_agent_glue(agent, p)
    num_weights = {name: sum(w.size for q in params[name] for w in q.values()) for name in layers}

    def network(name, flat, x):
        for (_, apply), q in zip(layers[name], unravel(flat)[name]):
            x = apply(q, x)
        return x

    def value(flat, x):
        return network("critic", flat, x)[..., 0]

    def log_prob_entropy(flat, out, action):
        if p.discrete:
            logits = jax.nn.log_softmax(out)
            logp = (logits * jax.nn.one_hot(action, p.act_dim)).sum(-1)  # (a gather's gradient is a scatter)
            return logp, -(jnp.exp(logits) * logits).sum(-1)
        log_std = unravel(flat)["log_std"]
        z = (action - out) / jnp.exp(log_std)
        logp = (-0.5 * z**2 - log_std - 0.5 * jnp.log(2 * jnp.pi)).sum(-1)
        return logp, jnp.broadcast_to((log_std + 0.5 * jnp.log(2 * jnp.pi * jnp.e)).sum(), logp.shape)

    def sample(flat, x, noise):
        """An action from the policy, given uniform(0, 1) noise drawn for it beforehand."""
        out = network("actor", flat, x)
        if p.discrete:  # Gumbel-max: argmax(logits + Gumbel noise) is a categorical sample
            action = jnp.argmax(out - jnp.log(-jnp.log(noise)), axis=-1)
        else:
            action = out + jnp.exp(unravel(flat)["log_std"]) * jax.scipy.special.ndtri(noise)
        return action, log_prob_entropy(flat, out, action)[0]

    # ---- running statistics (mean, var, count), as RunningMeanStd. Updated once per rollout, and the
    # count kept as a float32 pair (hi + lo, the part of each sum that rounding dropped), so that past
    # 1e8 samples the increments still count.
    def rms_init(shape):
        return (np.zeros(shape, np.float32), np.ones(shape, np.float32), np.float32(1e-4), np.float32(0.0))

    def rms_update(rms, x, w):
        """The statistics updated with the rows of x (weights w: 1 counts a row, 0 skips it)."""
        mean, var, count_hi, count_lo = rms
        w = w.reshape((-1,) + (1,) * (x.ndim - 1))
        d = x - mean  # moments about the running mean: accurate in float32, and all in one reduction
        sums = jnp.stack(jnp.broadcast_arrays(w, w * d, w * d * d), -1).sum(0)
        n = sums.reshape(-1, 3)[0, 0]
        delta = sums[..., 1] / jnp.maximum(n, 1.0)  # the batch mean minus the running one
        batch_var = jnp.maximum(sums[..., 2] / jnp.maximum(n, 1.0) - delta**2, 0.0)
        share = n / (count_hi + count_lo + n)  # the batch's share of all samples so far
        new_var = var * (1 - share) + batch_var * share + delta**2 * share * (1 - share)
        hi = count_hi + n
        rounded = hi - count_hi  # TwoSum: what of n the float32 sum kept
        lo = count_lo + ((count_hi - (hi - rounded)) + (n - rounded))
        return (mean + delta * share, new_var, hi, lo)

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

    tx = optax.chain(optax.clip_by_global_norm(MAX_GRAD_NORM), optax.scale_by_adam(eps=1e-5))
    opt = jax.tree_util.tree_map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), jax.eval_shape(tx.init, flat_params))
    check_stride = max(1, T // 16)  # raw observations kept from each rollout for export_check

    def check_obs_init(single_shape, dtype):
        return np.zeros((len(range(0, T, check_stride)) * N,) + tuple(single_shape), dtype)

    def random_bits(key, count):
        """`count` random uint32 from a counter-based hash of (key, index): one cheap elementwise op
        where a jax.random call site would compile a threefry loop."""
        index = jnp.arange(count, dtype=jnp.uint32)
        return mix32(key[0] ^ mix32(index * jnp.uint32(0x9E3779B1) + key[1]))

    def orders(bits):
        return jnp.argsort(bits.reshape(E, T * N), axis=-1)[:, : M * minibatch]

    def record_step(e, logp, reward, terminated, done):
        valid = ~e["needs_reset"]  # a reset step's action is ignored and its reward is 0
        episode_return = e["episode_return"] + reward
        discounted_return = e["discounted_return"] * GAMMA * valid + reward
        bookkeeping = {"needs_reset": done, "episode_return": jnp.where(done, 0.0, episode_return),
                       "discounted_return": discounted_return}
        # the step's scalars in one array (see SCALARS): each output of a scan costs a kernel
        scalars = jnp.stack([logp, reward, valid, terminated, done, jnp.where(done, episode_return, 0.0),
                             discounted_return], -1).astype(jnp.float32)
        return bookkeeping, scalars

    def learn(s, first_raw_obs, next_raw_obs, actions, scalars, orders, lr, ent_coef):
        params, obs_rms = s["params"], s["obs_rms"]
        column = lambda name: scalars[..., SCALARS.index(name)]  # (T, N), sliced where it is used
        seen = jnp.concatenate([first_raw_obs[None], next_raw_obs])  # T + 1 observations per env
        x = features(seen.reshape(((T + 1) * N,) + seen.shape[2:]), obs_rms)  # as the rollout computed them

        # statistics over the rollout: the observations it met and the discounted returns
        ret_rms, reward_scale = s["ret_rms"], 1.0
        if NORM_REWARD:
            ret_rms = rms_update(ret_rms, column("discounted_return").reshape(-1), column("valid").reshape(-1))
            reward_scale = 1.0 / jnp.sqrt(ret_rms[1] + 1e-8)
        new_obs_rms = obs_rms
        if p.normalise_obs:
            new_obs_rms = rms_update(obs_rms, next_raw_obs.reshape(T * N, -1).astype(jnp.float32), jnp.ones(T * N))

        # GAE; truncated episodes bootstrap from their final observation (the NEXT_STEP reset step
        # after it holds that observation, and is itself masked out of the loss)
        values = value(params, x).reshape(T + 1, N)

        def gae_step(last, t):
            step, value, next_value = t
            reward = step[:, SCALARS.index("reward")]
            if NORM_REWARD:
                reward = jnp.clip(reward * reward_scale, -REWARD_CLIP, REWARD_CLIP)
            terminated, done = step[:, SCALARS.index("terminated")], step[:, SCALARS.index("done")]
            delta = reward + GAMMA * next_value * (1.0 - terminated) - value
            last = delta + GAMMA * GAE_LAMBDA * (1.0 - done) * last
            return last, last

        _, advantages = jax.lax.scan(gae_step, jnp.zeros(N), (scalars, values[:-1], values[1:]), reverse=True)
        # the minibatches of all epochs, gathered at once from one matrix (a row per step and env)
        columns = [x[: T * N], actions.reshape(T * N, -1).astype(jnp.float32)] + [
            v.reshape(T * N, 1) for v in (column("logp"), column("valid"), advantages, values[:-1],
                                          advantages + values[:-1])]
        rows = jnp.concatenate(columns, -1)[orders.reshape(-1)].reshape(E * M, minibatch, -1)
        A = 1 if p.discrete else p.act_dim

        def loss_fn(flat, mb):
            x, action = mb[:, : p.obs_dim], mb[:, p.obs_dim: p.obs_dim + A]
            old_logp, w, adv, old_value, target = (mb[:, p.obs_dim + A + i] for i in range(5))
            action = action[:, 0].astype(jnp.int32) if p.discrete else action
            n = jnp.maximum(w.sum(), 1.0)  # reset steps (w = 0) carry no learning signal
            mean = lambda v: (w * v).sum() / n
            new_logp, entropy = log_prob_entropy(flat, network("actor", flat, x), action)
            log_ratio = new_logp - old_logp
            ratio = jnp.exp(log_ratio)
            adv_mean = mean(adv)
            adv_std = jnp.sqrt((w * (adv - adv_mean) ** 2).sum() / jnp.maximum(n - 1.0, 1.0))
            adv = (adv - adv_mean) / (adv_std + 1e-8)
            pg_loss = mean(jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1 - CLIP_COEF, 1 + CLIP_COEF)))
            new_value = value(flat, x)
            if CLIP_VLOSS:
                clipped = old_value + jnp.clip(new_value - old_value, -CLIP_COEF, CLIP_COEF)
                v_loss = 0.5 * mean(jnp.maximum((new_value - target) ** 2, (clipped - target) ** 2))
            else:
                v_loss = 0.5 * mean((new_value - target) ** 2)
            loss = pg_loss - ent_coef * mean(entropy) + VF_COEF * v_loss
            return loss, mean((ratio - 1) - log_ratio)

        def minibatch_step(carry, mb):  # the E epochs' minibatches in one scan
            flat, opt, stopped = carry
            (_, approx_kl), grads = jax.value_and_grad(loss_fn, has_aux=True)(flat, mb)
            step, new_opt = tx.update(grads, opt, flat)
            new_flat = flat - lr * step
            if TARGET_KL:  # past the target KL, the rest of the iteration's steps are skipped
                keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(stopped, b, a), new, old)
                new_flat, new_opt = keep(new_flat, flat), keep(new_opt, opt)
                stopped = stopped | (approx_kl > TARGET_KL)
            return (new_flat, new_opt, stopped), approx_kl

        (flat, opt, _), kls = jax.lax.scan(minibatch_step, (params, s["opt"], jnp.bool_(False)), rows)
        check_obs = next_raw_obs[::check_stride].reshape(s["check_obs"].shape)
        learned = {"params": flat, "opt": opt, "obs_rms": new_obs_rms, "ret_rms": ret_rms, "check_obs": check_obs}
        totals = scalars.sum((0, 1))  # one reduction for the three figures
        metrics = {"env_steps": totals[SCALARS.index("valid")], "return_sum": totals[SCALARS.index("finished_return")],
                   "episodes": totals[SCALARS.index("done")], "kl": kls[-1]}
        return learned, metrics

    def outputs(s, raw_obs):
        return network("actor", s["params"], features(raw_obs, s["obs_rms"]))

    def act(s, raw_obs):
        out = outputs(s, raw_obs)
        return jnp.argmax(out, -1) if p.discrete else out

    def to_torch(s, agent):
        """The trained weights into the torch Agent (the export); returns the obs normalisation."""
        trained = unravel(np.asarray(jax.device_get(s["params"])))  # sliced in numpy: no op to compile
        with torch.no_grad():
            for name, net in layers.items():
                for (sources, _), values in zip(net, trained[name]):
                    for key, (param, transposed) in sources.items():
                        array = np.array(values[key])  # a writable copy
                        param.copy_(torch.from_numpy(array.T if transposed else array).reshape(param.shape))
            if log_std is not None:
                log_std.copy_(torch.from_numpy(np.array(trained["log_std"])).reshape(log_std.shape))
        if not p.normalise_obs:
            return None
        mean, var = jax.device_get(s["obs_rms"][:2])
        return np.asarray(mean, np.float64), np.asarray(var, np.float64)

    return SimpleNamespace(params=flat_params, opt=opt, sample=sample, features=features, to_env=to_env,
                           rms_init=rms_init, random_bits=random_bits, orders=orders, record_step=record_step,
                           check_obs_init=check_obs_init, learn=learn, outputs=outputs, act=act, to_torch=to_torch,
                           num_weights=num_weights)


def learn_flops(learner, num_envs, num_steps, update_epochs):
    """The floating-point work of one rollout's policy and learning: 2 flops per weight and sample
    forward, 6 forward and backward. At 1 GFLOP/s (slower than any CPU core this runs on) it is the
    prior for the first update's time, before one was timed."""
    weights = learner.num_weights
    return (2 * num_steps * num_envs * (weights["actor"] + weights["critic"])
            + 6 * update_epochs * num_steps * num_envs * sum(weights.values()))


def make_jax_training(spec, problem, agent):
    """PPO for a functional JAX backend, PureJaxRL's shape (the jax-e2e path). Returns a namespace:
      state                      the initial training state (a pytree: weights, optimiser, envs, statistics)
      update(state, lr, ent)     one PPO iteration, pure: rollout (lax.scan over JAX_NUM_STEPS steps of
                                 JAX_NUM_ENVS vmapped envs), statistics, GAE, JAX_UPDATE_EPOCHS epochs;
                                 -> (state, metrics)
      env_step(key, ...)         the envs one step on (autoreset, time limit): what `update` calls
      outputs(state, raw_obs)    the actor's outputs (logits or action means) on raw observations
      act(state, raw_obs)        the trained policy: raw observations -> deterministic actions
      to_torch(state, agent)     copies the weights into the torch Agent, returns the obs normalisation
      first_update_seconds       a conservative estimate of the first update's time, before it is timed
    The learner is make_jax_learner's (shared with the jax-host path).
    Raises Untranslatable, before anything is compiled, for an Agent it cannot compute exactly."""
    import jax
    import jax.numpy as jnp

    from envs_fast.backend import load_functional
    from envs_fast.vector import derive_keys, max_episode_steps

    p = problem
    backend = load_functional(spec, ENV_ID)
    time_limit = max_episode_steps(ENV_ID) or evaluate.MAX_EPISODE_STEPS
    N, T, E = JAX_NUM_ENVS, JAX_NUM_STEPS, JAX_UPDATE_EPOCHS
    learner = make_jax_learner(p, agent, N, T, E, JAX_NUM_MINIBATCHES)

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
    obs_shape, env_shape = jax.eval_shape(jax.vmap(backend.reset), jax.ShapeDtypeStruct((N, 2), jnp.uint32))
    zeros = lambda tree: jax.tree_util.tree_map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), tree)
    envs = {"env": zeros(env_shape), "raw_obs": zeros(obs_shape), "elapsed": np.zeros(N, np.int32),
            "needs_reset": np.ones(N, bool),  # the previous step ended the episode: this one resets
            "episode_return": np.zeros(N, np.float32), "discounted_return": np.zeros(N, np.float32)}
    state = {"params": learner.params, "opt": learner.opt, "key": np.array([0, SEED], np.uint32), "envs": envs,
             "obs_rms": learner.rms_init((p.obs_dim,)), "ret_rms": learner.rms_init(()),
             "check_obs": learner.check_obs_init(obs_shape.shape[1:], obs_shape.dtype)}

    def update(s, lr, ent_coef):
        params, obs_rms = s["params"], s["obs_rms"]
        # The iteration's random numbers in one draw: uniform noise in (0, 1) for the actions (23 bits
        # + 1/2: exact in float32, never 0 or 1) and sort keys for the minibatch permutations
        key, env_key, next_key = derive_keys(s["key"], 3)
        bits = learner.random_bits(key, T * N * p.act_dim + E * T * N)
        noise = ((bits[: T * N * p.act_dim] >> 9).astype(jnp.float32) + 0.5).reshape(T, N, p.act_dim) / 2.0**23
        orders = learner.orders(bits[T * N * p.act_dim:])

        def rollout_step(e, noise_and_key):  # the weights and statistics are fixed during a rollout
            noise, env_key = noise_and_key
            action, logp = learner.sample(params, learner.features(e["raw_obs"], obs_rms), noise)
            raw_obs, env_state, reward, terminated, _, elapsed, done = env_step(
                env_key, e["env"], e["elapsed"], e["needs_reset"], learner.to_env(action))
            bookkeeping, scalars = learner.record_step(e, logp, reward, terminated, done)
            return {"env": env_state, "raw_obs": raw_obs, "elapsed": elapsed, **bookkeeping}, (raw_obs, action, scalars)

        envs, (next_raw_obs, actions, scalars) = jax.lax.scan(rollout_step, s["envs"], (noise, derive_keys(env_key, T)))
        learned, metrics = learner.learn(s, s["envs"]["raw_obs"], next_raw_obs, actions, scalars, orders, lr, ent_coef)
        return {**learned, "key": next_key, "envs": envs}, metrics

    # the first update's prior: learn_flops at 1 GFLOP/s, plus 2 us per env step
    return SimpleNamespace(state=state, update=update, env_step=env_step, outputs=learner.outputs, act=learner.act,
                           to_torch=learner.to_torch, num_envs=N, num_steps=T,
                           first_update_seconds=learn_flops(learner, N, T, E) / 1e9 + T * N * 2e-6)


def jax_host_num_envs():
    """The jax-host path's envs: NUM_ENVS x JAX_HOST_ENVS_FACTOR from a budget of JAX_HOST_BIG_BATCH_BUDGET,
    NUM_ENVS below it."""
    return NUM_ENVS * (JAX_HOST_ENVS_FACTOR if TIME_BUDGET >= JAX_HOST_BIG_BATCH_BUDGET else 1)


def make_jax_host_training(problem, agent, raw_obs_shape, raw_obs_dtype):
    """PPO with make_jax_learner's learner over envs stepped on the host (the jax-host path): the
    host path's algorithm and constants (NUM_STEPS, UPDATE_EPOCHS, NUM_MINIBATCHES) over
    jax_host_num_envs() envs, the learning in JAX. Returns a namespace:
      state                      the initial training state (weights, optimiser, statistics, bookkeeping)
      policy_step(params, obs_rms, raw_obs, noise) -> (N, 2W+1) float32 [action | env action | logp]
                                 (W = 1 for Discrete, the action size for Box): one call per env step
      env_actions(packed)        the env's actions from policy_step's output, as numpy
      draw_noise(rng)            a rollout's uniform(0, 1) action noise, (T, N, act_dim) float32
      learn(state, raw_obs, actions, logp, reward, terminated, truncated, lr, ent) -> (state, metrics):
                                 one rollout's arrays (raw_obs (T+1, N, ...); the others (T, N[, W]))
                                 as the vector env returned them: bookkeeping, statistics, GAE, epochs
      outputs, act, to_torch     as make_jax_training's
      width                      W
    Raises Untranslatable, before anything is compiled, for an Agent it cannot compute exactly."""
    import jax
    import jax.numpy as jnp

    from envs_fast.vector import derive_keys

    p = problem
    N, T, E = jax_host_num_envs(), NUM_STEPS, UPDATE_EPOCHS
    learner = make_jax_learner(p, agent, N, T, E, NUM_MINIBATCHES)
    width = 1 if p.discrete else p.act_dim
    # the envs were reset on the host: no env is due for a reset at the first step
    bookkeeping = {"needs_reset": np.zeros(N, bool), "episode_return": np.zeros(N, np.float32),
                   "discounted_return": np.zeros(N, np.float32)}
    state = {"params": learner.params, "opt": learner.opt, "key": np.array([0, SEED], np.uint32),
             "bookkeeping": bookkeeping, "obs_rms": learner.rms_init((p.obs_dim,)), "ret_rms": learner.rms_init(()),
             "check_obs": learner.check_obs_init(raw_obs_shape, raw_obs_dtype)}

    def policy_step(params, obs_rms, raw_obs, noise):
        action, logp = learner.sample(params, learner.features(raw_obs, obs_rms), noise)
        # one output array: each one the host reads back costs a transfer
        return jnp.concatenate([action.reshape(N, width).astype(jnp.float32),
                                learner.to_env(action).reshape(N, width).astype(jnp.float32), logp.reshape(N, 1)], -1)

    if p.discrete:
        env_actions = lambda packed: packed[:, 1].astype(np.int64)
    else:
        env_actions = lambda packed: packed[:, width:2 * width].reshape((N,) + p.act_space.shape)

    def draw_noise(rng):
        """23 random bits + 1/2 over 2^23: exact in float32, never 0 or 1 (as the jax-e2e path draws)."""
        return ((rng.integers(0, 2**23, (T, N, p.act_dim)) + 0.5) / 2.0**23).astype(np.float32)

    def learn(s, raw_obs, actions, logp, reward, terminated, truncated, lr, ent_coef):
        key, next_key = derive_keys(s["key"], 2)
        orders = learner.orders(learner.random_bits(key, E * T * N))

        def record(e, step):
            logp, reward, terminated, truncated = step
            return learner.record_step(e, logp, reward, terminated, terminated | truncated)

        bookkeeping, scalars = jax.lax.scan(record, s["bookkeeping"], (logp, reward, terminated, truncated))
        learned, metrics = learner.learn(s, raw_obs[0], raw_obs[1:], actions, scalars, orders, lr, ent_coef)
        return {**learned, "key": next_key, "bookkeeping": bookkeeping}, metrics

    return SimpleNamespace(state=state, policy_step=policy_step, env_actions=env_actions, draw_noise=draw_noise,
                           learn=learn, outputs=learner.outputs, act=learner.act, to_torch=learner.to_torch,
                           num_envs=N, num_steps=T, width=width)


def check_agent_glue(agent, problem):
    """The jax-e2e path computes what `jax_layers` translated, joined as the shipped Agent joins them:
    value(x) = critic(x)[..., 0], the policy Categorical(logits=actor(x)) or Normal(actor(x),
    exp(actor_logstd)). Refuse (Untranslatable) an Agent whose `value` or `distribution` computes
    something else, checked in torch on random inputs before anything is compiled (on a copy with
    weights of unit scale: the initial outputs are too close to zero to tell, e.g., tanh(out) from out)."""
    import copy

    x = 2.0 * torch.randn(16, problem.obs_dim, generator=torch.Generator().manual_seed(0))
    agent = copy.deepcopy(agent)
    kind = torch.distributions.Categorical if problem.discrete else torch.distributions.Normal
    with torch.no_grad():
        for param in agent.parameters():
            param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())))
        x = x.to(next(agent.parameters()).device)
        try:
            dist, out = agent.distribution(x), agent.actor(x)
            # (what, got, expected, the size float32 rounds at: log-softmax's grows with the logits')
            pairs = [("agent.value", agent.value(x), agent.critic(x)[..., 0], 1.0)]
            if type(dist) is kind and problem.discrete:
                pairs.append(("agent.distribution", dist.logits, torch.log_softmax(out, -1), float(out.abs().max())))
            elif type(dist) is kind:
                pairs += [("agent.distribution's mean", dist.mean, out, 1.0),
                          ("agent.distribution's std", dist.stddev, agent.actor_logstd.exp().expand_as(out), 1.0)]
        except Exception as exc:  # an Agent shaped differently (no actor_logstd, ...)
            raise Untranslatable(f"the jax-e2e path cannot evaluate this Agent as the shipped one: "
                                 f"{type(exc).__name__}: {exc} (BACKEND = \"reference\" trains any Agent)") from None
    if type(dist) is not kind:
        raise Untranslatable(f"agent.distribution returns a {type(dist).__name__}; the jax-e2e path trains a "
                             f"{kind.__name__} policy (BACKEND = \"reference\" trains any Agent)")
    for what, got, expected, size in pairs:
        # float32 rounding is relative to the size of what was summed: a wide layer of unit weights
        # gives logits in the tens, and log-softmax's shift by their logsumexp rounds at that size
        # (HIDDEN_SIZE 256 on CartPole was refused at a fixed 1e-6)
        if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-5, atol=1e-6 * max(1.0, size)):
            raise Untranslatable(f"{what} is not computed as the jax-e2e path computes it (value = critic(x)[..., 0], "
                                 f"policy from actor(x) and actor_logstd) (BACKEND = \"reference\" trains any Agent)")


def configure_compilation_cache(jax):
    """With $AUTORL_JAX_CACHE_DIR set, compiled programs go there (the runner gives each run an empty
    folder of its own, so a run finds nothing a previous one compiled: every run pays the same compile
    cost out of its budget)."""
    if JAX_CACHE_DIR:
        jax.config.update("jax_compilation_cache_dir", JAX_CACHE_DIR)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
        # counted so that the summary says whether this run compiled or read its programs back
        events = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}

        def count(event, **_):
            if event in events:
                COMPILE_CACHE[events[event]] += 1

        jax.monitoring.register_event_listener(count)


COMPILE_CACHE = {"hits": 0, "misses": 0}  # persistent compilation cache lookups (with $AUTORL_JAX_CACHE_DIR)


def train_jax(spec, problem, agent):
    """Compiles `update` once (the budget counts it), then calls it while the next call fits in the
    budget; the host only times the calls. Returns figures, the obs normalisation and what
    export_check compares the artifact with."""
    import jax

    configure_compilation_cache(jax)
    device = jax.devices()[0]
    print(f"jax-e2e path: jax on {device.platform} ({device})", flush=True)
    deadline = START + TIME_BUDGET
    compile_start = time.time()
    training = make_jax_training(spec, problem, agent)
    state = training.state
    # numpy scalars: a jnp one would be an op compiled on its own
    lr_at = lambda progress: np.float32(JAX_LEARNING_RATE * (max(1.0 - progress, 0.02) if ANNEAL_LR else 1.0))
    ent_at = lambda progress: np.float32(ENT_COEF * (1.0 - progress))
    # LLVM at -O1: a fifth less compiling than the default, and these kernels run as fast (measured)
    update = jax.jit(training.update, donate_argnums=0).lower(state, lr_at(0.0), ent_at(0.0)).compile(
        {"xla_backend_optimization_level": 1})
    start = time.time()
    compile_seconds = start - compile_start
    print(f"compiled the update in {compile_seconds:.1f}s ({time.time() - START:.1f}s since the process started)",
          flush=True)

    env_steps, updates, update_seconds, last_print = 0, 0, training.first_update_seconds, 0.0
    episode_log = []  # (sum of returns, episodes) per update
    while True:
        now = time.time()
        if now + update_seconds > deadline or steps_spent(env_steps, JAX_NUM_ENVS * JAX_NUM_STEPS):
            break
        progress = budget_progress(now, start, deadline, env_steps)
        state, metrics = update(state, lr_at(progress), ent_at(progress))
        metrics = jax.device_get(metrics)  # waits for the update: the timing is real
        took = time.time() - now
        # the first timing replaces the prior; then a slow call raises the estimate at once, a fast
        # one lowers it slowly
        update_seconds = took if updates == 0 else max(took, 0.9 * update_seconds)
        env_steps += int(metrics["env_steps"])
        updates += 1
        episode_log.append((float(metrics["return_sum"]), int(metrics["episodes"])))
        last_print = print_progress(last_print, updates, env_steps, start, episode_log, metrics)
    end = time.time()
    return jax_trained(training, state, agent, device, {
        "env_steps": env_steps, "training_seconds": end - start, "wall_seconds": end - START,
        "compile_seconds": compile_seconds, "updates": updates}, episode_log)


def host_rollout(training, envs, state, raw_obs, noise, buffers, give_up=lambda t: False):
    """One rollout of the jax-host path: per step, one call of the compiled policy and one step of the
    vector env, into `buffers` (raw_obs (T+1, N, ...), actions, logp, reward, terminated, truncated).
    The weights and statistics are fixed during a rollout. Returns the last raw observations, or None
    when give_up(t) says so before step t."""
    obs_buf, act_buf, logp_buf, rew_buf, term_buf, trunc_buf = buffers
    obs_buf[0] = raw_obs
    params, obs_rms = state["params"], state["obs_rms"]
    for t in range(training.num_steps):
        if give_up(t):
            return None
        packed = np.asarray(training.policy_step(params, obs_rms, obs_buf[t], noise[t]))
        obs_buf[t + 1], rew_buf[t], term_buf[t], trunc_buf[t], _ = envs.step(training.env_actions(packed))
        act_buf[t], logp_buf[t] = packed[:, :training.width], packed[:, -1]
    return obs_buf[-1].copy()


def train_jax_host(spec, problem, agent):
    """The jax-host path: the JAX learner (make_jax_host_training) over a vector env stepped from
    this Python loop. Stepping from the host was measured against jax's io_callback inside a
    lax.scan (BipedalWalker-v3, 32 envs, the policy MLP, 2 busy cores): the host loop 9.3k/9.7k
    steps/s on the Rust port/envpool, io_callback 6.3k/8.6k; the host loop also lets the first
    rollout be abandoned midway when it would overrun the budget. Compiling counts in the budget, and
    no iteration (rollout + learn) starts that would end past it."""
    import jax

    configure_compilation_cache(jax)
    device = jax.devices()[0]
    print(f"jax-host path: jax on {device.platform} ({device}), the envs stepped from the host", flush=True)
    deadline = START + TIME_BUDGET
    compile_start = time.time()
    obs_space = problem.obs_space  # the buffers take its dtype (the export check feeds these observations)
    training = make_jax_host_training(problem, agent, obs_space.shape, obs_space.dtype)  # may refuse the Agent
    state = training.state
    T, N, W = training.num_steps, training.num_envs, training.width
    envs = evaluate.make_vec_env(ENV_ID, N, SEED, backend=spec)
    raw_obs, _ = envs.reset(seed=SEED)
    rng = np.random.default_rng(SEED)
    lr_at = lambda progress: np.float32(LEARNING_RATE * (max(1.0 - progress, 0.02) if ANNEAL_LR else 1.0))
    ent_at = lambda progress: np.float32(ENT_COEF * (1.0 - progress))
    buffers = (np.zeros((T + 1, N) + obs_space.shape, obs_space.dtype), np.zeros((T, N, W), np.float32),
               np.zeros((T, N), np.float32), np.zeros((T, N), np.float32), np.zeros((T, N), bool),
               np.zeros((T, N), bool))
    options = {"xla_backend_optimization_level": 1}  # as train_jax: less compiling, kernels as fast
    noise = training.draw_noise(rng)
    policy_step = jax.jit(training.policy_step).lower(
        state["params"], state["obs_rms"], buffers[0][0], noise[0]).compile(options)
    learn = jax.jit(training.learn, donate_argnums=0).lower(state, *buffers, lr_at(0.0), ent_at(0.0)).compile(options)
    training.policy_step = policy_step  # host_rollout calls the compiled one from here on
    compile_seconds = time.time() - compile_start
    print(f"compiled the policy step and the learning in {compile_seconds:.1f}s "
          f"({time.time() - START:.1f}s since the process started)", flush=True)
    # The first iteration's learning, before any was timed: one `learn` on a copy of the state, 1.5x
    # (the probe trains nothing; the host path probes a gradient step alike). learn_flops at 1 GFLOP/s
    # was 20x too slow here (5 s for CartPole's 0.25 s) and left a 12 s budget untrained.
    learn_prior = 0.0
    if time.time() < deadline:
        probe_started = time.time()
        jax.block_until_ready(learn(jax.tree_util.tree_map(np.array, state), *buffers, lr_at(0.0), ent_at(0.0)))
        learn_prior = 1.5 * (time.time() - probe_started)
    start = time.time()

    env_steps, updates, iteration_seconds, last_print = 0, 0, None, 0.0
    probe_steps = min(T, 9)
    episode_log = []  # (sum of returns, episodes) per update
    while True:
        iteration_start = time.time()
        if iteration_start + (iteration_seconds or 0.0) > deadline or steps_spent(env_steps, T * N):
            break
        progress = budget_progress(iteration_start, start, deadline, env_steps)
        timing = {}

        def give_up(t):
            """The first rollout, before anything was timed: can it and its learning finish in time?
            Its first step may pay one-time costs, so the rate is taken from the steps after it."""
            if iteration_seconds is not None or t not in (1, probe_steps):
                return False
            if t == 1:
                timing["second_step"] = time.time()
                return False
            now = time.time()
            timing["estimate"] = (timing["second_step"] - iteration_start
                                  + (now - timing["second_step"]) * (T - 1) / (t - 1) + learn_prior)
            return iteration_start + timing["estimate"] > deadline

        last_obs = host_rollout(training, envs, state, raw_obs, noise, buffers, give_up)
        if last_obs is None:  # its steps are not counted: nothing was trained on them
            print(f"stopping: the first rollout and update need ~{timing['estimate']:.1f}s, "
                  f"{deadline - iteration_start:.1f}s were left", flush=True)
            break
        raw_obs = last_obs
        state, metrics = learn(state, *buffers, lr_at(progress), ent_at(progress))
        metrics = jax.device_get(metrics)  # waits for the learning: the timing is real
        noise = training.draw_noise(rng)
        # a slow iteration raises the estimate at once, a fast one lowers it slowly
        iteration_seconds = max(time.time() - iteration_start, 0.9 * (iteration_seconds or 0.0))
        env_steps += int(metrics["env_steps"])
        updates += 1
        episode_log.append((float(metrics["return_sum"]), int(metrics["episodes"])))
        last_print = print_progress(last_print, updates, env_steps, start, episode_log, metrics)
    end = time.time()
    envs.close()
    return jax_trained(training, state, agent, device, {
        "env_steps": env_steps, "training_seconds": end - start, "wall_seconds": end - START,
        "compile_seconds": compile_seconds, "updates": updates}, episode_log)


def jax_trained(training, state, agent, device, figures, episode_log):
    """What a JAX path returns to main: its figures, and what the export and its check need."""
    import jax

    obs_normalisation = training.to_torch(state, agent)  # the export is the host path's
    outputs = jax.jit(training.outputs)
    return {
        "figures": {"device": device.platform, **figures,
                    "episode_return": recent_mean(episode_log), "episodes": sum(n for _, n in episode_log)},
        "obs_normalisation": obs_normalisation, "check_observations": np.asarray(state["check_obs"]),
        "policy_outputs": lambda raw: np.asarray(outputs(state, raw)), "state": state, "training": training,
    }


def print_progress(last_print, updates, env_steps, start, episode_log, metrics):
    """A progress line of a JAX path at most once a second; returns when the last one was printed."""
    if time.time() - last_print < 1.0:
        return last_print
    now = time.time()
    print(f"update {updates} steps {env_steps} sps {env_steps / (now - start):.0f} "
          f"return(last 20 episodes) {recent_mean(episode_log):.2f} kl {float(metrics['kl']):.4f} "
          f"time {now - START:.1f}s", flush=True)
    return now


def recent_mean(episode_log, episodes=20):
    """Mean return of (about) the last `episodes` episodes from per-update (sum, count) pairs."""
    total, count = 0.0, 0
    for return_sum, n in reversed(episode_log):
        total, count = total + return_sum, count + n
        if count >= episodes:
            break
    return total / count if count else float("nan")


# ---------------------------------------------------------------- export, its check, and the summary
def export(problem, agent, obs_normalisation, path):
    """TorchScript: the training's preprocessing baked in, deterministic actions."""
    p = problem
    policy = ExportedPolicy(agent.actor, obs_normalisation, p.num_obs_categories, p.discrete)
    policy.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # TorchScript is deprecated upstream but is the artifact format
        warnings.simplefilter("ignore", DeprecationWarning)
        # Traced, not scripted: tracing needs no source file, so the export cannot break if
        # train.py changes on disk while it runs.
        example = torch.as_tensor(np.stack([p.obs_space.sample() for _ in range(2)]), dtype=torch.float32)
        # check_trace=False: torch's own check imports torch.distributed (a second); check_export is stronger
        torch.jit.save(torch.jit.trace(policy, example, check_trace=False), str(path))


def check_export(path, problem, observations, policy_outputs):
    """(ok, line): the artifact, reloaded as the harness loads it, against the trained policy on
    observations from training. Box actions: max |difference| within EXPORT_TOLERANCE (+1e-5 x
    |action|); Discrete: the same action, up to ties (the action exported scores within TIE_TOLERANCE
    of the policy's best logit; the |diff| printed is that logit gap)."""
    count = len(observations)
    try:
        exported = evaluate.load_policy(path)(np.array(observations, np.float32))  # the harness feeds float32
    except evaluate.HarnessError as exc:
        return False, f"export_check: FAILED ({exc})"
    expected = np.asarray(policy_outputs(observations), np.float64)
    if problem.discrete:
        exported = np.asarray(exported)
        if exported.shape != (count,) or not np.all(np.isin(exported, np.arange(problem.act_dim))):
            return False, f"export_check: FAILED (the export returns {exported.shape} {exported.dtype} actions, " \
                          f"expected ({count},) indices below {problem.act_dim})"
        diff = expected.max(-1) - np.take_along_axis(expected, exported.astype(np.int64)[:, None], -1)[:, 0]
        wrong = ~(diff <= TIE_TOLERANCE)
    else:
        if exported.shape != expected.shape:
            return False, f"export_check: FAILED (the export returns actions of shape {exported.shape}, " \
                          f"the trained policy {expected.shape})"
        diff = np.abs(exported - expected).reshape(count, -1)
        wrong = ~(diff <= EXPORT_TOLERANCE + 1e-5 * np.abs(expected).reshape(count, -1)).all(-1)
        diff = diff.max(-1)
    worst = float(np.nanmax(diff)) if np.isfinite(diff).any() else float("nan")
    if wrong.any():
        return False, (f"export_check: FAILED (max |diff| {worst:.3g} over {count} observations, {int(wrong.sum())} "
                       f"beyond tolerance): policy.pt does not act as the trained policy")
    return True, f"export_check: ok (max |diff| {worst:.2g} over {count} observations)"


def main():
    torch.set_num_threads(TORCH_THREADS)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    problem = Problem(ENV_ID)
    spec, why = choose_backend()
    path, path_why = choose_path(spec)
    print(f"backend {spec} ({why}) -> path {path} ({path_why})", flush=True)
    agent = Agent(problem.obs_dim, problem.act_dim, problem.discrete)
    trainers = {"jax-e2e": train_jax, "jax-host": train_jax_host, "host": train_host}
    try:
        trained = trainers[path](spec, problem, agent)
    except Untranslatable as exc:
        if path == "jax-host" and LEARNER == "auto":  # chosen for speed only: the torch learner trains any Agent
            print(f"jax-host path refused ({exc}): the host path trains instead", flush=True)
            path, trained = "host", train_host(spec, problem, agent)
        else:
            hint = " (LEARNER = \"torch\" trains any Agent)" if path == "jax-host" else ""
            print(f"refused: {exc}{hint}", flush=True)
            return 1
    policy_path = OUTPUT_DIR / "policy.pt"
    export(problem, agent, trained["obs_normalisation"], policy_path)
    ok, check_line = check_export(policy_path, problem, trained["check_observations"], trained["policy_outputs"])

    figures = trained["figures"]
    print("---")
    print(f"env_id: {ENV_ID}")
    print(f"backend: {spec}")
    print(f"backend_reason: {why}")
    print(f"path: {path}")
    print(f"device: {figures['device']}")
    print(f"env_steps: {figures['env_steps']}")
    print(f"sps: {(figures['env_steps'] - figures.get('resumed_at', 0)) / max(figures['training_seconds'], 1e-9):.0f}")
    if figures.get("resumed_at"):
        print(f"resumed_at: {figures['resumed_at']}")
    print(f"training_seconds: {figures['training_seconds']:.1f}")
    print(f"wall_seconds: {figures['wall_seconds']:.1f}")
    if "compile_seconds" in figures:
        print(f"compile_seconds: {figures['compile_seconds']:.2f}")
    if JAX_CACHE_DIR and path != "host":
        print(f"compile_cache: {COMPILE_CACHE['hits']} read, {COMPILE_CACHE['misses']} compiled")
    print(f"updates: {figures['updates']}")
    print(f"episode_return: {figures['episode_return']:.2f}")
    print(f"episodes: {figures['episodes']}")
    print(check_line, flush=True)  # the last line: on FAILED, what the daemon records as the crash's reason
    return 0 if ok else 1


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # skips the interpreter's teardown of torch and jax (1-2 s); everything is written
