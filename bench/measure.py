"""Measuring a client command on this machine, shared by the benchmarks in bench/."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from pathlib import Path


def timed(argv, env=None, stdin=None):
    """Wall time, output and status of one command."""
    start = time.monotonic()
    proc = subprocess.run(argv, env=env, input=stdin, capture_output=True,
                          stdin=None if stdin is not None else subprocess.DEVNULL)
    return time.monotonic() - start, proc.stdout, proc.stderr, proc.returncode


def children_cpu(fn):
    """Run fn; also return the CPU (user+sys) its child processes used, reaped ones included."""
    before = os.times()
    result = fn()
    after = os.times()
    return result, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def stats(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}



def machine_busy(seconds: float = 0.5) -> float:
    """Share of all CPUs busy over a short window (read while this benchmark is idle)."""
    def snap() -> tuple[int, int]:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(f), f[3] + f[4]
    t0, i0 = snap()
    time.sleep(seconds)
    t1, i1 = snap()
    return round(1 - (i1 - i0) / max(1, t1 - t0), 3)


def cpu_stat() -> tuple[float, float]:
    """Seconds of busy CPU (all CPUs, idle/iowait/steal left out) and of steal, since boot."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return (f[0] + f[1] + f[2] + f[5] + f[6]) / hz, f[7] / hz


def sshd_cpu(c) -> float:
    """CPU seconds of the sshd listeners and the children they reaped (sessions and the remote commands)."""
    hz = os.sysconf("SC_CLK_TCK")
    total = 0
    for h in c.hosts:
        try:
            fields = Path(f"/proc/{h.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, TypeError):
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / hz


def wait_quiet(limit: float, threshold: float = 0.10) -> float:
    """Wait up to ``limit`` seconds for other work on the machine to stop; returns the last busy share."""
    deadline = time.monotonic() + limit
    busy = machine_busy()
    while busy > threshold and time.monotonic() < deadline:
        busy = machine_busy(1.0)
    return busy
