"""`python -m orchestrator schedule --at HH:MM --until HH:MM [run options]`: a run every night.

A foreground process (fit for nohup) around APScheduler's BlockingScheduler and a cron trigger.
Each night at `--at` it starts `python -m orchestrator run [run options] --tag <slug>-<mon><day>
--until HH:MM`, from the previous scheduled night's best commit (`--from autorl/<previous tag>`)
when there is one, as a subprocess in its own session, waits for it, and writes its report.
A night due while the previous one still runs is skipped (APScheduler's max_instances=1) with
a log line. SIGTERM or SIGINT stops the scheduler and the run in flight (which ends cleanly, as
on `stop`), writes that night's report, and exits.

Its state (pid, the next start, the nights it started) is `results/_schedule/schedule.json`,
which `status` reads; its log is `results/_schedule/schedule.log`.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Optional

from .config import RunError, check_tag, default_tag
from .daemon import LockHeld, RunLock, lock_holder, log
from .results import RunFolder, ScheduleFolder, utc_now
from .workspace import Workspace

STOP_WAIT_S = 300.0   # how long a stopped run may take to end its experiment in flight


class ScheduleError(RunError):
    pass


def parse_hhmm(text: str, flag: str) -> tuple[int, int]:
    try:
        hour, minute = (int(part) for part in text.strip().split(":"))
    except ValueError:
        raise ScheduleError(f"{flag} wants HH:MM (24-hour local time), got {text!r}") from None
    if not (0 <= hour <= 23 and 0 <= minute <= 59):
        raise ScheduleError(f"{flag} wants HH:MM (24-hour local time), got {text!r}")
    return hour, minute


class _Stop(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT to leave BlockingScheduler.start()."""


