"""A Modal function call waited on as the daemon waits on a process: spawned, watched while it
waits for a container and while it runs, cancelled on a stop, and spawned again when the
infrastructure (not the code) failed it.

Queue time is never the code's: a call's deadline counts from when its input is on a container,
never from `spawn`. Two things keep time there. The container itself: train_archive kills
train.py at budget + grace counted from train.py's start, and Modal's own function `timeout`
counts execution only, not scheduling ("It does not include scheduling time", modal.com/docs/
guide/timeouts). And the daemon, as a backstop for a container that never answers: from the
moment Modal says the input is on a container. Modal says so in `FunctionCall.get_call_graph()`:
an InputInfo whose `task_id` (the container) is empty is still queued (modal/call_graph.py,
modal/types.py). That is the only signal the real API offers the caller: the training container
runs with restrict_modal_access=True (no modal.Dict to write a start time into), and a generator
function, which could yield "started", cannot be spawned (Function.spawn raises "Cannot `spawn` a
generator function"). Modal calls the call graph best-effort and not real-time, so an empty graph
means "unknown", and an unknown call is given queue allowance plus run limit from spawn.

A pre-empted input is restarted by Modal on a new container "on the same input"
(modal.com/docs/guide/preemption): a new task id in the call graph, and its run limit starts over.
Infrastructure failures (the call never reached a container within the queue limit, Modal's
errors: lost inputs or pre-emption beyond Modal's retries as InternalFailure, OutputExpiredError,
FunctionTimeoutError, a terminated container, a lost connection) are retried with backoff; after
the last try the caller records them as the infrastructure's, never the candidate's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ...daemon import log, progress, sleep_unless
from ...inflight import InFlight

WAITING, RUNNING, UNKNOWN = "waiting", "running", "unknown"


@dataclass(frozen=True)
class CallPolicy:
    queue_limit_s: float = 1800.0   # this long without a container (a GPU): cancelled, spawned again
    tries: int = 3                  # spawns of one piece of work before it is the infrastructure's failure
    backoff_s: float = 30.0         # before try k+1: backoff_s * 2**(k-1)
    answer_margin_s: float = 900.0  # past the code's own limit: an image still pulling on its container,
                                    # extracting the commit, the result's way back
    state_poll_s: float = 10.0      # how often the call graph is read (one RPC)
    poll_s: float = 1.0             # get(timeout=poll_s) between checks


@dataclass
class CallOutcome:
    how: str                        # "ok" / "interrupted" / "error" (the function raised) / "timeout" / "infrastructure"
    value: Any = None
    detail: str = ""                # the error, or the infrastructure's reason
    waited_s: float = 0.0           # spawn to answer, every try
    queued_s: float = 0.0           # of which seen waiting for a container
    call_id: str = ""               # the last try's
    tries: int = 1
    earlier: list = field(default_factory=list)  # why each earlier try failed

    @property
    def ran_s(self) -> float:
        """Seconds not seen queued: what the containers may have billed."""
        return max(0.0, self.waited_s - self.queued_s)


def infrastructure_error(exc: BaseException) -> bool:
    """Modal's own errors (modal.exception.Error: InternalFailure, OutputExpiredError,
    FunctionTimeoutError, RemoteError for a terminated input, ConnectionError...) and a lost
    connection; an exception the function itself raised comes back as its own type."""
    if isinstance(exc, ConnectionError):
        return True
    try:
        import modal.exception
    except ImportError:  # pragma: no cover - modal is a dependency
        return False
    return isinstance(exc, modal.exception.Error)


def input_state(call) -> tuple[str, str]:
    """(WAITING / RUNNING / UNKNOWN, the container's task id) of a spawned call's input."""
    try:
        graph = call.get_call_graph()
    except Exception as exc:  # best-effort on Modal's side: never a reason to fail the call
        log.debug("no call graph for %s: %s", getattr(call, "object_id", "?"), exc)
        return UNKNOWN, ""
    mine = [info for info in graph if info.function_call_id == call.object_id]
    if not mine:
        return UNKNOWN, ""
    task = mine[0].task_id
    return (RUNNING, task) if task else (WAITING, "")


class CallWatcher:
    """Spawn, wait, retry: one per runner, shared by its threads (each call is its own)."""

    def __init__(self, journal: InFlight, should_stop: Callable[[], bool], policy: CallPolicy = CallPolicy()):
        self.journal, self.should_stop, self.policy = journal, should_stop, policy

    def run(self, exp: int, stage: str, spawn: Callable[[], Any], run_limit_s: float, waiting_for: str,
            label: str, tick: str, overrun: str = "infrastructure") -> CallOutcome:
        """Spawn with `spawn()` and wait; `run_limit_s` counts from the input's start on a container
        (the code's own limit: the margin is added here). A call still running past it ends as
        `overrun`: "infrastructure" where the container enforces the code's limit itself (training),
        "timeout" where the limit is the daemon's own (scoring). Retries infrastructure failures."""
        p = self.policy
        waited = queued = 0.0
        outcome, earlier = CallOutcome("infrastructure"), []
        for attempt in range(1, p.tries + 1):
            if attempt > 1:
                earlier.append(outcome.detail)
                delay = p.backoff_s * 2 ** (attempt - 2)
                log.warning("%s: %s; Modal call %s again in %.0fs (try %d of %d)", label, outcome.detail, stage,
                            delay, attempt, p.tries)
                if not sleep_unless(self.should_stop, delay, tick_s=0.2):
                    return CallOutcome("interrupted", waited_s=waited, queued_s=queued, call_id=outcome.call_id,
                                       tries=attempt - 1, earlier=earlier)
            outcome = self._one_try(exp, stage, spawn, run_limit_s + p.answer_margin_s, waiting_for, label, tick,
                                    attempt, overrun)
            waited, queued = waited + outcome.waited_s, queued + outcome.queued_s
            outcome.waited_s, outcome.queued_s, outcome.tries, outcome.earlier = waited, queued, attempt, earlier
            if outcome.how != "infrastructure":
                return outcome
        outcome.detail = f"{outcome.detail} (tried {p.tries} times)" if p.tries > 1 else outcome.detail
        return outcome

    def _one_try(self, exp: int, stage: str, spawn: Callable[[], Any], run_limit_s: float, waiting_for: str,
                 label: str, tick: str, attempt: int, overrun: str) -> CallOutcome:
        p = self.policy
        started = time.monotonic()
        try:
            call = spawn()
        except Exception as exc:  # Modal unreachable, the app gone: nothing ran
            how = "infrastructure" if infrastructure_error(exc) else "error"
            return CallOutcome(how, detail=f"spawn failed: {type(exc).__name__}: {exc}")
        handle = {"kind": "modal", "call_id": call.object_id, "stage": stage, "try": attempt, "tries": p.tries}
        self.journal.add_handle(exp, {**handle, "state": UNKNOWN, "since": time.time()})
        watch = _Watch(started)
        try:
            while True:
                now = time.monotonic()
                if self.should_stop():
                    _cancel(call)
                    return watch.outcome("interrupted", call)
                if now >= watch.next_look:
                    watch.next_look = now + p.state_poll_s
                    if watch.see(*input_state(call), now):
                        self.journal.update_handle(exp, call.object_id, state=_shown(watch.state, waiting_for),
                                                   since=time.time())
                reason = watch.overdue(now, p.queue_limit_s, run_limit_s, waiting_for)
                if reason:
                    _cancel(call)
                    return watch.outcome(overrun if watch.state == RUNNING else "infrastructure", call, reason)
                try:
                    value = call.get(timeout=p.poll_s)
                except TimeoutError:  # builtins.TimeoutError: still running (FunctionCall.get's contract)
                    progress.show(f"{label}: {_shown(watch.state, waiting_for)} on Modal "
                                  f"{now - watch.since:.0f}s ({tick})")
                    continue
                except Exception as exc:
                    how = "infrastructure" if infrastructure_error(exc) else "error"
                    return watch.outcome(how, call, f"{type(exc).__name__}: {exc}".rstrip(": "))
                return watch.outcome("ok", call, value=value)
        finally:
            self.journal.update_handle(exp, call.object_id, state="ended", since=time.time())


class _Watch:
    """What one try has seen of its input: waiting, running on a task, since when."""

    def __init__(self, started: float):
        self.started = started
        self.state, self.task = UNKNOWN, ""
        self.since = started              # of the current state
        self.queued = 0.0                 # seen waiting, finished spells
        self.next_look = started

    def see(self, state: str, task: str, now: float) -> bool:
        """Take a reading; True when it changed (a new task is a restart: pre-empted)."""
        if state == UNKNOWN or (state, task) == (self.state, self.task):
            return False
        if self.state == WAITING:
            self.queued += now - self.since
        if state == RUNNING and self.task and task != self.task:
            log.warning("Modal call restarted its input on a new container (%s after %s): pre-empted", task,
                        self.task)
        self.state, self.task, self.since = state, task, now
        return True

    def overdue(self, now: float, queue_limit_s: float, run_limit_s: float, waiting_for: str) -> Optional[str]:
        if self.state == WAITING and now - self.since > queue_limit_s:
            return f"Modal call never started: waited {now - self.since:.0f}s for {waiting_for}"
        if self.state == RUNNING and now - self.since > run_limit_s:
            return f"the container did not answer {run_limit_s:.0f}s after it started"
        if self.state == UNKNOWN and now - self.started > queue_limit_s + run_limit_s:
            return f"Modal never said the call started, and it did not answer in {now - self.started:.0f}s"
        return None

    def outcome(self, how: str, call, detail: str = "", value: Any = None) -> CallOutcome:
        now = time.monotonic()
        queued = self.queued + (now - self.since if self.state == WAITING else 0.0)
        return CallOutcome(how, value, detail, now - self.started, queued, call.object_id)


def _shown(state: str, waiting_for: str) -> str:
    return {WAITING: f"waiting for {waiting_for}", RUNNING: "running"}.get(state, "spawned")


def _cancel(call) -> None:
    try:
        call.cancel()
    except Exception as exc:
        log.warning("could not cancel Modal call %s: %s", getattr(call, "object_id", "?"), exc)
