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
    it up; one whose parent ended in the same read is taken back from init's). The machine's busy
    CPU (/proc/stat) and the 1-minute load average stand beside them."""

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
            reaped: dict[tuple[int, int], int] = {}   # reaper -> the CPU of its ended children already counted
            for key in [k for k in self._seen if k not in live]:
                ppid, own_cpu, children_cpu = self._seen.pop(key)
                # its parent reaps it; one whose parent is gone too was orphaned to init (pid 1), which
                # may or may not add it up: the min() below takes back at most what a reaper added
                reaper = key_of.get(ppid) if ppid in key_of else key_of.get(1)
                if reaper is not None:
                    reaped[reaper] = reaped.get(reaper, 0) + own_cpu + children_cpu
            for pid, (ppid, start, own_cpu, children_cpu) in table.items():
                key = (pid, start)
                if pid in ours:
                    self._own_keys.add(key)
                # all of a process born since the start; of an older one, what it added since the first read
                older = start < self._start_ticks   # (10 ms ticks: one born in the start's is new)
                _, own_before, children_before = self._seen.get(key, (ppid, own_cpu if older else 0,
                                                                      children_cpu if older else 0))
                self._seen[key] = (ppid, own_cpu, children_cpu)
                children_added = children_cpu - children_before
                # what it reaped of children read before counts once, where they were read (a reaper
                # that adds no reaped CPU, as an init that ignores SIGCHLD, takes nothing back)
                added = own_cpu - own_before + children_added - min(children_added, reaped.get(key, 0))
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
