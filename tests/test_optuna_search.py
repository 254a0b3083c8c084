"""The optuna agent's search: local around the best, a few constants at a time on their own
scales, never the same configuration twice, wider when the best stays put, recentred by a keep;
then the same on a cheap env through the real daemon."""
from __future__ import annotations

import json
import math
import random
import textwrap

import git
import optuna
import pytest
from optuna.distributions import CategoricalDistribution

from orchestrator.agents.base import AgentContext, NoMoreProposals, Outcome
from orchestrator.agents.hyperparameter_block import format_value, read_block, reads, training_path
from orchestrator.agents.local_search import WIDEN_EVERY
from orchestrator.agents.search_space import distribution_for, key_of, neighbour
from orchestrator.agents.optuna_agent import OptunaAgent
from tests.conftest import AUTORL_ROOT, FAST, read_results, run_daemon

REAL_TRAIN_PY = (AUTORL_ROOT / "candidate" / "train.py").read_text()


class Night:
    """The loop as the agent sees it: before every proposal the worktree holds the best commit."""

    def __init__(self, tmp_path, text=REAL_TRAIN_PY, **agent_options):
        self.worktree, self.run_dir = tmp_path / "wt", tmp_path / "run"
        (self.worktree / "candidate").mkdir(parents=True)
        self.run_dir.mkdir()
        self.best_text = text
        self.agent = OptunaAgent(self.run_dir, seed=agent_options.pop("seed", 0), **agent_options)
        self.exp = 0

    def propose(self):
        self.exp += 1
        self.path.write_text(self.best_text)
        exp_dir = self.run_dir / f"exp-{self.exp:04d}"
        exp_dir.mkdir()
        ctx = AgentContext(phase="train", exp=self.exp, env_id="CartPole-v1", worktree=self.worktree,
                           run_dir=self.run_dir, exp_dir=exp_dir, program="", allowed_paths=["candidate/train.py"])
        proposal = self.agent.propose(ctx)
        return ctx, proposal, self.path.read_text()

    def tell(self, ctx, text, status, score=1.0):
        if status == "keep":
            self.best_text = text
        self.agent.tell(ctx, Outcome(status, score, None))

    @property
    def path(self):
        return self.worktree / "candidate" / "train.py"


def values(text: str) -> dict:
    return {c.name: c.value for c in read_block(text)}


def changed(before: dict, after: dict) -> dict:
    return {n: (before[n], after[n]) for n in before if format_value(before[n]) != format_value(after[n])}


def trial_of(study, exp):
    return next(t for t in study.get_trials() if t.user_attrs.get("exp") == exp)


