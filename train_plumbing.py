"""train.py's fixed plumbing: what every training run needs and no experiment may change (a train
experiment that edits this file is `invalid`, as one that edits evaluate.py). candidate/train.py
holds the PPO; this module holds the run's variables, the budget clock, the choice of the verified
backend, the JAX compilation cache, the learning-curve lines and the check of the exported policy
(the export itself: policy_export.py).

Imported before anything heavy (numpy, torch and jax are imported where they are used), so that the
budget clock train.py starts from it counts the heavy imports.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

# ---------------------------------------------------------------- the run's variables (set by the daemon)
ENV_ID = os.environ.get("AUTORL_ENV_ID", "BipedalWalker-v3")
TIME_BUDGET = float(os.environ.get("AUTORL_TIME_BUDGET", 720))  # seconds, as evaluate.TIME_BUDGET
TIME_BUDGET = int(TIME_BUDGET) if TIME_BUDGET.is_integer() else TIME_BUDGET
SEED = int(os.environ.get("AUTORL_SEED", 1))
OUTPUT_DIR = Path(os.environ.get("AUTORL_OUTPUT_DIR", "out"))
# A step budget beside the time budget (0: none), for comparisons at equal env steps: verification's
# L4 trains a backend and the reference for the same steps. Set by whoever runs this, never by a night.
MAX_ENV_STEPS = int(os.environ.get("AUTORL_MAX_ENV_STEPS", 0))
JAX_CACHE_DIR = os.environ.get("AUTORL_JAX_CACHE_DIR")  # the runner's compilation cache (empty for every run)
# A run longer than one sitting (verification's L4 on a slow backend: hours) saves its training here
# every CHECKPOINT_SECONDS and, started again, goes on from it. Never set by a night.
CHECKPOINT_DIR = os.environ.get("AUTORL_CHECKPOINT_DIR")
CHECKPOINT_SECONDS = float(os.environ.get("AUTORL_CHECKPOINT_SECONDS", 300))
# vector backends stepped from a Python loop; every other spec but a Rust port (`.rs`) is functional JAX
HOST_SPECS = ("envpool", "gymnasium", "reference", "mujoco_batch")
EXPORT_TOLERANCE = 1e-4  # export_check: max |action difference| for Box actions (+1e-5 x |action|)
TIE_TOLERANCE = 1e-5  # export_check, Discrete actions: a logit this close to the best is a tie
# export_check also allows ROUNDING_FACTOR x how far the trained policy itself moves when its
# observations move by ROUNDING_PROBE (relative: a few float32 ulps). XLA and TorchScript round
# differently (accumulation order, tanh); a policy whose normalisation divides by a near-zero spread,
# or whose large weights cancel, turns that into more than EXPORT_TOLERANCE: a Pendulum policy kept
# by a night failed its export by 2.7e-4 on 1 of 1024 observations.
ROUNDING_PROBE = 2.0 ** -21
ROUNDING_FACTOR = 16.0
ROUNDING_DRAWS = 8


# ---------------------------------------------------------------- the budget clock
def process_start_time() -> float:
    """When this process started, as a time.time() value: Linux's /proc/self/stat (field 22, clock
    ticks since boot), else now. The budget counts from here: imports, building the envs and
    compiling are part of it."""
    now = time.time()
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # fields after the command's ")" start at 3
        started = now - time.clock_gettime(time.CLOCK_BOOTTIME) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return started if 0 <= now - started < 600 else now  # a clock that disagrees is not trusted


def budget_progress(now: float, start: float, deadline: float, env_steps: int,
                    max_env_steps: int | None = None) -> float:
    """How far training is through its budget, 0 to 1 (what learning rates and entropy anneal over):
    the time left when training started, or with MAX_ENV_STEPS its env steps, whichever is further."""
    max_env_steps = MAX_ENV_STEPS if max_env_steps is None else max_env_steps
    progress = (now - start) / max(deadline - start, 1e-9)
    if max_env_steps:
        progress = max(progress, env_steps / max_env_steps)
    return min(1.0, progress)


def steps_spent(env_steps: int, next_steps: int, max_env_steps: int | None = None) -> bool:
    """With MAX_ENV_STEPS, whether an iteration of `next_steps` more env steps would pass it."""
    max_env_steps = MAX_ENV_STEPS if max_env_steps is None else max_env_steps
    return bool(max_env_steps) and env_steps + next_steps > max_env_steps


# ---------------------------------------------------------------- the verified backend
def choose_backend(backend: str, env_id: str, num_envs: int) -> tuple[str, str]:
    """(spec, why): the backend training uses, and why. "auto" is the fastest verified backend; a
    backend set by hand is used only if this run verified it (envs_fast.training_refusal: a passing
    cached verdict; envpool unless one fails), else the reference. envs_fast.make_vec_env and
    load_functional apply the same rule in a training run."""
    import evaluate

    try:
        import envs_fast
    except ImportError:  # a checkout without envs_fast: what the harness would do
        spec = evaluate._auto_backend(env_id, num_envs) if backend == "auto" else backend
        return spec, "envs_fast is not importable"
    if backend == "auto":
        return envs_fast.choose_backend(env_id, num_envs), "envs_fast.choose_backend: the fastest verified backend"
    from envs_fast.protocol import resolve_spec

    refusal = envs_fast.training_refusal(backend, env_id)
    if refusal:
        return "reference", f"BACKEND = {backend!r} is not verified in this run ({refusal}): training on the reference"
    return resolve_spec(backend, env_id), "BACKEND is set in train.py (verified in this run)"


def is_jax_functional(spec: str) -> bool:
    """True for a JAX translation file or gymnax (trained end to end under jit); False for host
    backends (a Rust translation `.rs` is a native vector env: a Python loop steps it)."""
    return spec not in HOST_SPECS and not str(spec).endswith(".rs")


# ---------------------------------------------------------------- JAX's compilation cache
COMPILE_CACHE = {"hits": 0, "misses": 0}  # persistent compilation cache lookups (with $AUTORL_JAX_CACHE_DIR)


def configure_compilation_cache(jax) -> None:
    """With $AUTORL_JAX_CACHE_DIR set, compiled programs go there (the runner gives each run an empty
    folder of its own, so a run finds nothing a previous one compiled: every run pays the same compile
    cost out of its budget), and COMPILE_CACHE counts what was read back and what compiled."""
    if not JAX_CACHE_DIR:
        return
    jax.config.update("jax_compilation_cache_dir", JAX_CACHE_DIR)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    events = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}

    def count(event, **_):
        if event in events:
            COMPILE_CACHE[events[event]] += 1

    jax.monitoring.register_event_listener(count)


# ---------------------------------------------------------------- the learning curve
def recent_mean(episode_log, episodes: int = 20) -> float:
    """Mean return of (about) the last `episodes` episodes from per-update (sum of returns, count) pairs."""
    total, count = 0.0, 0
    for return_sum, n in reversed(episode_log):
        total, count = total + return_sum, count + n
        if count >= episodes:
            break
    return total / count if count else float("nan")


def print_progress(last_print: float, updates: int, env_steps: int, start: float, process_start: float,
                   episode_log, kl: float, resumed_at: int = 0) -> float:
    """The curve line the morning report draws, at most once a second; returns when it last printed:
    `update N steps S sps X return(last 20 episodes) R kl K time Ts` (sps: the steps since training
    started, or was resumed at `resumed_at` steps, over the time since)."""
    now = time.time()
    if now - last_print < 1.0:
        return last_print
    print(f"update {updates} steps {env_steps} sps {(env_steps - resumed_at) / max(now - start, 1e-9):.0f} "
          f"return(last 20 episodes) {recent_mean(episode_log):.2f} kl {kl:.4f} "
          f"time {now - process_start:.1f}s", flush=True)
    return now


# ---------------------------------------------------------------- the export's check
def check_export(path: Path, discrete: bool, num_actions: int, observations, policy_outputs) -> tuple[bool, str]:
    """(ok, line): the artifact at `path`, reloaded as the harness loads it (its op allow-list
    included), against the trained policy on observations from training. `policy_outputs(obs)` is
    the trained policy's: actions for Box, logits for Discrete. Box: max |difference| within
    EXPORT_TOLERANCE (+1e-5 x |action|); Discrete: the same action up to ties (the exported action
    scores within TIE_TOLERANCE of the best logit; the |diff| printed is that logit gap). Both widen
    by the policy's own float32 sensitivity where it has one (`rounding_sensitivity`)."""
    import numpy as np

    import evaluate

    count = len(observations)
    try:
        exported = evaluate.load_policy(path)(np.array(observations, np.float32))  # the harness feeds float32
    except evaluate.HarnessError as exc:
        return False, f"export_check: FAILED ({exc})"
    expected = np.asarray(policy_outputs(observations), np.float64)
    slack = ROUNDING_FACTOR * rounding_sensitivity(policy_outputs, observations, expected)
    if discrete:
        exported = np.asarray(exported)
        if exported.shape != (count,) or not np.all(np.isin(exported, np.arange(num_actions))):
            return False, (f"export_check: FAILED (the export returns {exported.shape} {exported.dtype} actions, "
                           f"expected ({count},) indices below {num_actions})")
        diff = expected.max(-1) - np.take_along_axis(expected, exported.astype(np.int64)[:, None], -1)[:, 0]
        wrong = ~(diff <= TIE_TOLERANCE + 2 * slack.max(-1))   # the best logit and the chosen one, each off
    else:
        if exported.shape != expected.shape:
            return False, (f"export_check: FAILED (the export returns actions of shape {exported.shape}, "
                           f"the trained policy {expected.shape})")
        diff = np.abs(exported - expected).reshape(count, -1)
        allowed = EXPORT_TOLERANCE + 1e-5 * np.abs(expected) + slack
        wrong = ~(diff <= allowed.reshape(count, -1)).all(-1)
        diff = diff.max(-1)
    worst = float(np.nanmax(diff)) if np.isfinite(diff).any() else float("nan")
    if wrong.any():
        return False, (f"export_check: FAILED (max |diff| {worst:.3g} over {count} observations, {int(wrong.sum())} "
                       f"beyond tolerance): policy.pt does not act as the trained policy")
    return True, f"export_check: ok (max |diff| {worst:.2g} over {count} observations)"


