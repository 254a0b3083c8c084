"""The optuna agent: the embedded offline default. No LLM.

It proposes new values for the constants in train.py's hyperparameter block (the lines between
`# >>> hyperparameters` and `# <<< hyperparameters`) and edits nothing else. The search is local:
each trial starts from the best configuration so far (the block of the worktree's train.py, which
the loop resets to the best commit before every proposal) and changes constants by steps on their
own scales (half an octave for rates and sizes, a sixteenth of the range for signed constants),
never a configuration tried before. The first trials around a best move one constant by one
step; the coarse moves (a flag flipped, a power of two doubled or halved, another choice) wait for
the second radius. The longer the best stays put, the wider the trials go: every WIDEN_EVERY
trials around the same best allow one more constant and one more step. A keep moves the best, and
the next trials are around it again. (At a 60 s BipedalWalker budget, halving HIDDEN_SIZE or
turning ANNEAL_LR off as a first move left policies that fall: a first hour spent far from the
best.)

The neighbourhood is an Optuna sampler (`LocalSearch`, on the `BaseSampler` interface) driven by
ask/tell, so the study in results/<tag>/optuna.db holds everything (the space derived once from
the baseline's values, every trial with its centre, what it changed and its outcome) and a resumed
run continues it. Why not Optuna's CMA-ES with x0 at the best: it moves every constant in every
trial, samples booleans and power-of-two choices at random (they are categorical), and adapts its
covariance over far more trials than a night of 720 s runs holds. TPE (the former default) starts
with random trials over the whole space: the first hour of a night spent far from anything useful.

train.py has two training paths and tags the constants only one of them reads with a comment
`(host path)` or `(jax-e2e path)`. A trial only touches constants of the path that will train
(`training_path`): a change to a constant nobody reads would spend a whole experiment on noise.
"""
from __future__ import annotations

import ast
import json
import logging
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import optuna
from optuna.distributions import (BaseDistribution, CategoricalDistribution, FloatDistribution,
                                  IntDistribution, distribution_to_json, json_to_distribution)
from optuna.trial import TrialState

from ..results import ResultsFile, RunFolder
from .base import AgentContext, AgentError, NoMoreProposals, Outcome, Proposal

TRAIN_SCRIPT = "candidate/train.py"
BLOCK_START = "# >>> hyperparameters"
BLOCK_END = "# <<< hyperparameters"
STUDY_NAME = "autorl"
# Not learning hyperparameters: how many threads, which backend, seeds.
FIXED_NAMES = {"TORCH_THREADS", "BACKEND"}
PATH_TAG = re.compile(r"\((host|jax-e2e) path\)")
# Backends train.py steps from its torch loop (host path); any other verified backend is functional
# JAX and trains end to end (jax-e2e path) when the block has JAX_NUM_ENVS. Mirrors train.py.
HOST_SPECS = ("envpool", "gymnasium", "reference")


class NoHyperparameterBlock(ValueError):
    pass


@dataclass
class Constant:
    name: str
    value: object
    line: int           # 0-based line index in the file
    start: int          # column span of the literal on that line
    end: int
    path: Optional[str] = None  # "host" or "jax-e2e" when its comment says only that path reads it


def read_block(text: str) -> list[Constant]:
    """The `NAME = literal` lines of the hyperparameter block (comments and spacing kept)."""
    lines = text.split("\n")
    try:
        first = next(i for i, line in enumerate(lines) if line.strip() == BLOCK_START)
        last = next(i for i in range(first + 1, len(lines)) if lines[i].strip() == BLOCK_END)
    except StopIteration:
        raise NoHyperparameterBlock(
            f"no hyperparameter block: {TRAIN_SCRIPT} needs a line `{BLOCK_START}`, then `NAME = literal` "
            f"lines, then a line `{BLOCK_END}`") from None
    constants = []
    for index in range(first + 1, last):
        line = lines[index]
        try:
            tree = ast.parse(line)
        except SyntaxError:
            continue
        if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assign):
            continue
        node = tree.body[0]
        if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
            continue
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            continue
        tag = PATH_TAG.search(line[node.value.end_col_offset:])
        constants.append(Constant(node.targets[0].id, value, index, node.value.col_offset,
                                  node.value.end_col_offset, tag.group(1) if tag else None))
    return constants


