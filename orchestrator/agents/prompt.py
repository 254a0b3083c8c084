"""The experiment prompt both LLM agents get.

It comes in two parts. The system prompt is the stable prefix (the role, program.md, the phase's
instructions): the same across experiments of a phase, so the anthropic agent puts it under prompt
caching. The experiment prompt changes every time: the allowed files' current content, the results
so far, the last failure and the agent's notes.
"""
from __future__ import annotations

from pathlib import Path

from orchestrator.agents.base import AgentContext
from orchestrator.agents.tools import NOTES_NAME

MAX_FILE_CHARS = 60_000
MAX_FAILURE_CHARS = 8_000
MAX_NOTES_CHARS = 8_000
MAX_RESULTS_CHARS = 12_000
MAX_DESCRIPTION_CHARS = 200

ROLE = """\
You are the research agent of autorl, an overnight daemon that improves reinforcement learning
code one experiment at a time. Each experiment: you edit files in a git worktree, then the daemon
commits your edits, runs them under a fixed wall-clock budget, scores the exported policy with a
fixed evaluation harness you cannot change, and keeps the commit only if it beats the best so far
(otherwise the branch goes back to the best commit). The daemon decides; what train.py prints is
information for you, never the score. Nobody answers questions during the night: decide yourself,
make one focused change per experiment, and finish by submitting it."""

CREATE_ROLE = """\
You are the environment author of autorl, an overnight daemon for reinforcement learning. You turn
a plain-English description into a new environment under envs/<name>/ (a pure-Python domain, a
gymnasium wrapper, a README). The daemon checks what you write and commits it only when every check
passes; a failed check comes back to you as a report for a repair round. Nobody answers questions
during the night: decide yourself, write your assumptions into the README, and finish by submitting."""
ROLES = {"create": CREATE_ROLE}

PHASE_INSTRUCTIONS = {
    "train": """\
Phase: train. Improve the PPO in candidate/train.py so the policy it exports scores higher on the
reference environment within the time budget. You may change anything in that file (the
hyperparameter block between `# >>> hyperparameters` and `# <<< hyperparameters`, the network, the
algorithm), as long as it keeps its contract: read AUTORL_OUTPUT_DIR, AUTORL_TIME_BUDGET,
AUTORL_SEED and AUTORL_ENV_ID; write $AUTORL_OUTPUT_DIR/policy.pt (TorchScript, observation
normalisation baked in); stop within the budget; end by printing `---` and `key: value` lines.
Only candidate/train.py may be changed; evaluate.py and train_plumbing.py (which train.py imports:
the run's variables, the budget clock, the backend choice, the export check) are fixed. A change that
does not compile, or that touches another file, is rejected without being run.""",
    "translate": """\
Phase: translate. Write (or repair) the JAX translation of the environment: the one allowed file
envs_fast/translations/<slug>.py. The protocol, exactly: `ENV_ID = "<env id>"`; `reset(key) -> (obs, state)`
and `step(key, state, action) -> (obs, state, reward, terminated)` for ONE environment, pure and
jittable, state a pytree (the framework vmaps them, auto-resets and applies the time limit);
`state_from_reference(env) -> state` and `state_to_reference(state, env) -> None` reading and
writing the reference env's `env.unwrapped` internals. Read the reference's source (gymnasium under
site-packages) and the shipped examples (envs_fast/translations/cartpole_v1.py, pendulum_v1.py, acrobot_v1.py).
The daemon verifies it against the reference (L1 properties, L2 single steps from synced states
including states at every termination and clipping boundary, L3 rollouts); check it yourself with
`python -m envs_fast.verify --env ENV_ID --backend envs_fast/translations/<slug>.py`. It is kept only if it
passes and is faster, at train.py's NUM_ENVS, than the backend training uses now. When a
verification report is given below, repair exactly the failure it shows (state, action, fields,
largest deviation). Write only the path allowed below.""",
}
PHASE_INSTRUCTIONS["create"] = """\
Phase: create. Write the environment the description asks for, to the protocol of create.md above:
envs/<name>/<name>.py (the stdlib-only domain), envs/<name>/env.py (class Env), envs/<name>/README.md
with your assumptions, and envs/<name>/tasks.py only if there are start configurations. Write only
under the allowed path below; anything else fails the "written paths" check. When a check report is
given below, repair exactly the failures it names (each line says the check, the episode, the step
and the state)."""
GENERIC_PHASE = "Phase: {phase}. Make one focused change to the allowed paths below."

TOOL_RULES = f"""\
How to work: use the tools. Paths are relative to the repository root. Read before you edit;
prefer edit_file for small changes. Writes outside the allowed paths are refused. `run` is for
quick checks only (for example `python -m py_compile candidate/train.py`, or a few seconds of
training with AUTORL_TIME_BUDGET=5); the real run happens after you submit. Keep your notes in
{NOTES_NAME} (ideas tried with their outcome, ideas queued): it is the only memory you keep from
one experiment to the next. When your change is ready, call submit with a one-line description."""