def rounding_sensitivity(policy_outputs, observations, expected):
    """Per observation and output: the most the trained policy moves (ROUNDING_DRAWS draws) when each
    input moves by up to ROUNDING_PROBE of its largest magnitude in the batch: the scale on which two
    float32 implementations of it can honestly disagree. Near zero for most policies; an export that
    acts otherwise stays far outside it."""
    import numpy as np

    rng = np.random.default_rng(0)
    obs = np.asarray(observations, np.float64)
    scale = np.abs(obs).max(0)   # per input, its largest magnitude: rounding (obs - mean) is relative to it
    worst = np.zeros_like(expected)
    for _ in range(ROUNDING_DRAWS):
        nudged = (obs + ROUNDING_PROBE * scale * rng.uniform(-1, 1, obs.shape)).astype(np.float32)
        worst = np.maximum(worst, np.abs(np.asarray(policy_outputs(nudged), np.float64) - expected))
    return worst


# ---------------------------------------------------------------- the budget loop
def train_within_budget(iterate, state, iteration_steps: int, process_start: float, start: float,
                        rollout_steps: int | None = None, learn_seconds: float = 0.0, restart_episodes=None):
    """Calls `iterate` while the next call fits in the budget (TIME_BUDGET from `process_start`; and
    MAX_ENV_STEPS), prints the curve line, saves checkpoints, and returns (state, figures).

    `iterate(state, progress)` runs one iteration and returns (state, metrics: env_steps, return_sum,
    episodes, kl). A loop that steps envs from the host passes `rollout_steps` (T): its iterate takes
    a third argument, give_up(t), which says before step t of the first rollout (before any iteration
    was timed) whether it and `learn_seconds` of learning would end past the budget; iterate then
    returns None, and nothing of it is counted. With CHECKPOINT_DIR (and `restart_episodes(state,
    seed)`, which starts new episodes for a resumed run) the state is saved every CHECKPOINT_SECONDS
    and a run started again goes on from it."""
    import jax

    deadline = process_start + TIME_BUDGET
    env_steps, updates, seconds, last_print, episode_log = 0, 0, None, 0.0, []
    checkpoint = Checkpoint(CHECKPOINT_DIR) if CHECKPOINT_DIR and restart_episodes else None
    restored = checkpoint.restore() if checkpoint else None
    if restored:
        state, (env_steps, updates, episode_log) = restored
        state = restart_episodes(state, SEED + 7919 * updates)  # not the first run's episodes again
        print(f"resumed from {checkpoint.path}: {env_steps} env steps, {updates} updates", flush=True)
    resumed_at = env_steps
    while True:
        now = time.time()
        if now + (seconds or 0.0) > deadline or steps_spent(env_steps, iteration_steps):
            break
        progress = budget_progress(now, start, deadline, env_steps)
        if rollout_steps is None:
            done = iterate(state, progress)
        else:
            timing, T = {}, rollout_steps

            def give_up(t):
                """Its first step may pay one-time costs: the rate is taken from the steps after it."""
                if seconds is not None or t not in (1, min(T, 9)):
                    return False
                if t == 1:
                    timing["second"] = time.time()
                    return False
                timing["estimate"] = (timing["second"] - now + (time.time() - timing["second"]) * (T - 1) / (t - 1)
                                      + learn_seconds)
                return now + timing["estimate"] > deadline

            done = iterate(state, progress, give_up)
            if done is None:
                print(f"stopping: the first rollout and update need ~{timing['estimate']:.1f}s, "
                      f"{deadline - now:.1f}s were left", flush=True)
                break
        state, metrics = done
        metrics = jax.device_get(metrics)  # waits for the iteration: the timing is real
        took = time.time() - now  # a slow iteration raises the estimate at once, a fast one lowers it slowly
        seconds = took if seconds is None else max(took, 0.9 * seconds)
        env_steps, updates = env_steps + int(metrics["env_steps"]), updates + 1
        episode_log.append((float(metrics["return_sum"]), int(metrics["episodes"])))
        last_print = print_progress(last_print, updates, env_steps, start, process_start, episode_log,
                                    float(metrics["kl"]), resumed_at)
        if checkpoint and checkpoint.due():
            checkpoint.save(state, (env_steps, updates, episode_log))
    end = time.time()
    return state, {"env_steps": env_steps, "updates": updates, "resumed_at": resumed_at,
                   "training_seconds": end - start, "wall_seconds": end - process_start,
                   "episode_return": recent_mean(episode_log), "episodes": sum(n for _, n in episode_log)}