def training_path(constants: list[Constant], env_id: str, worktree: Path) -> str:
    """Which of train.py's paths will train this block: "jax-e2e" when the backend it would choose
    is functional JAX and the block has the jax-e2e constants, else "host"."""
    values = {c.name: c.value for c in constants}
    if "JAX_NUM_ENVS" not in values:
        return "host"
    spec = values.get("BACKEND", "auto")
    if spec == "auto":
        try:
            import envs_fast
        except ImportError:
            return "host"
        spec = envs_fast.choose_backend(env_id, int(values.get("NUM_ENVS", 32)), root=worktree)
    return "host" if spec in HOST_SPECS or str(spec).endswith(".rs") else "jax-e2e"


def format_value(value) -> str:
    if isinstance(value, float):
        return repr(float(f"{value:.4g}"))
    return repr(value)


def write_block(text: str, values: dict) -> str:
    lines = text.split("\n")
    for const in read_block(text):
        if const.name in values:
            line = lines[const.line]
            lines[const.line] = line[:const.start] + format_value(values[const.name]) + line[const.end:]
    return "\n".join(lines)


# ---------------------------------------------------------------- the search space
def _around(low: float, high: float, value: float) -> tuple[float, float]:
    return min(low, value), max(high, value)


def _categorical(choices: list, value) -> CategoricalDistribution:
    return CategoricalDistribution(sorted(set(choices) | {value}))


