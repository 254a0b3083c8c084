"""What else ran on the machine while a benchmark did (bench/nights.py records it beside each night)."""
from __future__ import annotations

import math
import os
import resource
import threading
import time
from pathlib import Path

import numpy as np


class MachineLoad:
    """What else ran on the machine while a night (and its rescoring) did: budgets are wall clock, so a
    night's figures hold only beside its conditions. CPU seconds of every process (/proc/stat) minus
    those of this benchmark's own children (the night's daemon, its runs and the rescoring), and the
    1-minute load average sampled each minute."""

    def __init__(self):
        self._busy, self._own, self._wall = _busy_cpu_s(), _children_cpu_s(), time.monotonic()
        self._loads: list[float] = [os.getloadavg()[0]]
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self):
        while not self._done.wait(60):
            self._loads.append(os.getloadavg()[0])

    def stop(self) -> dict:
        self._done.set()
        busy, own = _busy_cpu_s() - self._busy, _children_cpu_s() - self._own
        return {"cpus": len(os.sched_getaffinity(0)), "wall_s": round(time.monotonic() - self._wall, 1),
                "own_cpu_s": round(own, 1), "other_cpu_s": round(max(0.0, busy - own), 1),
                "load1_mean": round(float(np.mean(self._loads)), 2), "load1_max": round(max(self._loads), 2)}


def _busy_cpu_s() -> float:
    """CPU seconds every process has used since boot (all but idle and iowait), or NaN off Linux."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return math.nan
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
