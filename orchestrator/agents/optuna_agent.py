"""The optuna agent: the embedded offline default. No LLM.

It proposes new values for the constants in train.py's hyperparameter block (the lines between
`# >>> hyperparameters` and `# <<< hyperparameters`) and edits nothing else. The search is local:
each trial starts from the best configuration so far (the block of the worktree's train.py, which
the loop resets to the best commit before every proposal) and changes constants by steps on their
own scales (half an octave for rates and sizes, a sixteenth of the range for signed constants),
never a configuration tried before. A constant outside the range it usually sits in (ppo_priors:
every constant of the block, from the literature: GAMMA 0.8, a learning rate of 1e-5, observation
normalisation off, 2 steps per rollout) is the likeliest mistake, so the first
trials move such constants to the nearest edge of their range, then to their usual default, and a trial that
follows a keep repeats the move that won (a power of two as well; a move that began outside the usual range
stops at the usual default). Then the first trials around a best move one constant by one
step; the coarse moves (a flag flipped, a power of two doubled or halved, another choice) wait for
the second radius. The longer the best stays put, the wider the trials go: every WIDEN_EVERY
trials around the same best allow one more constant and one more step. A keep moves the best, and
the next trials are around it again. When the run screens candidates (`--screen F`) and nothing is
known (no keep yet, or SCREEN_AFTER trials around one best), a screening pass moves each constant
once, far, and the trials after it move the constants that changed the score most first
(local_search, "the screening pass"). (At a 60 s BipedalWalker budget, halving HIDDEN_SIZE or
turning ANNEAL_LR off as a first move left policies that fall: a first hour spent far from the
best.)

The neighbourhood is an Optuna sampler (`LocalSearch`, on the `BaseSampler` interface) driven by
ask/tell, so the study in results/<tag>/optuna.db holds everything (the space derived once from
the baseline's values, every trial with its centre, what it changed and its outcome) and a resumed
run continues it. Why not Optuna's CMA-ES with x0 at the best: it moves every constant in every
trial, samples booleans and power-of-two choices at random (they are categorical), and adapts its
covariance over far more trials than a night of 720 s runs holds. TPE (the former default) starts
with random trials over the whole space: the first hour of a night spent far from anything useful.

train.py feeds its one learner two ways and tags the constants only one of them reads with a comment
`(jax-host path)` or `(jax-e2e path)`. A trial only touches constants of the path that will train
(`training_path`): a change to a constant nobody reads would spend a whole experiment on noise.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

import optuna
from optuna.distributions import (BaseDistribution, distribution_to_json, json_to_distribution)
from optuna.trial import TrialState

from ..results import ResultsFile, RunFolder
from .base import AgentContext, AgentError, NoMoreProposals, Outcome, Proposal
from .hyperparameter_block import (TRAIN_SCRIPT, Constant, NoHyperparameterBlock, format_value, read_block,
                                   reads, training_path, write_block)
from .local_search import LocalSearch
from .search_space import clip, search_space, widened

STUDY_NAME = "autorl"

# ---------------------------------------------------------------- the agent
class OptunaAgent:
    name = "optuna"

    def __init__(self, run_dir: Path, only: Optional[set[str]] = None, seed: Optional[int] = None,
                 sampler: str = "local", screening: bool = False):
        self.run_dir = Path(run_dir)
        self.only = only
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        # tpe / random: Optuna's own samplers over the whole space, the searches the default is compared with
        self.sampler = {"local": lambda s: LocalSearch(s, screening=screening),
                        "tpe": lambda s: optuna.samplers.TPESampler(seed=s),
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
        return cls(run_dir, only, sampler=getattr(args, "optuna_sampler", None) or "local",
                   screening=getattr(args, "screen", None) is not None)

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
        space = {n: d for n, d in self.space(constants).items() if n in current and reads(read_by[n], training)}
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
        if info.get("focus") and info["focus"] != self.study.user_attrs.get("focus"):
            self.study.set_user_attr("focus", info["focus"])
            logging.getLogger("autorl").info("optuna: the screen found these constants move the score most; the "
                                             "next trials move them first: %s", ", ".join(info["focus"]))
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
        what = " (screening pass)" if info.get("screen") else ""
        return Proposal(description=f"optuna trial {trial.number}: " + ", ".join(changed) + what)

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
