"""The node's state as types: one node as the agent's probe describes it (``fleet/agent/node.py``),
read once into :class:`NodeState` and its parts (each GPU's: :mod:`gpustate`), so that the policy
and everything after it read fields, never a node's dict.

The agent writes the document (JSON, as it crosses the wire); :meth:`NodeState.read` reads it,
on the controller where the probe's answer arrives (``agentcall.read_state``, the live look), and
on the node where the agent asks the policy itself (the last-moment check, the run's watch, the
Slurm prolog, a rank's plan). Reading never fails: a value not of its type reads as absent, and
absent reads as the cautious value (a process of unknown owner is someone else's, an unknown PID
namespace is another one). A section whose collector failed (``{"error": ...}``) reads as absent,
with its error in ``errors``. Pure and Python 3.8, like the rest of the policy: it travels to the
nodes. tests/test_node_state.py holds the fields to the keys the agent fills.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

try:  # as shipped, the policy's parts travel under flat names (fleet/agent/bundle.py)
    from fleet_policy_gpustate import Gpu
    from fleet_policy_nodefacts import NodeFacts
    from fleet_policy_readers import (bool_of, dict_of, dicts_of, int_of, ints_of, is_int,
                                      number_of, str_of)
except ImportError:
    from .gpustate import Gpu
    from .nodefacts import NodeFacts
    from .readers import bool_of, dict_of, dicts_of, int_of, ints_of, is_int, number_of, str_of

__all__ = ["NodeState", "Nvml", "NvidiaParams", "Capabilities", "Mps", "Dcgm", "DcgmListener",
           "Tool", "Tools", "ReportDir", "PrologVerdict"]


def _section(v: Any) -> Optional[Dict[str, Any]]:
    """A section of the document as read: None where it is absent or its collector failed."""
    return v if isinstance(v, dict) and "error" not in v else None


def _error(v: Any) -> Optional[str]:
    return str(v["error"]) if isinstance(v, dict) and "error" in v else None


@dataclass(frozen=True)
class Nvml:
    available: bool = False
    error: str | None = None
    driver: str | None = None           # where NVML is available, also the driver's versions
    cuda_driver: int | None = None
    nvml_version: str | None = None

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "Nvml":
        return cls(d.get("available") is True, str_of(d.get("error")), str_of(d.get("driver")),
                   int_of(d.get("cuda_driver")), str_of(d.get("nvml_version")))


@dataclass(frozen=True)
class NvidiaParams:
    driver_loaded: bool = False
    profiling_admin_only: int | None = None  # RmProfilingAdminOnly; None: unreadable

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "NvidiaParams":
        return cls(d.get("driver_loaded") is True, int_of(d.get("profiling_admin_only")))


@dataclass(frozen=True)
class Capabilities:
    effective: str | None = None        # CapEff, hex
    sys_admin: bool = False
    perfmon: bool = False

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "Capabilities":
        return cls(str_of(d.get("effective")), d.get("sys_admin") is True, d.get("perfmon") is True)


@dataclass(frozen=True)
class Mps:
    control_daemon: Tuple[int, ...] = ()  # pids
    servers: Tuple[int, ...] = ()
    pipe_directory: str | None = None

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "Mps":
        return cls(ints_of(d.get("control_daemon")), ints_of(d.get("servers")),
                   str_of(d.get("pipe_directory")))


@dataclass(frozen=True)
class DcgmListener:
    port: int | None = None
    usual_owner: str | None = None

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "DcgmListener":
        return cls(int_of(d.get("port")), str_of(d.get("usual_owner")))


@dataclass(frozen=True)
class Dcgm:
    hostengine: Tuple[int, ...] = ()     # pids
    exporter: Tuple[int, ...] = ()
    listening: Tuple[DcgmListener, ...] = ()

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "Dcgm":
        # a listener that is no object still says something listens: it counts, with no port
        listening = d.get("listening") if isinstance(d.get("listening"), list) else []
        return cls(ints_of(d.get("hostengine")), ints_of(d.get("exporter")),
                   tuple(DcgmListener.read(dict_of(entry)) for entry in listening))


@dataclass(frozen=True)
class Tool:
    path: str                           # resolved
    found_by: str | None = None         # "inventory", "PATH" or the pattern that matched
    # why another account could change it (then, as root, it is not run)
    writable_by_others: str | None = None
    version: str | None = None          # from --version, where it was run
    version_text: str | None = None
    # `nsys status -e`, where the environment check ran
    status: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "Tool":
        """``d`` holds a string ``path``."""
        status = {str(k): str(v) for k, v in dict_of(d.get("status")).items()}
        return cls(d["path"], str_of(d.get("found_by")), str_of(d.get("writable_by_others")),
                   str_of(d.get("version")), str_of(d.get("version_text")), status)


@dataclass(frozen=True)
class Tools:
    nsys: Tool | None = None            # None: not found (or no path to run it by)
    ncu: Tool | None = None

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "Tools":
        return cls(*(Tool.read(t) if isinstance(t, dict) and isinstance(t.get("path"),
                                                                        str) else None
                     for t in (d.get("nsys"), d.get("ncu"))))

    def named(self, name: str) -> Tool | None:
        return self.nsys if name == "nsys" else self.ncu if name == "ncu" else None


@dataclass(frozen=True)
class ReportDir:
    path: str | None = None
    exists: bool | None = None
    writable: bool | None = None
    free_bytes: int | None = None
    fstype: str | None = None
    memory_backed: bool | None = None
    unsafe: str | None = None           # why fleet would refuse to write there (files.problem)

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "ReportDir":
        return cls(str_of(d.get("path")), bool_of(d.get("exists")), bool_of(d.get("writable")),
                   int_of(d.get("free_bytes")), str_of(d.get("fstype")),
                   bool_of(d.get("memory_backed")), str_of(d.get("unsafe")))


@dataclass(frozen=True)
class PrologVerdict:
    """What fleet's Slurm prolog saw on a job's GPUs as root (agent/slurmd.py), or why there is
    none to read (``error`` alone, agent/task.py). ``tenants`` and ``by_gpu`` are None where the
    document has none of their shape: the policy then takes it to say nothing of the GPUs."""
    job: str | None = None
    gpus: Tuple[int, ...] | None = None      # Slurm's ids
    nvml: bool | None = None
    checked: float | None = None
    tenants: Tuple[str, ...] | None = None
    # GPU UUID -> its tenants (None: no list)
    by_gpu: Dict[str, Optional[Tuple[str, ...]]] | None = None
    dcgm: str | None = None             # "paused" where the prolog paused DCGM profiling
    error: str | None = None

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "PrologVerdict":
        job, gpus, tenants, by_gpu = d.get("job"), d.get("gpus"), d.get("tenants"), d.get("by_gpu")
        return cls(
            None if job is None else str(job), ints_of(gpus) if isinstance(gpus, list) else None,
            bool_of(d.get("nvml")), number_of(d.get("checked")),
            tuple(str(t) for t in tenants) if isinstance(tenants, list) else None,
            {str(k): tuple(str(t) for t in v) if isinstance(v, list) else None
             for k, v in by_gpu.items()}
            if isinstance(by_gpu, dict) else None,
            str_of(d.get("dcgm")), None if d.get("error") is None else str(d["error"]))



# The sections of the document whose collector may fail, leaving {"error": ...} (node.section).
SECTIONS = ("container", "capabilities", "nvidia", "tools", "report_dir")


@dataclass(frozen=True)
class NodeState:
    """One node as the agent sees it. ``node.probe`` fills every field but ``prolog_verdict``,
    which a Slurm rank adds (agent/task.py). The policy is also given parts of it: the run's
    last-moment check (``gpus``, ``mps``), its watch (``gpus`` as the look sends them,
    ``host_pid_namespace``) and the Slurm prolog (``gpus``, ``mps``, ``dcgm``,
    ``host_pid_namespace``): every field has the value that reads as "not known"."""
    agent: int | None = None            # node.AGENT_VERSION
    host: str | None = None
    kernel: str | None = None
    python: str | None = None
    uid: int | None = None
    gid: int | None = None
    euid: int | None = None
    user: str | None = None
    # whose processes are the run's own (the controller's account)
    owner_uid: int | None = None
    container: str | None = None
    host_pid_namespace: bool | None = None  # None: cannot tell
    slurm_job: str | None = None
    capabilities: Capabilities = Capabilities()
    perf_event_paranoid: int | None = None
    nvidia: NvidiaParams | None = None
    nvml: Nvml = Nvml()
    gpus: Tuple[Gpu, ...] = ()
    mps: Mps = Mps()
    dcgm: Dcgm = Dcgm()
    tools: Tools = Tools()
    report_dir: ReportDir | None = None
    elapsed_ms: float | None = None
    prolog_verdict: PrologVerdict | None = None  # None: no prolog installed
    errors: Dict[str, str] = field(default_factory=dict)  # section -> why its collector failed
    # The document as the agent wrote it, for what fleet prints and stores; never read for a
    # decision.
    document: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "NodeState":
        """``d``'s GPUs each hold an int ``index`` (the wire's shape, checked before)."""
        caps, nvidia, tools, rd = (_section(d.get(k)) for k in ("capabilities", "nvidia", "tools",
                                                                "report_dir"))
        prolog = d.get("prolog_verdict")
        return cls(
            int_of(d.get("agent")), str_of(d.get("host")), str_of(d.get("kernel")),
            str_of(d.get("python")),
            int_of(d.get("uid")), int_of(d.get("gid")), int_of(d.get("euid")),
            str_of(d.get("user")), int_of(d.get("owner_uid")),
            str_of(d.get("container")), bool_of(d.get("host_pid_namespace")),
            str_of(d.get("slurm_job")),
            Capabilities.read(caps) if caps is not None else Capabilities(),
            int_of(d.get("perf_event_paranoid")),
            NvidiaParams.read(nvidia) if nvidia is not None else None,
            Nvml.read(dict_of(d.get("nvml"))),
            tuple(Gpu.read(g) for g in dicts_of(d.get("gpus")) if is_int(g.get("index"))),
            Mps.read(dict_of(d.get("mps"))), Dcgm.read(dict_of(d.get("dcgm"))),
            Tools.read(tools) if tools is not None else Tools(),
            ReportDir.read(rd) if rd is not None else None, number_of(d.get("elapsed_ms")),
            PrologVerdict.read(prolog) if isinstance(prolog, dict) else None,
            {k: e for k in SECTIONS if (e := _error(d.get(k))) is not None}, d)

    def section_error(self, name: str) -> str | None:
        """Why the collector of section ``name`` failed on the node, or None where it did not."""
        return self.errors[name] if name in self.errors else None

    def chosen(self, indices) -> Tuple[Gpu, ...]:
        """The GPUs of ``indices`` (None: every GPU), in the node's order."""
        return self.gpus if indices is None else tuple(g for g in self.gpus if g.index in indices)

    def facts(self, indices, tool: str) -> NodeFacts:
        """What a run's manifest records of the node it ran on. ``indices``: the GPUs the run was
        given, None for every GPU."""
        chosen = self.chosen(indices)
        found = self.tools.named(tool)
        return NodeFacts(self.host, ", ".join(sorted(set(g.name or "?" for g in chosen))) or None,
                         self.nvml.driver, found.version if found is not None else None,
                         tuple({"gpu": g.index, "pid": p.pid, "user": p.user,
                                "used_memory": p.used_memory,
                                "foreign": p.foreign, "slurm_job": p.slurm_job} for g in chosen
                               for p in g.processes))