def distribution_for(name: str, value) -> Optional[BaseDistribution]:
    """A search range around the baseline value (None: the constant stays fixed)."""
    if name in FIXED_NAMES or "SEED" in name or isinstance(value, str) or value is None:
        return None
    if name == "LEARNING_RATE" and isinstance(value, float) and value > 0:
        return FloatDistribution(*_around(1e-5, 3e-3, value), log=True)
    if name == "ENT_COEF" and isinstance(value, (int, float)) and value >= 0:
        return FloatDistribution(*_around(0.0, 0.02, float(value)))
    if name == "INIT_LOG_STD" and isinstance(value, (int, float)):
        return FloatDistribution(*_around(-1.5, 0.5, float(value)))
    if name == "TARGET_KL" and isinstance(value, (int, float)):
        return _categorical([0.0, 0.01, 0.02, 0.05], float(value))
    if isinstance(value, bool):
        return CategoricalDistribution([False, True])
    if isinstance(value, int):
        if value >= 2 and value & (value - 1) == 0:  # a power of two stays one
            return _categorical([max(1, value // 4), value // 2, value * 2, value * 4], value)
        if value >= 1:
            return IntDistribution(max(1, value // 3), max(value * 3, value + 2))
        return None
    if isinstance(value, float):
        if value == 0:
            return None  # no scale to search around
        if 0.9 <= value < 1:  # discount-like: search the distance to 1
            return FloatDistribution(max(0.5, 1 - (1 - value) * 4), 1 - (1 - value) / 4)
        if value > 0:
            factor = 10 if value < 0.01 else 3
            return FloatDistribution(value / factor, value * factor, log=True)
        return FloatDistribution(value * 3, value / 3)
    return None


def search_space(constants: list[Constant], only: Optional[set[str]] = None) -> dict[str, BaseDistribution]:
    space = {}
    for const in constants:
        if only is not None and const.name not in only:
            continue
        dist = distribution_for(const.name, const.value)
        if dist is not None:
            space[const.name] = dist
    return space


# ---------------------------------------------------------------- the neighbourhood
WIDEN_EVERY = 4      # trials around one best before the trials may go one constant and one step further
MAX_RADIUS = 8


def key_of(params: dict) -> tuple:
    """A configuration as it is written into train.py (floats to 4 significant digits)."""
    return tuple(sorted((name, format_value(value)) for name, value in params.items()))


def _rounded(value):
    return float(f"{value:.4g}") if isinstance(value, float) else value


def clip(value, dist: BaseDistribution):
    """A value inside the distribution (the best's value can be outside the stored range)."""
    if isinstance(dist, CategoricalDistribution):
        if value in dist.choices:
            return value
        numeric = [c for c in dist.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
        if numeric and isinstance(value, (int, float)):
            return min(numeric, key=lambda c: abs(c - value))
        return dist.choices[0]
    return min(max(value, dist.low), dist.high)


def coarse(dist: BaseDistribution) -> bool:
    """A constant whose smallest move is large (a flag, a power of two, a list of choices): it
    moves from radius 2 on."""
    return isinstance(dist, CategoricalDistribution)


def neighbour(value, dist: BaseDistribution, steps: int, rng: random.Random, sign: Optional[int] = None):
    """`value` moved by `steps` half-octaves (up or down: `sign`, else at random) in the constant's own
    scale, inside its bounds; the same value when no move is possible that way."""
    sign = sign or rng.choice((-1, 1))
    if isinstance(dist, CategoricalDistribution):
        choices = list(dist.choices)
        if len(choices) == 2 and set(map(type, choices)) == {bool}:
            return not value
        if all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices):
            choices.sort()
        index = choices.index(value) if value in choices else 0
        jump = max(1, steps // 2)  # neighbouring powers of two are an octave apart: two steps
        return choices[min(max(index + sign * jump, 0), len(choices) - 1)]
    if isinstance(dist, IntDistribution):  # sizes: half-octave steps, at least 1
        moved = int(round(value * 2 ** (sign * steps / 2)))
        if moved == value:
            moved = value + sign
        return int(min(max(moved, dist.low), dist.high))
    low, high = dist.low, dist.high
    if not dist.log and 0.5 <= low and high < 1:  # discount-like: half-octave steps of 1 - value
        moved = 1 - (1 - value) * 2 ** (-sign * steps / 2)
    elif dist.log:  # rates and other positive scales: half-octave steps
        moved = value * 2 ** (sign * steps / 2)
    else:  # signed or zero-based (entropy coefficient, log-std): sixteenths of the range
        moved = value + sign * steps * (high - low) / 16
    return min(max(_rounded(moved), low), high)  # (rounded first: a value rounded past a bound is no sample)


def _repeat_of_last_keep(trials, centre: dict, space: dict[str, BaseDistribution]) -> Optional[dict]:
    """`centre` moved again the way the last kept trial moved its centre (a rate x2 again, a discount's
    distance to 1 halved again), when `centre` is that trial's configuration; else None."""
    kept = [t for t in trials if t.user_attrs.get("status") == "keep" and t.user_attrs.get("centre")]
    if not kept or key_of(kept[-1].params) != key_of(centre):
        return None
    before = {name: value for name, value in json.loads(kept[-1].user_attrs["centre"])}
    params, moved = dict(centre), False
    for name, dist in space.items():
        if isinstance(dist, CategoricalDistribution) or name not in before:
            continue
        old, new = float(ast.literal_eval(before[name])), float(centre[name])
        if format_value(old) == format_value(centre[name]) or old <= 0 < new or new <= 0 < old:
            continue
        if not dist.log and 0.5 <= dist.low and dist.high < 1:  # discount-like: half-octaves of 1 - value
            sign, steps = (1 if new > old else -1), 2 * abs(math.log2((1 - new) / (1 - old)))
        elif dist.log or isinstance(dist, IntDistribution):
            sign, steps = (1 if new > old else -1), 2 * abs(math.log2(new / old))
        else:
            sign, steps = (1 if new > old else -1), abs(new - old) / ((dist.high - dist.low) / 16)
        # the same number of steps (at least one: a move cut short by a range's edge is not repeated shorter)
        params[name] = neighbour(centre[name], dist, max(1, round(steps)), random.Random(0), sign)
        moved = moved or format_value(params[name]) != format_value(centre[name])
    return params if moved else None


def widened(space: dict[str, BaseDistribution], best: dict) -> dict[str, BaseDistribution]:
    """The space with each range the best has reached the edge of extended past it, as far again as
    distribution_for would reach from there: a start detuned beyond the first range can still walk
    all the way back."""
    out = dict(space)
    for name, dist in space.items():
        value = best.get(name)
        if isinstance(dist, CategoricalDistribution) or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        wider = distribution_for(name, value)
        if wider is None or type(wider) is not type(dist) or wider.log != dist.log:
            continue
        # (within the 4 significant digits train.py's block is written with)
        at_low, at_high = value <= dist.low * (1 + 1e-3), value >= dist.high * (1 - 1e-3)
        if at_low or at_high:
            low = min(dist.low, wider.low) if at_low else dist.low
            high = max(dist.high, wider.high) if at_high else dist.high
            out[name] = type(dist)(low, high, log=dist.log)
    return out


class LocalSearch(optuna.samplers.BaseSampler):
    """Optuna sampler: a neighbour of the best configuration (`centre`, set before each ask) not
    tried before in the study. Trials around the same centre so far set the radius: 1 + that
    count // WIDEN_EVERY; a trial changes 1 to radius constants, each by 1 to radius steps, coarse
    constants only from radius 2 (a radius with no new neighbour left widens to the next).
    `space` (name -> distribution) is what may change; the agent sets both before asking."""

    def __init__(self, seed: Optional[int] = None):
        self.rng = random.Random(seed)
        self.space: dict[str, BaseDistribution] = {}
        self.centre: dict = {}
        self.last: dict = {}      # what the last sample_relative did: radius, changed names

    def reseed_rng(self) -> None:
        self.rng.seed()

    def infer_relative_search_space(self, study, trial) -> dict[str, BaseDistribution]:
        return dict(self.space)

    def sample_relative(self, study, trial, search_space: dict[str, BaseDistribution]) -> dict:
        if not search_space:
            return {}
        centre = {n: clip(self.centre[n], d) for n, d in search_space.items()}
        centre_key = json.dumps(key_of(centre))
        trials = [t for t in study.get_trials(deepcopy=False) if t.number != trial.number]
        tried = {key_of(t.params) for t in trials if set(t.params) == set(search_space)}
        tried.add(key_of(centre))
        around = sum(1 for t in trials if t.user_attrs.get("centre") == centre_key)
        # Momentum: the first trial around a best that a keep just made repeats the move that won
        # (a detuned constant is often several steps from where it should be).
        again = _repeat_of_last_keep(trials, centre, search_space) if around == 0 else None
        if again is not None and key_of(again) not in tried:
            changed = [n for n in sorted(again) if format_value(again[n]) != format_value(centre[n])]
            self.last = {"centre": centre_key, "radius": 1, "changed": changed, "momentum": True}
            return again
        radius = min(MAX_RADIUS, 1 + around // WIDEN_EVERY)
        while radius <= MAX_RADIUS:
            names = sorted(n for n in search_space if radius >= 2 or not coarse(search_space[n]))
            for _ in range(200 if names else 0):
                count = self.rng.randint(1, min(len(names), radius))
                params = dict(centre)
                for name in self.rng.sample(names, count):
                    steps = self.rng.randint(1, radius)
                    params[name] = neighbour(centre[name], search_space[name], steps, self.rng)
                if key_of(params) not in tried:
                    changed = [n for n in sorted(params) if format_value(params[n]) != format_value(centre[n])]
                    self.last = {"centre": centre_key, "radius": radius, "changed": changed}
                    return params
            radius += 1
        self.last = {"centre": centre_key, "radius": radius, "changed": [], "exhausted": True}
        return centre  # every neighbour was tried: the agent sees no change

    def sample_independent(self, study, trial, param_name, param_distribution):
        """Only for a constant outside the space given: it keeps the best's value."""
        return clip(self.centre[param_name], param_distribution)


# ---------------------------------------------------------------- the agent
class OptunaAgent:
    name = "optuna"

    def __init__(self, run_dir: Path, only: Optional[set[str]] = None, seed: Optional[int] = None,
                 sampler: str = "local"):
        self.run_dir = Path(run_dir)
        self.only = only
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # tpe / random: Optuna's own samplers over the whole space, the searches the default is compared with
        self.sampler = {"local": LocalSearch, "tpe": lambda s: optuna.samplers.TPESampler(seed=s),
                        "random": lambda s: optuna.samplers.RandomSampler(seed=s)}[sampler](seed)
        self.study = optuna.create_study(
            study_name=STUDY_NAME, storage=f"sqlite:///{self.run_dir / RunFolder.OPTUNA}", direction="maximize",
            sampler=self.sampler, load_if_exists=True)
        self.pending: dict[int, optuna.trial.Trial] = {}
        # Trials left running by a daemon that died: they will never be told, so fail them now.
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self.study.tell(trial.number, state=TrialState.FAIL)
            logging.getLogger("autorl").info("optuna: trial %d was in flight when the daemon died; "
                                             "told as failed", trial.number)

    @classmethod
    def from_args(cls, args, run_dir: Path) -> "OptunaAgent":
        names = getattr(args, "optuna_params", None)
        only = {n.strip() for n in names.split(",") if n.strip()} if names else None
        # The run folder is results/<tag>/ in the checkout: check the block before anything starts.
        train_py = Path(run_dir).resolve().parent.parent / TRAIN_SCRIPT
        if train_py.exists():
            constants = read_block(train_py.read_text())
            unknown = (only or set()) - {c.name for c in constants}
            if unknown:
                raise ValueError(f"--optuna-params: {', '.join(sorted(unknown))} not in the hyperparameter "
                                 f"block of {TRAIN_SCRIPT}")
            if not search_space(constants, only):
                raise ValueError(f"nothing to tune: no numeric or boolean constant in the hyperparameter "
                                 f"block of {TRAIN_SCRIPT}")
        return cls(run_dir, only, sampler=getattr(args, "optuna_sampler", None) or "local")

    # ------------------------------------------------------------ the space, stored with the study
    def space(self, constants: list[Constant]) -> dict[str, BaseDistribution]:
        stored = self.study.user_attrs.get("space")
        if stored:
            return {name: json_to_distribution(text) for name, text in json.loads(stored).items()}
        space = search_space(constants, self.only)
        self.study.set_user_attr("space", json.dumps({n: distribution_to_json(d) for n, d in space.items()}))
        self._add_baseline_trial(constants, space)
        return space

    def _widen(self, space: dict[str, BaseDistribution], best: dict) -> dict[str, BaseDistribution]:
        """Extend (and store) the ranges the best has walked to the edge of."""
        wider = widened(space, best)
        if wider != space:
            stored = {name: json_to_distribution(text) for name, text in json.loads(self.study.user_attrs["space"]).items()}
            stored.update({name: wider[name] for name in wider})
            self.study.set_user_attr("space", json.dumps({n: distribution_to_json(d) for n, d in stored.items()}))
            logging.getLogger("autorl").info("optuna: the best reached the edge of %s; its range now %s",
                                             ", ".join(n for n in wider if wider[n] != space[n]),
                                             ", ".join(f"{n} {wider[n].low:.4g}..{wider[n].high:.4g}"
                                                       for n in wider if wider[n] != space[n]))
        return wider

    def _add_baseline_trial(self, constants: list[Constant], space: dict) -> None:
        """The baseline rows' mean as a completed trial: the baseline is a configuration tried."""
        scores = [r.score for r in ResultsFile(RunFolder(self.run_dir).results).read()
                  if r.status == "baseline" and r.score is not None]
        if not scores:
            return
        params = {c.name: clip(c.value, space[c.name]) for c in constants if c.name in space}
        self.study.add_trial(optuna.trial.create_trial(
            params=params, distributions={n: space[n] for n in params}, value=sum(scores) / len(scores),
            user_attrs={"exp": 0, "status": "baseline"}))

    # ------------------------------------------------------------ ask / tell
    def propose(self, ctx: AgentContext) -> Proposal:
        path = Path(ctx.worktree) / TRAIN_SCRIPT
        text = path.read_text()
        try:
            constants = read_block(text)
        except NoHyperparameterBlock as exc:
            raise AgentError(str(exc)) from None
        current = {c.name: c.value for c in constants}
        training = training_path(constants, ctx.env_id, Path(ctx.worktree))
        read_by = {c.name: c.path for c in constants}
        space = {n: d for n, d in self.space(constants).items() if n in current and read_by[n] in (None, training)}
        if not space:
            raise AgentError(f"nothing to tune in {TRAIN_SCRIPT}'s hyperparameter block for its {training} path "
                             f"(--optuna-params may name only constants the other path reads)")
        # The worktree holds the best commit: its block is the centre of the search.
        local = isinstance(self.sampler, LocalSearch)
        if local:
            space = self._widen(space, current)
            self.sampler.space, self.sampler.centre = space, {n: current[n] for n in space}
        trial = self.study.ask(fixed_distributions=space)
        for _ in range(0 if local else 20):  # a global sampler may draw the best itself: draw again
            if write_block(text, trial.params) != text:
                break
            self.study.tell(trial, state=TrialState.FAIL)
            trial = self.study.ask(fixed_distributions=space)
        info = dict(self.sampler.last) if local else {"sampler": type(self.sampler).__name__}
        for name, value in info.items():
            trial.set_user_attr(name, value)
        trial.set_user_attr("exp", ctx.exp)
        new_text = write_block(text, trial.params)
        if new_text == text:
            self.study.tell(trial, state=TrialState.FAIL)
            raise NoMoreProposals(f"optuna: every configuration near the best was tried "
                                  f"({len(self.study.trials)} trials)")
        self.pending[ctx.exp] = trial
        path.write_text(new_text)
        changed = [f"{n} {format_value(current[n])}->{format_value(v)}" for n, v in trial.params.items()
                   if format_value(v) != format_value(current[n])]
        return Proposal(description=f"optuna trial {trial.number}: " + ", ".join(changed))

    def tell(self, ctx: AgentContext, outcome: Outcome) -> None:
        trial = self.pending.pop(ctx.exp, None)
        if trial is None:
            return
        trial.set_user_attr("status", outcome.status)
        if outcome.status == "screened" and outcome.score is not None:
            # stopped at a fraction of the budget: Optuna's own multi-fidelity record, an intermediate
            # value and PRUNED (TPE ranks pruned trials below complete ones, by that value)
            trial.report(outcome.score, step=0)
            self.study.tell(trial, state=TrialState.PRUNED)
        elif outcome.score is not None:
            self.study.tell(trial, outcome.score)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