# ---------------------------------------------------------------- checkpoints of a long run
class Checkpoint:
    """A training state (a pytree of arrays) and the run's counters in CHECKPOINT_DIR/training.pkl,
    saved every CHECKPOINT_SECONDS: a run stopped midway (verification's L4 trains for hours on a
    slow port) goes on from it when started again. A kill while saving leaves the last one whole."""

    def __init__(self, directory):
        self.path = Path(directory) / "training.pkl"
        self.saved_at = time.time()

    def due(self) -> bool:
        return time.time() - self.saved_at >= CHECKPOINT_SECONDS

    def save(self, state, counters) -> None:
        import pickle

        import jax
        import numpy as np

        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        with open(partial, "wb") as file:
            pickle.dump((jax.tree_util.tree_map(np.asarray, jax.device_get(state)), counters), file)
        os.replace(partial, self.path)
        self.saved_at = time.time()

    def restore(self):
        """(state, counters) as saved, or None when there is no checkpoint."""
        import pickle

        if not self.path.exists():
            return None
        with open(self.path, "rb") as file:
            return pickle.load(file)


# ---------------------------------------------------------------- compiling, and cheap random numbers
class Refused(Exception):
    """What train.py cannot train (a learner JAX cannot compile): the run fails before training, in one line."""


def compile_or_refuse(fn, *args, donate: bool = False):
    """`fn` jitted and compiled for `args` (LLVM at -O1: a fifth less compiling than the default, and
    the kernels run as fast, measured); an `fn` JAX cannot trace raises Refused naming why."""
    import jax

    try:
        lowered = jax.jit(fn, donate_argnums=0 if donate else ()).lower(*args)
    except Exception as exc:  # an edit JAX cannot trace: a shape, a dtype, Python control flow on a tracer
        raise Refused(f"the learner does not compile: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}") \
            from exc
    return lowered.compile({"xla_backend_optimization_level": 1})


