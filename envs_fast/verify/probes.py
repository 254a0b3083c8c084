"""Where L2 looks: states taken from real reference rollouts (random and scripted actions), plus
states found near every termination and clipping boundary by searching each state component
outward from real states and bisecting where the reference's termination flips."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import jax
import numpy as np

from envs_fast.protocol import BatchedBackend, FunctionalBackend


# A boundary search is bounded by counts alone (components, doublings, flips, bisections, and values
# within `reach` of what rollouts visit), never by the clock: it once stopped where one reference sample
# took over 50 ms, then 1 s, and on a busy machine (Box2D stepping a body written metres from its
# joints, with hundreds of broad-phase pairs) it checked fewer states than on a quiet one, so L2's
# states, and once its verdict, depended on the machine's load. Its worst case is a bounded number of
# reference steps, each bounded by the values it writes.
SENSITIVITY_STEP = 2.0**-20  # relative: 8 float32 roundings


@dataclass
class Sample:
    """One reference step from a state the backend can be synced to."""
    state: Any  # backend state pytree (numpy leaves), read back from the reference
    action: Any
    obs: Any
    reward: float
    terminated: bool
    next_state: Any
    origin: str  # where the state came from, for the report
    # How far the reference's own outputs move when the state moves by SENSITIVITY_STEP (about 8
    # float32 roundings; largest over two perturbations), one flat vector over obs, reward,
    # terminated, next state.
    sensitivity: np.ndarray | None = None


def numpy_tree(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return jax.tree_util.tree_unflatten(treedef, [np.array(leaf) for leaf in leaves])


def _scalars(leaves: list) -> np.ndarray | None:
    """The leaves as one float64 vector when every one is a number (a Rust port's State: a tuple of
    ~1,500 of them, which a leaf-by-leaf loop spent most of L2's time on), else None."""
    if not leaves:
        return None
    try:  # one C call; per-leaf checks cost as much as the loop this replaces
        values = np.asarray(leaves, dtype=np.float64)
    except (TypeError, ValueError):  # leaves of different shapes
        return None
    return values if values.shape == (len(leaves),) else None


def field_names(tree) -> list[str]:
    """Readable per-element names of a pytree's leaves, e.g. `.theta_dot` or `[0][2]`."""
    names = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        base = jax.tree_util.keystr(path)
        size = int(np.size(leaf))
        names.extend([base] if np.ndim(leaf) == 0 else [f"{base}[{i}]" for i in range(size)])
    return names


def flat_values(tree) -> np.ndarray:
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        return np.zeros(0)
    scalars = _scalars(leaves)
    if scalars is not None:
        return scalars
    return np.concatenate([np.asarray(leaf, dtype=np.float64).ravel() for leaf in leaves])


class ReferenceStepper:
    """Steps the reference env from states written by the backend's `state_to_reference`."""

    def __init__(self, env_id: str, backend: BatchedBackend | FunctionalBackend):  # only its state sync is used
        self.env = gym.make(env_id)
        self.unwrapped = self.env.unwrapped
        self.backend = backend
        self._rng = np.random.default_rng(0)
        self.last_error = ""

    def reset(self, seed: int):
        self.env.reset(seed=seed)
        return self.read_state()

    def read_state(self):
        return numpy_tree(self.backend.state_from_reference(self.env))

    def write_state(self, state):
        self.backend.state_to_reference(state, self.env)
        return self.read_state()  # the canonical form both sides will start from

    def step(self, action):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obs, reward, terminated, _truncated, _info = self.unwrapped.step(action)
        return obs, float(reward), bool(terminated), self.read_state()

    def sample(self, state, action, origin: str, sensitivity: bool = True) -> Sample | None:
        """A Sample from `state` (None when the reference rejects it or produces non-finite values)."""
        try:
            start = self.write_state(state)
            obs, reward, terminated, next_state = self.step(action)
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None
        outcome = _outcome_vector(obs, reward, terminated, next_state)
        if not np.all(np.isfinite(outcome)):
            return None
        result = Sample(start, action, numpy_tree(obs), reward, terminated, next_state, origin)
        if sensitivity:
            result.sensitivity = np.zeros_like(outcome)
            for sign in (1.0, -1.0):
                try:
                    self.write_state(perturb_float32(start, self._signs(start) * sign, SENSITIVITY_STEP))
                    moved = _outcome_vector(*self.step(action))
                except Exception:
                    continue
                if moved.shape == outcome.shape:
                    result.sensitivity = np.fmax(result.sensitivity, np.abs(moved - outcome))
        return result

    def _signs(self, state):
        return self._rng.choice([-1.0, 1.0], size=flat_values(state).size)

    def close(self):
        self.env.close()


def _outcome_vector(obs, reward, terminated, next_state) -> np.ndarray:
    return np.concatenate([flat_values(obs), [float(reward), float(terminated)], flat_values(next_state)])


def perturb_float32(state, signs: np.ndarray, relative: float = 2.0**-23):
    """The state with every float component moved by `relative` (default: one float32 rounding)."""
    leaves, treedef = jax.tree_util.tree_flatten(state)
    dtypes = {getattr(leaf, "dtype", None) for leaf in leaves}
    scalars = _scalars(leaves) if len(dtypes) == 1 and None not in dtypes else None
    if scalars is not None and next(iter(dtypes)).kind == "f":  # numbers of one float type: as one vector
        moved = (scalars * (1.0 + signs[:len(leaves)] * relative)).astype(next(iter(dtypes)))
        return jax.tree_util.tree_unflatten(treedef, [np.asarray(value) for value in moved])
    out, offset = [], 0
    for leaf in leaves:
        leaf = np.asarray(leaf)
        size = leaf.size
        if leaf.dtype.kind == "f":
            factor = 1.0 + signs[offset:offset + size].reshape(leaf.shape) * relative
            leaf = (leaf.astype(np.float64) * factor).astype(leaf.dtype)
        out.append(leaf)
        offset += size
    return jax.tree_util.tree_unflatten(treedef, out)


def probe_actions(space: gym.Space, rng: np.random.Generator, include_outside: bool = True) -> list:
    """Actions worth trying in every boundary state: all discrete actions, or a Box's corners,
    centre, a random point and (where the reference accepts them) values outside the bounds."""
    if isinstance(space, gym.spaces.Discrete):
        values = range(space.start, space.start + space.n) if space.n <= 16 else \
            sorted(set(int(v) for v in rng.integers(space.start, space.start + space.n, 8)))
        return [np.int64(v) for v in values]
    if isinstance(space, gym.spaces.Box):
        low = np.where(np.isfinite(space.low), space.low, -1.0).astype(space.dtype)
        high = np.where(np.isfinite(space.high), space.high, 1.0).astype(space.dtype)
        actions = [low, high, np.clip(np.zeros_like(low), low, high), space.sample()]
        if include_outside and np.issubdtype(space.dtype, np.floating):
            width = high - low
            actions += [(low - 0.5 * width).astype(space.dtype), (high + 0.5 * width).astype(space.dtype)]
        return actions
    return [space.sample() for _ in range(4)]


def scripted_plans(space: gym.Space) -> list[tuple[str, Any]]:
    """Action schedules that drive an env to its edges: each constant extreme, and alternations."""
    if isinstance(space, gym.spaces.Discrete):
        extremes = [np.int64(space.start + i) for i in range(min(space.n, 8))]
    elif isinstance(space, gym.spaces.Box):
        actions = probe_actions(space, np.random.default_rng(0), include_outside=False)
        extremes = actions[:3]
    else:
        return []
    plans = [(f"constant action {a!r}", (lambda t, a=a: a)) for a in extremes]
    first, last = extremes[0], extremes[-1]
    for block in (5, 20):
        plans.append((f"alternate every {block} steps", (lambda t, b=block: first if (t // b) % 2 == 0 else last)))
    return plans


def collect_rollout_samples(stepper: ReferenceStepper, space: gym.Space, max_steps: int, target: int,
                            seed: int, max_episodes: int = 300) -> list[Sample]:
    """Samples along real reference episodes: scripted schedules first, then random actions
    until `target` samples. Each state goes through state_to_reference/state_from_reference."""
    samples: list[Sample] = []
    space.seed(seed)
    plans = scripted_plans(space)
    episode = 0
    while episode < max_episodes and (episode < len(plans) or len(samples) < target):
        name, plan = plans[episode] if episode < len(plans) else ("random actions", lambda t: space.sample())
        state = stepper.reset(seed + episode)
        for t in range(max_steps):
            action = plan(t)
            sample = stepper.sample(state, action, f"{name}, episode seed {seed + episode}, step {t}")
            if sample is None:
                break
            samples.append(sample)
            if sample.terminated:
                break
            state = sample.next_state
        episode += 1
    return samples


def _replace_component(state, leaf_index: int, element: int, value):
    leaves, treedef = jax.tree_util.tree_flatten(state)
    leaves = [np.array(leaf) for leaf in leaves]
    target = leaves[leaf_index]
    flat = target.reshape(-1).copy()
    flat[element] = value
    leaves[leaf_index] = flat.reshape(target.shape).astype(target.dtype)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def collect_boundary_samples(stepper: ReferenceStepper, base_states: list, spreads: np.ndarray,
                             limits: np.ndarray, actions: list, max_components: int = 32, max_doublings: int = 14,
                             bisections: int = 40) -> list[Sample]:
    """For each scalar component of each base state and each direction, move it outward in doubling
    steps (which also crosses every clip bound), and where the reference's termination flips,
    bisect the flip point and sample just inside and outside it with every probe action."""
    samples: list[Sample] = []
    first_action = actions[0]
    for base_index, base in enumerate(base_states):
        leaves = jax.tree_util.tree_leaves(base)
        names = field_names(base)
        component = 0
        for leaf_index, leaf in enumerate(leaves):
            leaf = np.asarray(leaf)
            for element in range(leaf.size):
                if component >= max_components:
                    break
                name = names[component]
                spread = float(spreads[component]) if component < len(spreads) else 0.0
                component += 1
                if leaf.dtype == bool:
                    flipped = _replace_component(base, leaf_index, element, not leaf.reshape(-1)[element])
                    for action in actions:
                        s = stepper.sample(flipped, action, f"boundary search: {name} flipped in base state {base_index}")
                        if s:
                            samples.append(s)
                    continue
                start = float(leaf.reshape(-1)[element])
                integral = np.issubdtype(leaf.dtype, np.integer)
                scale = 1.0 if integral else max(spread, 0.05 * abs(start), 1e-3)
                # far enough to cross every bound the env reaches, not into states no float32 step can follow
                reach = 16 * max(float(limits[component - 1]) if component - 1 < len(limits) else 0.0, scale)
                for direction in (1.0, -1.0):
                    previous_value, previous_terminated, flips = start, None, 0
                    for k in range(max_doublings):
                        value = start + direction * scale * 2.0**k
                        if abs(value) > reach and k > 0:
                            break
                        if integral:
                            value = int(round(value))
                        state = _replace_component(base, leaf_index, element, value)
                        origin = f"boundary search: {name} = {value:.6g} from base state {base_index}"
                        s = stepper.sample(state, first_action, origin)
                        if s is None:
                            break
                        samples.append(s)
                        if previous_terminated is not None and s.terminated != previous_terminated and not integral:
                            samples.extend(_bisect_flip(stepper, base, leaf_index, element, name, previous_value,
                                                        value, previous_terminated, first_action, actions, scale,
                                                        bisections))
                            flips += 1
                            if flips >= 2:
                                break
                        previous_value, previous_terminated = value, s.terminated
    return samples


def _bisect_flip(stepper, base, leaf_index, element, name, inside, outside, inside_terminated,
                 first_action, actions, scale, iterations: int = 40) -> list[Sample]:
    for _ in range(iterations):
        middle = 0.5 * (inside + outside)
        s = stepper.sample(_replace_component(base, leaf_index, element, middle), first_action, "", sensitivity=False)
        if s is None:
            return []
        if s.terminated == inside_terminated:
            inside = middle
        else:
            outside = middle
    boundary = 0.5 * (inside + outside)
    towards_outside = math.copysign(1.0, outside - inside)
    samples = []
    for relative in (1e-4, 1e-3, 1e-2):
        offset = relative * max(abs(boundary), scale)
        for side, sign in (("inside", -towards_outside), ("outside", towards_outside)):
            value = boundary + sign * offset
            state = _replace_component(base, leaf_index, element, value)
            for action in actions:
                s = stepper.sample(state, action, f"termination boundary of {name} at {boundary:.6g}: "
                                                  f"{name} = {value:.6g} ({side}, offset {offset:.2g})")
                if s:
                    samples.append(s)
    return samples
