"""The policy's words: what a request asks, what a verdict says, and the constants its rules share.

Pure and Python 3.8, like every part of the policy (it travels to the nodes).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, TypedDict

__all__ = ["NodeState", "Gpu", "GpuLook", "GpuProcess", "Tool", "PrologVerdict", "SectionError",
           "OK", "DEGRADED", "REFUSED", "WAYS", "HOPPER", "PARANOID_SYSCTL", "NO_SAMPLING_FLAGS",
           "COUNTER_OPTIONS", "Request", "Tenant", "Verdict", "Finding", "uses_counters"]


# --- the node's state: the agent's document of one node (fleet/agent/node.py's probe) ---
# TypedDicts, so that the document stays JSON as it crosses the wire, and Python 3.8 (the
# node's) has them. The annotations are never evaluated on a node (postponed, like every
# annotation of this module). tests/test_node_state.py holds the keys to what the agent fills.

class SectionError(TypedDict):
    """A section whose collector failed: the probe always returns a document (node.section)."""
    error: str


class Capabilities(TypedDict):
    effective: str  # CapEff, hex
    sys_admin: bool
    perfmon: bool


class NvidiaParams(TypedDict):
    driver_loaded: bool
    profiling_admin_only: int | None  # RmProfilingAdminOnly; None: unreadable


class _NvmlAnswer(TypedDict):
    available: bool
    error: str | None


class Nvml(_NvmlAnswer, total=False):
    """Where NVML is available, also the driver's versions."""
    driver: str
    cuda_driver: int | None
    nvml_version: str | None


class _GpuProcessListed(TypedDict):
    pid: int
    kinds: List[str]                 # compute, graphics, mps: the lists that name it
    used_memory: int | None
    gpu_instance: int | None         # MIG only
    compute_instance: int | None
    user: str | None
    uid: int | None
    name: str | None                 # its comm
    foreign: bool                    # not the run owner's, or not visible: someone else


class GpuProcess(_GpuProcessListed, total=False):
    why: str                         # only where its pid is not visible from the agent
    slurm_job: str | None            # only for the owner's own processes


class GpuLook(TypedDict):
    """Who is on one GPU: what the policy's neighbour rules read, and all the run's watch looks at
    (gpus.look)."""
    index: int
    processes: List[GpuProcess]
    process_list_error: str | None
    memory_used_by_processes: int | None  # NVML memory v2: every PID namespace's processes
    sampled_pids: List[int] | None


class MigMode(TypedDict):
    current: int | None
    pending: int | None


class Utilization(TypedDict):
    gpu: int
    memory: int


class MigInstance(TypedDict):
    uuid: str | None
    name: str | None
    gpu_instance: int | None
    compute_instance: int | None
    memory_total: int | None


class Gpu(GpuLook):
    """One GPU of the probe (gpus.gpu)."""
    uuid: str
    name: str
    minor: int | None                # /dev/nvidiaN: how Slurm's gres names it
    architecture: int | None         # NVML's number; HOPPER and later share counters with DCGM
    architecture_name: str
    mig_mode: MigMode
    compute_mode: str | int | None   # a name, or NVML's number where it has none
    memory_total: int | None
    memory_used: int | None
    memory_reserved: int | None
    utilization: Utilization | None
    mig_instances: List[MigInstance]


class Mps(TypedDict):
    control_daemon: List[int]        # pids
    servers: List[int]
    pipe_directory: str | None


class DcgmListener(TypedDict):
    port: int
    usual_owner: str


class Dcgm(TypedDict):
    hostengine: List[int]            # pids
    exporter: List[int]
    listening: List[DcgmListener]


class _ToolFound(TypedDict):
    path: str                        # resolved
    found_by: str                    # "inventory", "PATH" or the pattern that matched


class Tool(_ToolFound, total=False):
    writable_by_others: str          # why another account could change it (then, as root, it is not run)
    version: str | None              # from --version, where it was run
    version_text: str
    status: Dict[str, str]           # `nsys status -e`, where the environment check ran


class Tools(TypedDict):
    nsys: Tool | None                # None: not found
    ncu: Tool | None


class ReportDir(TypedDict):
    path: str
    exists: bool
    writable: bool
    free_bytes: int
    fstype: str | None
    memory_backed: bool
    unsafe: str | None               # why fleet would refuse to write there (files.problem)


class PrologVerdict(TypedDict, total=False):
    """What fleet's Slurm prolog saw on a job's GPUs as root (agent/slurmd.py), or why there is
    none to read (``error`` alone, agent/task.py)."""
    job: str
    gpus: List[int] | None           # Slurm's ids
    nvml: bool | None
    checked: float
    tenants: List[str]
    by_gpu: Dict[str, List[str]]     # GPU UUID -> its tenants
    dcgm: str | None                 # "paused" where the prolog paused DCGM profiling
    error: str


class NodeState(TypedDict, total=False):
    """One node as the agent sees it. ``node.probe`` fills every key but ``prolog_verdict``,
    which a Slurm rank adds (agent/task.py). The policy is also given parts of it: the run's
    last-moment check (``gpus``, ``mps``), its watch (``gpus`` as ``GpuLook``,
    ``host_pid_namespace``) and the Slurm prolog (``gpus``, ``mps``, ``dcgm``,
    ``host_pid_namespace``); so every key counts as optional to the policy."""
    agent: int                       # node.AGENT_VERSION
    host: str
    kernel: str
    python: str
    uid: int
    gid: int
    euid: int
    user: str
    owner_uid: int                   # whose processes are the run's own (the controller's account)
    container: str | None | SectionError
    host_pid_namespace: bool | None  # None: cannot tell
    slurm_job: str | None
    capabilities: Capabilities | SectionError
    perf_event_paranoid: int | None
    nvidia: NvidiaParams | SectionError
    nvml: Nvml
    gpus: List[Gpu]
    mps: Mps
    dcgm: Dcgm
    tools: Tools | SectionError
    report_dir: ReportDir | SectionError
    elapsed_ms: float
    prolog_verdict: PrologVerdict | None  # None: no prolog installed

OK, DEGRADED, REFUSED = "ok", "degraded", "refused"
WAYS = ("nsys-trace", "nsys-cpu-sampling", "nsys-gpu-metrics", "ncu")
HOPPER = 9  # from Hopper on, DCGM and profilers can share the counters
PARANOID_SYSCTL = "kernel.perf_event_paranoid"
NO_SAMPLING_FLAGS = ("--sample=none", "--cpuctxsw=none")  # --sample=none alone still traces context switches
# Profiler options that choose whose counters to program: fleet alone chooses, the GPUs its
# neighbour check covered (--gpu-metrics), so the planner refuses them among the user's -X flags.
COUNTER_OPTIONS = {"nsys": ("--gpu-metrics-devices", "--gpu-metrics-device")}


@dataclass(frozen=True)
class Request:
    gpus: tuple[int, ...] | None = None          # None: every GPU of the node
    allow_own: bool = False                      # the user's own other processes are not tenants
    owned_sysctls: dict[str, Any] = field(default_factory=dict)  # from the inventory
    pause_dcgm: bool = False
    job: str | None = None                       # inside a Slurm job: its id; the job's own processes stay


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