def random_bits(key, count: int):
    """`count` random uint32 from a counter-based hash of (key: uint32[2], index): one elementwise op
    where a jax.random call site would compile a threefry loop (compiling counts in the budget)."""
    import jax.numpy as jnp

    from envs_fast.backends.jax_vector import mix32

    index = jnp.arange(count, dtype=jnp.uint32)
    return mix32(key[0] ^ mix32(index * jnp.uint32(0x9E3779B1) + key[1]))


def uniform_noise(bits):
    """Uniform (0, 1) noise from uint32 bits (numpy or JAX): 23 bits + 1/2 over 2^23, exact in float32,
    never 0 or 1 (a Gaussian's inverse CDF and a Gumbel's log-log stay finite)."""
    import numpy as np

    return ((bits >> 9).astype(np.float32) + np.float32(0.5)) / np.float32(2.0**23)


# ---------------------------------------------------------------- the summary the daemon reads
def print_summary(choice: dict, figures: dict, check_line: str) -> None:
    """`---`, then `key: value` lines (`choice`: the backend and path and why; then the training's
    figures), then the export check's line last: on FAILED, what the daemon records as the crash's
    reason. The daemon, the report and program.md read these names."""
    steps, seconds = figures["env_steps"], max(figures["training_seconds"], 1e-9)
    lines = {"env_id": ENV_ID, **choice, "device": figures["device"], "env_steps": steps,
             "sps": f"{(steps - figures.get('resumed_at', 0)) / seconds:.0f}", "resumed_at": figures.get("resumed_at") or None,
             "training_seconds": f"{figures['training_seconds']:.1f}", "wall_seconds": f"{figures['wall_seconds']:.1f}",
             "compile_seconds": f"{figures['compile_seconds']:.2f}",
             "compile_cache": f"{COMPILE_CACHE['hits']} read, {COMPILE_CACHE['misses']} compiled" if JAX_CACHE_DIR else None,
             "updates": figures["updates"], "episode_return": f"{figures['episode_return']:.2f}",
             "episodes": figures["episodes"]}
    print("---")
    print("\n".join(f"{key}: {value}" for key, value in lines.items() if value is not None))
    print(check_line, flush=True)