def test_first_trials_are_small_steps_from_the_baseline_and_all_distinct(tmp_path):
    night = Night(tmp_path)
    base = values(REAL_TRAIN_PY)
    space = night.agent.space(read_block(REAL_TRAIN_PY))
    seen = {key_of({n: base[n] for n in space})}
    for round_ in range(2):  # --parallel 4: four proposals before any outcome
        proposed = [night.propose() for _ in range(4)]
        for ctx, proposal, text in proposed:
            new = values(text)
            diff = changed(base, new)
            assert 1 <= len(diff) <= 2, diff
            if round_ == 0:  # the first WIDEN_EVERY trials: one constant, one fine step (no flag, no power of two)
                assert len(diff) == 1 and not isinstance(space[next(iter(diff))], CategoricalDistribution), diff
            assert proposal.description.startswith(f"optuna trial {ctx.exp - 1}: ")
            for name, (old, value) in diff.items():
                assert name in space and type(value) is type(old), (name, old, value)
                dist = space[name]
                if isinstance(dist, CategoricalDistribution):
                    assert value in dist.choices
                else:
                    assert dist.low <= value <= dist.high
                if name in ("LEARNING_RATE", "CLIP_COEF", "MAX_GRAD_NORM", "VF_COEF"):  # rates: log steps
                    octaves = abs(math.log2(value / old))
                    assert octaves == pytest.approx(round(octaves * 2) / 2, abs=1e-3)
                    assert octaves <= (0.5 if round_ == 0 else 1.0)
                if name in ("NUM_ENVS", "NUM_STEPS", "NUM_MINIBATCHES", "HIDDEN_SIZE"):  # sizes: powers of two
                    assert value in (old // 4, old // 2, old * 2, old * 4)
            key = key_of({n: new[n] for n in space})
            assert key not in seen
            seen.add(key)
        for ctx, _, text in proposed:
            night.tell(ctx, text, "discard", 0.0)


def test_a_keep_recentres_the_search_and_a_stuck_best_widens_it(tmp_path):
    night = Night(tmp_path, seed=3)
    base = values(REAL_TRAIN_PY)
    for _ in range(WIDEN_EVERY):
        ctx, _, text = night.propose()
        night.tell(ctx, text, "discard", 0.0)
    assert [trial_of(night.agent.study, e).user_attrs["radius"] for e in range(1, WIDEN_EVERY + 1)] == [1] * WIDEN_EVERY
    ctx, _, kept_text = night.propose()
    assert trial_of(night.agent.study, ctx.exp).user_attrs["radius"] == 2  # four trials around one best: wider
    night.tell(ctx, kept_text, "keep", 2.0)
    kept = values(kept_text)
    for _ in range(3):
        ctx, _, text = night.propose()
        trial = trial_of(night.agent.study, ctx.exp)
        # Around the kept configuration now, and back to small steps.
        assert trial.user_attrs["radius"] == 1
        assert dict(json.loads(trial.user_attrs["centre"])) == {n: format_value(v) for n, v in kept.items()
                                                                if n in trial.params}
        diff = changed(kept, values(text))
        assert len(diff) == 1
        assert set(changed(base, kept)) - set(diff) <= set(changed(base, values(text)))  # the keep's moves stay
        night.tell(ctx, text, "discard", 0.0)


def test_optuna_params_limit_the_search_and_an_exhausted_space_ends_the_run(tmp_path):
    night = Night(tmp_path / "a", only={"LEARNING_RATE", "NORM_OBS"})
    base = values(REAL_TRAIN_PY)
    for _ in range(6):
        ctx, _, text = night.propose()
        assert set(changed(base, values(text))) <= {"LEARNING_RATE", "NORM_OBS"}
        night.tell(ctx, text, "discard", 0.0)
    flag = Night(tmp_path / "b", only={"NORM_OBS"})
    ctx, proposal, text = flag.propose()
    assert proposal.description.endswith("NORM_OBS True->False")
    flag.tell(ctx, text, "discard", 0.0)
    with pytest.raises(NoMoreProposals, match="every configuration near the best was tried"):
        flag.propose()


def test_a_resumed_study_never_repeats_a_configuration(tmp_path):
    night = Night(tmp_path)
    texts = []
    for _ in range(4):
        ctx, _, text = night.propose()
        texts.append(text)
        night.tell(ctx, text, "discard", 0.0)
    night.agent = OptunaAgent(night.run_dir, seed=0)  # the same seed: it would draw the same moves
    for _ in range(4):
        ctx, _, text = night.propose()
        assert text not in texts
        texts.append(text)
        night.tell(ctx, text, "discard", 0.0)
    assert len(night.agent.study.trials) == 8


# A cheap env with a block of eight constants: any move away from the shipped values balances
# the pole (500), the shipped ones score ~145. The first trial is kept, and the next ones must
# start from it.
TOY_TRAIN_PY = textwrap.dedent('''\
    import os
    from pathlib import Path

    import torch

    # >>> hyperparameters
    BIAS = 1.0  # the controller's bias
    LEARNING_RATE = 3e-4  # unused
    NUM_STEPS = 128  # unused
    GAMMA = 0.99  # unused
    ENT_COEF = 0.01  # unused
    HIDDEN_SIZE = 64  # unused
    USE_X = True  # unused
    CLIP_COEF = 0.2  # unused
    # <<< hyperparameters
    SHIPPED = {"BIAS": 1.0, "LEARNING_RATE": 3e-4, "NUM_STEPS": 128, "GAMMA": 0.99, "ENT_COEF": 0.01,
               "HIDDEN_SIZE": 64, "USE_X": True, "CLIP_COEF": 0.2}
    moved = any(globals()[name] != value for name, value in SHIPPED.items())


    class Controller(torch.nn.Module):
        def __init__(self, bias: float):
            super().__init__()
            self.bias = bias

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            s = 0.1 * obs[:, 0] + 0.5 * obs[:, 1] + 10.0 * obs[:, 2] + 2.0 * obs[:, 3]
            return (s + self.bias > 0).long()


    out = Path(os.environ["AUTORL_OUTPUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    # each seed its own policy, as a trained one is (the keep rule counts seed copies as one run)
    seed_offset = 0.05 * ((int(os.environ.get("AUTORL_SEED", "1")) * 7919) % 201 - 100) / 100
    torch.jit.save(torch.jit.script(Controller((0.0 if moved else 1.0) + seed_offset)), str(out / "policy.pt"))
    print("---")
    print("env_steps: 1000")
''')


@pytest.mark.long
@pytest.mark.slow
def test_search_on_a_cheap_env_starts_small_and_recentres_on_the_keep(autorl_repo):
    repo = autorl_repo(TOY_TRAIN_PY)
    result = run_daemon(repo, "run", "--env", "CartPole-v1", "--budget", "2", "--tag", "toy", "--agent", "optuna",
                        "--max-experiments", "3", *FAST, "--grace", "30", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = read_results(repo, "toy")
    assert rows["status"].tolist() == ["baseline", "baseline", "keep", "discard", "discard"]
    assert rows["score"][2] == 500.0 and "not above best 500.000" in rows["description"][3]
    main = git.Repo(repo)
    shipped = values(TOY_TRAIN_PY)
    kept = values(main.git.show(f"{rows['commit'][2]}:candidate/train.py"))
    study = optuna.load_study(study_name="autorl", storage=f"sqlite:///{repo / 'results' / 'toy' / 'optuna.db'}")
    for exp, commit, centre in ((1, rows["commit"][2], shipped), (2, rows["commit"][3], kept),
                                (3, rows["commit"][4], kept)):
        new = values(main.git.show(f"{commit}:candidate/train.py"))
        assert 1 <= len(changed(centre, new)) <= 3, (exp, changed(centre, new))
        trial = trial_of(study, exp)
        assert dict(json.loads(trial.user_attrs["centre"])) == {n: format_value(v) for n, v in centre.items()}
    decision = json.loads((repo / "results" / "toy" / "exp-0001" / "decision.json").read_text())
    assert decision["status"] == "keep" and decision["looks"][-1]["action"] == "keep"
    first = decision["looks"][0]["noise"]
    # the two baselines' seeds (their policies differ a little): one degree of freedom, their spread
    assert first["df"] == 1 and first["pooled"] == pytest.approx(abs(rows["score"][0] - rows["score"][1]) / 2 ** 0.5,
                                                                 rel=1e-3)


@pytest.mark.parametrize("backend, end_to_end, path", [("auto", True, "jax-host"), ("gymnax", False, "jax-host"),
                                                       ("gymnax", True, "jax-e2e")])
def test_trials_touch_only_constants_the_training_path_reads(tmp_path, monkeypatch, backend, end_to_end, path):
    # An empty verdict cache: "auto" finds no verified JAX backend for CartPole and trains on envpool,
    # stepped from the host (the jax-host path); BACKEND = "gymnax" trains end to end under jit (the
    # jax-e2e path) unless END_TO_END = False steps it from the host too.
    monkeypatch.setenv("AUTORL_VERIFY_CACHE", str(tmp_path / "cache"))
    text = REAL_TRAIN_PY.replace('BACKEND = "auto"', f'BACKEND = "{backend}"').replace(
        "END_TO_END = True", f"END_TO_END = {end_to_end}")
    constants = read_block(text)
    assert training_path(constants, "CartPole-v1", AUTORL_ROOT) == path
    tagged = {c.name: c.path for c in constants}
    assert tagged["JAX_LEARNING_RATE"] == "jax-e2e" and tagged["LEARNING_RATE"] == "jax-host" and tagged["GAMMA"] is None
    assert tagged["JAX_HOST_ENVS_FACTOR"] == "jax-host"
    night = Night(tmp_path, text=text)
    touched = set()
    for _ in range(12):
        ctx, _, proposed = night.propose()
        touched |= set(changed(values(text), values(proposed)))
        night.tell(ctx, proposed, "discard", 0.0)
    assert touched and all(reads(tagged[n], path) for n in touched), touched
    assert {n for n in touched if tagged[n] is None}  # the constants both paths read stay in the search


def test_global_samplers_search_the_whole_space_and_a_screened_trial_is_pruned_with_its_screen_score(tmp_path):
    """--optuna-sampler tpe/random (what bench/nights.py compares the default with) move several
    constants at once from the first trial; a `screened` outcome is Optuna's PRUNED with the score
    reported as an intermediate value."""
    night = Night(tmp_path, sampler="random")
    moved = []
    for _ in range(4):
        ctx, proposal, text = night.propose()
        assert text != night.best_text and "optuna trial" in proposal.description
        moved.append(len(changed(values(night.best_text), values(text))))
        night.tell(ctx, text, "screened", score=12.5)
    assert max(moved) > 1  # not a local step
    trial = trial_of(night.agent.study, 1)
    assert trial.state == optuna.trial.TrialState.PRUNED and trial.intermediate_values == {0: 12.5}
    assert trial.user_attrs["status"] == "screened"
    assert isinstance(Night(tmp_path / "tpe", sampler="tpe").agent.sampler, optuna.samplers.TPESampler)


def test_a_detuned_constant_is_walked_back_past_its_first_range(tmp_path):
    """A start detuned far in one direction (GAMMA 0.9, where 0.99 trains): after a keep the next
    trial repeats the move that won, and a best at the edge of its range widens it, so a night
    that keeps every step towards 0.99 gets there."""
    night = Night(tmp_path, text=REAL_TRAIN_PY.replace("GAMMA = 0.99 ", "GAMMA = 0.9 "), only={"GAMMA"})
    last_keep_moved_up, repeated = False, 0
    for _ in range(16):
        best = values(night.best_text)["GAMMA"]
        try:
            ctx, _, text = night.propose()
        except NoMoreProposals:  # a search of one constant can try every neighbour of its best
            break
        gamma = values(text)["GAMMA"]
        if last_keep_moved_up:
            repeated += gamma > best  # the first trial after a keep goes on the same way
        up = best < gamma <= 0.995
        night.tell(ctx, text, "keep" if up else "discard")
        last_keep_moved_up = up
    assert values(night.best_text)["GAMMA"] >= 0.985, values(night.best_text)
    assert repeated >= 4


def test_a_discount_is_searched_below_one_whatever_its_value():
    """GAMMA 0.8 (a horizon cut to 5 steps) is searched as a discount, by its distance to 1, not as a
    positive scale (0.27-2.4, a discount past 1); GAE_LAMBDA too; other constants are unchanged."""
    for name, value in (("GAMMA", 0.8), ("GAE_LAMBDA", 0.6), ("GAMMA", 0.99), ("GAMMA", 0.3)):
        dist = distribution_for(name, value)
        assert dist.low <= value <= dist.high < 1, (name, value, dist)
    # 0.5 to 0.95 around 0.8, reaching its usual default 0.99 (the prior's second move)
    assert distribution_for("GAMMA", 0.8).low == 0.5 and distribution_for("GAMMA", 0.8).high == pytest.approx(0.99)
    assert neighbour(0.8, distribution_for("GAMMA", 0.8), 2, random.Random(0), sign=1) == pytest.approx(0.9)
    assert distribution_for("CLIP_COEF", 0.8).high == pytest.approx(2.4)


def test_a_constant_far_from_where_ppo_usually_sits_is_tried_towards_there_first(tmp_path):
    """The prior: GAMMA 0.8 and CLIP_COEF 0.02 are outside PPO's usual ranges; the first trials
    move each to the nearest edge of its range (the furthest out first), a keep's momentum repeats
    the move, and a best inside every range leaves the random neighbourhood to it."""
    text = REAL_TRAIN_PY.replace("GAMMA = 0.99 ", "GAMMA = 0.8 ") \
        .replace("CLIP_COEF = 0.2 ", "CLIP_COEF = 0.02 ")
    night = Night(tmp_path / "detuned", text=text)
    ctx, proposal, first = night.propose()
    assert set(changed(values(text), values(first))) == {"CLIP_COEF"}           # 4.6 half-octaves out of 0.1
    assert values(first)["CLIP_COEF"] == pytest.approx(0.1, rel=0.1)
    assert trial_of(night.agent.study, 1).user_attrs["prior"] is True
    night.tell(ctx, first, "discard", 0.0)
    ctx, _, second = night.propose()
    assert changed(values(text), values(second)) == {"GAMMA": (0.8, 0.95)}      # 4 half-octaves of 1 - GAMMA
    night.tell(ctx, second, "keep", 1.0)
    ctx, _, third = night.propose()                                              # momentum: on past 0.95
    assert changed(values(second), values(third)) == {"GAMMA": (0.95, pytest.approx(0.9875))}
    # The shipped train.py sits inside every range: no trial of the prior.
    shipped = Night(tmp_path / "shipped")
    shipped.propose()
    assert "prior" not in trial_of(shipped.agent.study, 1).user_attrs


def test_a_detune_its_range_edge_does_not_mend_is_tried_at_its_usual_default_next(tmp_path, monkeypatch):
    """A drawn night's detune, JAX_NUM_STEPS 64 -> 1 (Pendulum at 10 s on the jax-e2e path): the prior's
    first trial moves it to the nearest edge of its usual range (8); if that is not kept, the second tries
    its usual default (PureJaxRL's 128), before any random neighbour (the space around 1 reaches it)."""
    monkeypatch.setenv("AUTORL_VERIFY_CACHE", str(tmp_path / "cache"))
    text = REAL_TRAIN_PY.replace("JAX_NUM_STEPS = 64 ", "JAX_NUM_STEPS = 1 ").replace(
        'BACKEND = "auto"', 'BACKEND = "gymnax"')  # the jax-e2e path, which reads JAX_NUM_STEPS
    assert training_path(read_block(text), "CartPole-v1", AUTORL_ROOT) == "jax-e2e"
    night = Night(tmp_path, text=text)
    ctx, _, first = night.propose()
    assert changed(values(text), values(first)) == {"JAX_NUM_STEPS": (1, 8)}
    night.tell(ctx, first, "discard", 0.0)
    ctx, _, second = night.propose()
    assert changed(values(text), values(second)) == {"JAX_NUM_STEPS": (1, 128)}
    assert trial_of(night.agent.study, 2).user_attrs["prior"] is True


def test_a_kept_power_of_two_goes_on_the_same_way_and_a_prior_move_stops_at_the_default(tmp_path):
    """Momentum on a power of two: a kept doubling is doubled again. A drawn MountainCar detune,
    HIDDEN_SIZE 64 -> 2048: the prior's first trial moves it to the edge of its usual range (256); kept,
    the next trial goes on down, to the usual default (64), not past it to 32 (three octaves again)."""
    night = Night(tmp_path / "octaves", only={"NUM_MINIBATCHES"})
    ctx, _, first = night.propose()                  # the only constant is coarse: radius 2, an octave
    moved = values(first)["NUM_MINIBATCHES"]
    assert moved in (16, 64)
    night.tell(ctx, first, "keep", 1.0)
    ctx, _, second = night.propose()
    assert values(second)["NUM_MINIBATCHES"] == {64: 128, 16: 8}[moved]
    assert trial_of(night.agent.study, ctx.exp).user_attrs["momentum"] is True

    wide = REAL_TRAIN_PY.replace("HIDDEN_SIZE = 64 ", "HIDDEN_SIZE = 2048 ")
    night = Night(tmp_path / "wide", text=wide, only={"HIDDEN_SIZE", "GAMMA"})
    ctx, _, first = night.propose()
    assert changed(values(wide), values(first)) == {"HIDDEN_SIZE": (2048, 256)}
    night.tell(ctx, first, "keep", 1.0)
    ctx, _, second = night.propose()
    assert changed(values(first), values(second)) == {"HIDDEN_SIZE": (256, 64)}
    assert trial_of(night.agent.study, ctx.exp).user_attrs["momentum"] is True


def screen_trials(night, text, outcome):
    """Proposes until the screening pass is over; tells each trial `outcome(name, configuration)` as
    (status, score). Returns {screened constant: (its value in the trial, the start's value)}."""
    moved = {}
    while True:
        ctx, proposal, proposed = night.propose()
        trial = trial_of(night.agent.study, ctx.exp)
        if not trial.user_attrs.get("screen"):
            return moved, (ctx, proposal, proposed)
        diff = changed(values(text), values(proposed))
        assert list(diff) == [trial.user_attrs["screen"]] and proposal.description.endswith("(screening pass)")
        name = trial.user_attrs["screen"]
        moved[name] = (diff[name][1], diff[name][0])
        night.tell(ctx, proposed, *outcome(name, values(proposed)))


def test_a_detune_inside_its_usual_range_is_found_by_the_screening_pass(tmp_path):
    """UPDATE_EPOCHS = 3 sits inside PPO's usual range (2-30), so the prior says nothing; a run that
    screens (--screen) moves every constant once, far (to its usual default when it sits elsewhere,
    inside the search's bounds: UPDATE_EPOCHS to 9, the top of 1-9 around 3), and that trial is the
    one that screens as well as the best and is kept."""
    text = REAL_TRAIN_PY.replace("UPDATE_EPOCHS = 10 ", "UPDATE_EPOCHS = 3 ")
    night = Night(tmp_path, text=text, screening=True)
    space = night.agent.space(read_block(text))
    fixed = lambda name, params: ("keep", 2.0) if params["UPDATE_EPOCHS"] == 9 else ("screened", -1.0)
    moved, (ctx, _, after) = screen_trials(night, text, fixed)
    assert moved["UPDATE_EPOCHS"] == (9, 3)
    searched = set(trial_of(night.agent.study, 1).params)  # the constants the training path reads
    # one each, in name order, until the keep: then the next trial goes on the way that won
    assert set(moved) == {n for n in searched if n <= "UPDATE_EPOCHS"}
    assert trial_of(night.agent.study, ctx.exp).user_attrs.get("momentum") and values(after)["UPDATE_EPOCHS"] > 9
    for name, (new, old) in moved.items():  # far: at least an octave (a flag flipped)
        dist = space[name]
        if isinstance(new, bool):
            assert new is not old
        elif old != 0 and (isinstance(dist, CategoricalDistribution) or getattr(dist, "log", False)
                           or name in ("GAMMA", "GAE_LAMBDA")):
            ratio = (1 - new) / (1 - old) if name in ("GAMMA", "GAE_LAMBDA") else new / old
            assert abs(math.log2(ratio)) >= 1 - 1e-6, (name, old, new)
    assert values(night.best_text)["UPDATE_EPOCHS"] == 9
    # Without --screen (the default) there is no pass: the same start's first trial is a small step.
    plain = Night(tmp_path / "plain", text=text)
    ctx, proposal, first = plain.propose()
    assert "screen" not in trial_of(plain.agent.study, 1).user_attrs and "screening" not in proposal.description


def test_after_the_screen_the_search_moves_the_constants_that_changed_the_score(tmp_path):
    """Nothing screens as well as the best, but MAX_GRAD_NORM's move hurt by far the most: the trials
    after the pass move the few constants with the largest effects, MAX_GRAD_NORM the other way; a
    keep ends the pass's reign over one best, and a best that stays put SCREEN_AFTER trials is screened
    again."""
    from orchestrator.agents.local_search import SCREEN_AFTER, SCREEN_FOCUS

    night = Night(tmp_path, screening=True, seed=1)
    noise = random.Random(0)
    hurt = lambda name, params: ("screened", -600.0 if name == "MAX_GRAD_NORM" else -200.0 + noise.uniform(-5, 5))
    moved, (ctx, _, proposed) = screen_trials(night, REAL_TRAIN_PY, hurt)
    base = values(REAL_TRAIN_PY)
    screened_up = moved["MAX_GRAD_NORM"][0] > base["MAX_GRAD_NORM"]
    focus = trial_of(night.agent.study, ctx.exp).user_attrs["focus"]
    assert "MAX_GRAD_NORM" in focus and len(focus) == SCREEN_FOCUS
    assert night.agent.study.user_attrs["focus"] == focus
    grad_moves = []
    for _ in range(2 * WIDEN_EVERY):  # radius 1 and 2: only the focus
        diff = changed(base, values(proposed))
        assert diff and set(diff) <= set(focus), (diff, focus)
        if "MAX_GRAD_NORM" in diff:
            grad_moves.append(diff["MAX_GRAD_NORM"][1] > base["MAX_GRAD_NORM"])
        night.tell(ctx, proposed, "screened", -200.0)
        ctx, _, proposed = night.propose()
    assert grad_moves and all(up != screened_up for up in grad_moves), grad_moves
    # A keep: around the new best the pass waits SCREEN_AFTER trials, then runs again.
    night.tell(ctx, proposed, "keep", 50.0)
    statuses = []
    for _ in range(SCREEN_AFTER + 1):
        ctx, _, proposed = night.propose()
        statuses.append(bool(trial_of(night.agent.study, ctx.exp).user_attrs.get("screen")))
        night.tell(ctx, proposed, "screened", 0.0)
    assert statuses == [False] * SCREEN_AFTER + [True]


def test_the_agent_screens_when_the_run_screens(tmp_path):
    """from_args: the run's --screen (a resumed run's stored one, which setup puts in the arguments)."""
    import argparse

    for screen, expected in ((0.25, True), (None, False)):
        run_dir = tmp_path / str(screen) / "results" / "t"
        run_dir.mkdir(parents=True)
        agent = OptunaAgent.from_args(argparse.Namespace(screen=screen), run_dir)
        assert agent.sampler.screening is expected
