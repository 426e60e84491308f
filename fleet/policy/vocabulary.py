"""The policy's words: what a request asks, what a verdict says, and the constants its rules share
(what the node is, the policy's input, is :mod:`nodestate`).

Pure and Python 3.8, like every part of the policy (it travels to the nodes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["OK", "DEGRADED", "REFUSED", "WAYS", "HOPPER", "PARANOID_SYSCTL", "NO_SAMPLING_FLAGS",
           "COUNTER_OPTIONS", "Request", "Tenant", "Verdict", "Finding", "uses_counters"]


OK, DEGRADED, REFUSED = "ok", "degraded", "refused"
WAYS = ("nsys-trace", "nsys-cpu-sampling", "nsys-gpu-metrics", "ncu")
HOPPER = 9  # from Hopper on, DCGM and profilers can share the counters
PARANOID_SYSCTL = "kernel.perf_event_paranoid"
# --sample=none alone still traces context switches
NO_SAMPLING_FLAGS = ("--sample=none", "--cpuctxsw=none")
# Profiler options that choose whose counters to program: fleet alone chooses, the GPUs its
# neighbour check covered (--gpu-metrics), so the planner refuses them among the user's -X flags.
COUNTER_OPTIONS = {"nsys": ("--gpu-metrics-devices", "--gpu-metrics-device")}


@dataclass(frozen=True)
class Request:
    gpus: tuple[int, ...] | None = None          # None: every GPU of the node
    allow_own: bool = False                      # the user's own other processes are not tenants
    owned_sysctls: dict[str, Any] = field(default_factory=dict)  # from the inventory
    pause_dcgm: bool = False
    # inside a Slurm job: its id; the job's own processes stay
    job: str | None = None


@dataclass(frozen=True)
class Tenant:
    gpu: int
    pid: int
    user: str | None
    used_memory: int | None
    why: str

    def __str__(self) -> str:
        mem = f", {self.used_memory / 1e9:.1f} GB" if self.used_memory else ""
        return f"GPU {self.gpu}: pid {self.pid} ({self.user or 'unknown user'}{mem}) {self.why}"


@dataclass(frozen=True)
class Verdict:
    way: str
    status: str
    reasons: tuple[str, ...] = ()
    remedy: str | None = None
    flags: tuple[str, ...] = ()       # what fleet will pass because of this verdict
    sysctls: dict[str, Any] = field(default_factory=dict)  # what fleet will set (owned only)
    tenants: tuple[Tenant, ...] = ()

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Finding:
    status: str  # ok | warn | bad | n/a
    text: str


def uses_counters(tool: str, gpu_metrics: bool) -> bool:
    """ncu and nsys GPU metrics program the counters of the whole GPU."""
    return tool == "ncu" or bool(gpu_metrics)