COMMAND_RULES = """\
How to work: edit the files in the current directory (the repository root) directly. Only the
allowed paths below may change; any other change makes the experiment invalid. Do not commit, do
not run long trainings: the daemon commits, trains and scores your change when you exit.
Your notes file (ideas tried with their outcome, ideas queued) is outside the repository at the
path given below; update it if you can. End your reply with one line of the form
`DESCRIPTION: <what you changed and why>`."""


def system_prompt(program: str, phase: str) -> str:
    """The stable prefix: role, program.md, the phase's instructions and the tool rules."""
    return "\n\n".join([
        ROLES.get(phase, ROLE),
        _programme_heading(phase) + program.strip(),
        "# This phase\n\n" + phase_instructions(phase),
        TOOL_RULES,
    ])


def _programme_heading(phase: str) -> str:
    if phase == "create":
        return "# create.md and the description (from the human; follow them)\n\n"
    return "# program.md (the research plan from the human; follow it)\n\n"


def phase_instructions(phase: str) -> str:
    return PHASE_INSTRUCTIONS.get(phase, GENERIC_PHASE.format(phase=phase))


def experiment_prompt(ctx: AgentContext, notes_hint: str = NOTES_NAME) -> str:
    """What changes from one experiment to the next."""
    parts = [f"# Experiment {ctx.exp} ({ctx.phase} phase, environment {ctx.env_id})"]
    if ctx.repair_round:
        parts.append(f"This is repair round {ctx.repair_round}: your previous proposal failed; "
                     f"fix it using the report below.")
    parts.append("Allowed paths (the only ones you may change): " + ", ".join(ctx.allowed_paths))
    if ctx.round_peers:
        parts.append("## The other candidates of this round\n\nThese proposals train at the same time as "
                     "yours, from the same best commit; try something different:\n"
                     + "\n".join(f"- {peer}" for peer in ctx.round_peers))
    parts.append(allowed_files_section(ctx.worktree, ctx.allowed_paths))
    table = ctx.results_table.strip() or "(no results yet)"
    parts.append("## Results so far\n\n" + _tail(table, MAX_RESULTS_CHARS))
    if ctx.last_failure:
        parts.append("## Last failure\n\n```\n" + _tail(ctx.last_failure.strip(), MAX_FAILURE_CHARS)
                     + "\n```")
    parts.append(f"## Your notes ({notes_hint})\n\n" + _notes_text(ctx.notes_path))
    return "\n\n".join(parts)


def command_prompt(ctx: AgentContext) -> str:
    """The whole prompt for an external coding CLI, which has its own tools."""
    notes = str(ctx.notes_path) if ctx.notes_path is not None else "(none)"
    return "\n\n".join([
        ROLES.get(ctx.phase, ROLE),
        _programme_heading(ctx.phase) + ctx.program.strip(),
        "# This phase\n\n" + phase_instructions(ctx.phase),
        COMMAND_RULES,
        experiment_prompt(ctx, notes_hint=notes),
    ])


def allowed_files_section(worktree: Path, allowed_paths: list[str]) -> str:
    sections = []
    for allowed in allowed_paths:
        if any(char in allowed for char in "*?["):
            matches = sorted(p for p in Path(worktree).glob(allowed) if p.is_file())
        elif (Path(worktree) / allowed).is_dir():
            matches = sorted(p for p in (Path(worktree) / allowed).rglob("*")
                             if p.is_file() and "__pycache__" not in p.parts)
        else:
            matches = [Path(worktree) / allowed]
        for path in matches:
            relative = path.relative_to(worktree).as_posix()
            if not path.exists():
                sections.append(f"## {relative} (does not exist yet)")
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                sections.append(f"## {relative} (binary, not shown)")
                continue
            if len(text) > MAX_FILE_CHARS:
                text = text[:MAX_FILE_CHARS] + "\n[... truncated; read_file shows the rest]"
            sections.append(f"## {relative} (current content)\n\n```\n{text}\n```")
    return "\n\n".join(sections) if sections else "(no allowed files exist yet)"


def _notes_text(notes_path: Path | None) -> str:
    if notes_path is None or not Path(notes_path).exists():
        return "(empty: start it)"
    text = Path(notes_path).read_text().strip()
    return _tail(text, MAX_NOTES_CHARS) if text else "(empty: start it)"


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "[... earlier part cut ...]\n" + text[-limit:]


def one_line(text: str) -> str:
    """A description fit for a results.tsv cell: one line, no tabs, bounded."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_DESCRIPTION_CHARS else text[:MAX_DESCRIPTION_CHARS - 3] + "..."
