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
    hands its CPU to the parent that reaps it; what was read of it is taken back from that parent's
    side, so nothing counts twice, and a short-lived process counts through its parent. The machine's
    busy CPU (/proc/stat) and the 1-minute load average stand beside them.)"""

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
        for pid, (ppid, _, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        ours, stack = set(), [self.root_pid]
        while stack:
            pid = stack.pop()
            ours.add(pid)
            stack.extend(children.get(pid, []))
        with self._lock:
            live = {(pid, start): pid for pid, (_, start, _) in table.items()}
            key_of = {pid: key for key, pid in live.items()}
            for key in [k for k in self._seen if k not in live]:   # ended: its reaper now holds its CPU
                ppid, ticks = self._seen.pop(key)
                reaper = key_of.get(ppid)
                if reaper in self._own_keys:
                    self._own -= ticks
                else:   # another's, or an orphan's reaped by init: init is no process of ours
                    self._other -= ticks
            for pid, (ppid, start, ticks) in table.items():
                key = (pid, start)
                if pid in ours:
                    self._own_keys.add(key)
                # all of a process born since the start; of an older one, what it added since the first read
                default = ticks if start < self._start_ticks else 0   # (10 ms ticks: one born in the start's is new)
                before = self._seen.get(key, (ppid, default))[1]
                self._seen[key] = (ppid, ticks)
                if key in self._own_keys:
                    self._own += ticks - before
                else:
                    self._other += ticks - before

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


def _processes() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, start tick since boot, CPU ticks) of every live process: user and system,
    its own and that of the children it has reaped."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:   # gone meanwhile
            continue
        fields = text[text.rindex(")") + 2:].split()   # after "pid (comm) ": state is fields[0]
        table[int(entry.name)] = (int(fields[1]), int(fields[19]), sum(int(x) for x in fields[11:15]))
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
