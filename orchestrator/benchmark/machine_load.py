"""What else ran on the machine while a benchmark did (bench/nights.py records it beside each night)."""
from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path

import numpy as np

SAMPLE_S = 2.0   # how often the processes are read: one that lives less than this may go uncounted


class MachineLoad:
    """What else ran on the machine while a night (and its rescoring) did: budgets are wall clock, so a
    night's figures hold only beside its conditions. Every SAMPLE_S each process's CPU time is read
    from /proc, its own and its reaped children's, and its growth counted as the benchmark's own (a
    descendant of `root_pid`, or a process once seen as one) or as another's. A process that ends
    hands its CPU to the parent that reaps it (as that parent's children's CPU): what was read of it
    is not counted again there, so nothing counts twice, a short-lived process counts through its
    parent, and an orphan's CPU stays where it was read (whether or not the init that reaps it adds
    it up). One whose parent ended in the same read was reaped by init or by that parent: it is taken
    back from what init added, then from its nearest live ancestor (which reaped that parent). The
    machine's busy CPU (/proc/stat) and the 1-minute load average stand beside them."""

    def __init__(self, root_pid: int | None = None):
        self.root_pid = root_pid or os.getpid()
        self._start_ticks = _boot_ticks_now()
        self._seen: dict[tuple[int, int], tuple[int, int]] = {}   # (pid, start tick) -> (ppid, CPU ticks) last read
        self._own_keys: set[tuple[int, int]] = set()
        self._own = self._other = 0
        self._busy, self._wall = _busy_cpu_s(), time.monotonic()
        self._loads: list[float] = [os.getloadavg()[0]]
        self._lock = threading.Lock()
        self._read()
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self):
        reads = 0
        while not self._done.wait(SAMPLE_S):
            self._read()
            reads += 1
            if reads % int(60 / SAMPLE_S) == 0:
                self._loads.append(os.getloadavg()[0])

    def _read(self):
        table = _processes()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        ours, stack = set(), [self.root_pid]
        while stack:
            pid = stack.pop()
            ours.add(pid)
            stack.extend(children.get(pid, []))
        with self._lock:
            key_of = {pid: (pid, start) for pid, (_, start, _, _) in table.items()}
            live = set(key_of.values())
            ended = {key: self._seen.pop(key) for key in [k for k in self._seen if k not in live]}
            reaped: dict[tuple[int, int], int] = {}   # reaper -> the CPU of its ended children already counted
            unplaced: list[tuple[tuple[int, int] | None, int]] = []   # (a live ancestor, CPU) of the undecided
            parent_of_ended = {pid: ppid for (pid, _), (ppid, _, _) in ended.items()}
            for key, (ppid, own_cpu, children_cpu) in ended.items():
                if ppid in key_of:   # its parent lives on: that parent reaped it
                    reaped[key_of[ppid]] = reaped.get(key_of[ppid], 0) + own_cpu + children_cpu
                else:   # orphaned to init, or reaped by a parent that ended after it: decided below
                    unplaced.append((_live_ancestor(ppid, parent_of_ended, key_of), own_cpu + children_cpu))
            added_by: dict[tuple[int, int], tuple[int, int]] = {}   # key -> (own CPU added, reaped CPU added)
            for pid, (ppid, start, own_cpu, children_cpu) in table.items():
                key = (pid, start)
                if pid in ours:
                    self._own_keys.add(key)
                # all of a process born since the start; of an older one, what it added since the first read
                older = start < self._start_ticks   # (10 ms ticks: one born in the start's is new)
                _, own_before, children_before = self._seen.get(key, (ppid, own_cpu if older else 0,
                                                                      children_cpu if older else 0))
                self._seen[key] = (ppid, own_cpu, children_cpu)
                added_by[key] = (own_cpu - own_before, children_cpu - children_before)
            # what a reaper added of children read before counts once, where they were read; a reaper
            # that adds no reaped CPU (an init that ignores SIGCHLD) gives nothing back. An undecided
            # one is taken from what init added beyond its known children, the rest from its ancestor
            taken = {key: min(added_by[key][1], cpu) for key, cpu in reaped.items() if key in added_by}
            for ancestor, cpu in unplaced:
                for reaper in (key_of.get(1), ancestor):
                    if reaper in added_by and cpu > 0:
                        take = min(cpu, added_by[reaper][1] - taken.get(reaper, 0))
                        taken[reaper], cpu = taken.get(reaper, 0) + take, cpu - take
            for key, (own_added, children_added) in added_by.items():
                added = own_added + children_added - taken.get(key, 0)
                if key in self._own_keys:
                    self._own += added
                else:
                    self._other += added

    def stop(self) -> dict:
        self._done.set()
        self._sampler.join()
        self._read()
        tick = os.sysconf("SC_CLK_TCK")
        busy = _busy_cpu_s() - self._busy
        return {"cpus": len(os.sched_getaffinity(0)), "wall_s": round(time.monotonic() - self._wall, 1),
                "busy_cpu_s": round(busy, 1), "own_cpu_s": round(self._own / tick, 1),
                "other_cpu_s": round(self._other / tick, 1), "sample_s": SAMPLE_S,
                "load1_mean": round(float(np.mean(self._loads)), 2), "load1_max": round(max(self._loads), 2)}


def _live_ancestor(ppid: int, parent_of_ended: dict[int, int], key_of: dict) -> tuple[int, int] | None:
    """The nearest live process up an ended process's line of ended parents (their last-read ppids)."""
    for _ in range(len(parent_of_ended) + 1):   # (a reused pid cannot loop it)
        if ppid in key_of:
            return key_of[ppid]
        if ppid not in parent_of_ended:
            return None
        ppid = parent_of_ended[ppid]
    return None


def _processes() -> dict[int, tuple[int, int, int, int]]:
    """pid -> (parent pid, start tick since boot, its own CPU ticks, its reaped children's) of every
    live process (user and system, each)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:   # gone meanwhile
            continue
        fields = text[text.rindex(")") + 2:].split()   # after "pid (comm) ": state is fields[0]
        table[int(entry.name)] = (int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]),
                                  int(fields[13]) + int(fields[14]))
    return table


def _boot_ticks_now() -> int:
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def _busy_cpu_s() -> float:
    """CPU seconds every process has used since boot (all but idle and iowait), or NaN off Linux."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return math.nan
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