class Nights:
    """What the scheduler does each night, and its state file."""

    def __init__(self, root: Path, env_id: str, until: str, run_args: list[str], first_from: Optional[str] = None,
                 python: str = sys.executable):
        self.root = Path(root)
        self.results_root = self.root / "results"
        self.folder = ScheduleFolder(self.results_root)
        self.env_id = env_id
        self.until = until
        self.run_args = list(run_args)
        self.first_from = first_from
        self.python = python
        self.proc: Optional[subprocess.Popen] = None
        self.current: Optional[str] = None
        self.stopping = False
        self.next_start: Optional[datetime] = None
        self._lock = threading.Lock()
        self.state = self._load()

    # ------------------------------------------------------------ state
    def _load(self) -> dict:
        try:
            state = json.loads(self.folder.state.read_text())
        except (OSError, ValueError):
            state = {}
        state.setdefault("nights", [])
        return state

    def save(self, **changes) -> None:
        with self._lock:
            self.state.update(changes)
            self.state.update(pid=os.getpid(), updated=utc_now(), current=self.current,
                              next_start=self.next_start.isoformat(timespec="minutes") if self.next_start else None,
                              next_start_ts=self.next_start.timestamp() if self.next_start else None)
            tmp = self.folder.state.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.state, indent=1) + "\n")
            tmp.replace(self.folder.state)

    # ------------------------------------------------------------ one night
    def tag_for(self, now: datetime) -> str:
        """`<slug>-<mon><day>`, or with -2, -3, ... when that run or branch already exists."""
        base = default_tag(self.env_id, now)
        for n in range(1, 100):
            tag = check_tag(base if n == 1 else f"{base}-{n}")
            if not (self.results_root / tag).exists() and not Workspace(self.root, tag).exists():
                return tag
        raise ScheduleError(f"no free tag for {base}")

    def previous_best(self) -> Optional[str]:
        """The branch of the latest scheduled night that made one (its tip is that night's best)."""
        import git

        heads = {h.name for h in git.Repo(self.root).heads}
        for night in reversed(self.state["nights"]):
            branch = f"autorl/{night['tag']}"
            if branch in heads:
                return branch
        return self.first_from

    def command(self, tag: str, from_ref: Optional[str]) -> list[str]:
        cmd = [self.python, "-m", "orchestrator", "run", *self.run_args, "--tag", tag, "--until", self.until]
        return cmd + (["--from", from_ref] if from_ref else [])

    def night(self) -> None:
        """The scheduled job: start tonight's run, wait for it, write its report."""
        if self.stopping:
            return
        now = datetime.now()
        tag = self.tag_for(now)
        from_ref = self.previous_best()
        cmd = self.command(tag, from_ref)
        log.info("night %s: starting `%s`", tag, " ".join(cmd[1:]))
        record = {"tag": tag, "started": utc_now(), "from": from_ref, "command": cmd[1:]}
        self.state["nights"].append(record)
        self.current = tag
        self.proc = subprocess.Popen(cmd, cwd=self.root, start_new_session=True)
        record["pid"] = self.proc.pid
        self.save()
        code = self.proc.wait()
        run_dir = self.results_root / tag
        log.info("night %s: the run ended (exit %s)", tag, code)
        if (run_dir / RunFolder.CONFIG).exists():
            from . import report

            report.refresh(run_dir)
            record["report"] = str(RunFolder(run_dir).report_html)
            try:
                log.info("night %s:\n%s\nreport: %s", tag, report.summary_text(report.load(run_dir)),
                         record["report"])
            except Exception as exc:  # the summary is a courtesy; the files are written
                log.warning("night %s: no summary (%s)", tag, exc)
        record.update(ended=utc_now(), returncode=code)
        self.current, self.proc = None, None
        self.save()

    def stop_run(self, wait_s: float = STOP_WAIT_S) -> None:
        """SIGTERM to the run in flight (it aborts its experiment and ends cleanly); SIGKILL to its
        group if it has not ended after wait_s."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        log.info("stopping the run in flight (%s, pid %d)", self.current, proc.pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            log.warning("run %s did not end within %.0fs; killing its process group", self.current, wait_s)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# ---------------------------------------------------------------- the scheduler
def _trigger(at: str, every_s: Optional[float]):
    if every_s:  # tests: a night every few seconds
        from apscheduler.triggers.interval import IntervalTrigger

        return IntervalTrigger(seconds=every_s)
    from apscheduler.triggers.cron import CronTrigger

    hour, minute = parse_hhmm(at, "--at")
    return CronTrigger(hour=hour, minute=minute)


def _log_to(path: Path) -> None:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S%z"))
    log.addHandler(handler)
    aps = logging.getLogger("apscheduler")
    aps.setLevel(logging.WARNING)
    for h in log.handlers:
        aps.addHandler(h)


def serve(nights: Nights, at: str, every_s: Optional[float] = None, stop_wait_s: float = STOP_WAIT_S) -> int:
    """Run the schedule until SIGTERM/SIGINT; returns the exit code."""
    from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_MAX_INSTANCES
    from apscheduler.schedulers.blocking import BlockingScheduler

    from .daemon import setup_logging

    parse_hhmm(nights.until, "--until")
    trigger = _trigger(at, every_s)
    nights.folder.path.mkdir(parents=True, exist_ok=True)
    lock = RunLock(nights.folder.path)
    try:
        lock.acquire()
    except LockHeld as exc:
        raise ScheduleError(f"a schedule is already running here (pid {exc.pid}); stop it first "
                            f"(kill -TERM {exc.pid})") from None
    setup_logging(None)
    _log_to(nights.folder.log)
    scheduler = BlockingScheduler()

    def refresh_next() -> None:
        now = datetime.now().astimezone()
        nights.next_start = trigger.get_next_fire_time(None, now)
        nights.save()

    def on_event(event) -> None:
        if event.code == EVENT_JOB_MAX_INSTANCES:
            log.warning("night skipped: the previous night (%s) is still running", nights.current)
        elif event.code == EVENT_JOB_ERROR:
            log.error("the night failed inside the scheduler: %s", event.exception)
        refresh_next()

    def on_signal(signum, frame) -> None:
        if nights.stopping:
            log.info("%s: already stopping", signal.Signals(signum).name)
            return
        nights.stopping = True
        log.info("%s received: stopping the schedule and the run in flight", signal.Signals(signum).name)
        raise _Stop()

    scheduler.add_job(nights.night, trigger, id="night", name="night", max_instances=1, coalesce=True,
                      misfire_grace_time=600)
    scheduler.add_listener(on_event, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            refresh_next()
            when = nights.next_start.strftime("%a %d %b %H:%M") if nights.next_start else "?"
            log.info("schedule: a run of %s every night at %s until %s; next start %s (pid %d; state %s)",
                     nights.env_id, at if not every_s else f"every {every_s:g}s", nights.until, when, os.getpid(),
                     nights.folder.state)
            scheduler.start()
        except _Stop:
            pass
        nights.stopping = True
        nights.stop_run(stop_wait_s)
        if scheduler.running:
            scheduler.shutdown(wait=True)  # the night's thread records the run's end and writes its report
        nights.next_start = None
        nights.save()
        log.info("schedule stopped")
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        lock.release()


# ---------------------------------------------------------------- what status shows
def status_lines(results_root: Path) -> list[str]:
    folder = ScheduleFolder(results_root)
    if not folder.state.exists():
        return []
    try:
        state = json.loads(folder.state.read_text())
    except ValueError:
        return []
    pid = lock_holder(folder.path)
    if not pid:
        last = state.get("nights", [])[-1:] or [{}]
        return ["schedule: not running" + (f" (last night {last[0]['tag']})" if last[0].get("tag") else "")]
    line = f"schedule: running (pid {pid})"
    if state.get("next_start_ts"):
        when = datetime.fromtimestamp(state["next_start_ts"])
        left = max(0.0, state["next_start_ts"] - time.time())
        line += f"; next start {when:%a %d %b %H:%M} (in {int(left // 3600)}h{int(left % 3600 // 60):02d}m)"
    if state.get("current"):
        line += f"; tonight's run {state['current']} is running"
    return [line]
