"""Problem 4, permissions: may this account, on this node, run the profiler and read what it needs?

The tool's own file (root never runs a program another account can change), the report
directory, the GPU counters (root, CAP_SYS_ADMIN or RmProfilingAdminOnly=0), CPU sampling
(perf_event_paranoid, or an owned sysctl fleet holds for the run) and the least privilege a
profiled container gets. Pure and Python 3.8: it travels to the nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

try:  # as shipped, the policy's parts travel under flat names (fleet/agent/bundle.py)
    from fleet_policy_nodestate import NodeState, Tool
    from fleet_policy_vocabulary import (DEGRADED, NO_SAMPLING_FLAGS, OK, PARANOID_SYSCTL, REFUSED,
                                         Finding, Request, Verdict)
except ImportError:
    from .nodestate import NodeState, Tool
    from .vocabulary import (DEGRADED, NO_SAMPLING_FLAGS, OK, PARANOID_SYSCTL, REFUSED, Finding,
                             Request, Verdict)

__all__ = ["tool_found", "privileged", "sampling_given_up", "held_sysctls", "DockerPrivileges",
           "docker_privileges", "nsys_cpu_sampling", "sudo_sysctls"]


def sampling_given_up(why: str) -> tuple[tuple[str, ...], str]:
    """The nsys flags that turn CPU sampling off, and the line that says it was given up and why."""
    return NO_SAMPLING_FLAGS, "CPU sampling and context switches: " + why


def held_sysctls(tool: str) -> list[str]:
    """The owned sysctls a run of ``tool`` asks to hold: CPU sampling is nsys's alone."""
    return [PARANOID_SYSCTL] if tool == "nsys" else []


@dataclass(frozen=True)
class DockerPrivileges:
    cap_sys_admin: bool                 # GPU counters: the one capability they need
    seccomp_profile: str | None         # CPU sampling: a profile that allows perf_event_open
    given_up: str | None = None         # why CPU sampling cannot be had in the container


def docker_privileges(tool: str, counters: bool, sampling: bool,
                      seccomp_profile: str | None) -> DockerPrivileges:
    """The least privilege a profiled workload in ``docker run`` needs. Never --privileged;
    never SYS_ADMIN for CPU sampling (Docker's default seccomp profile refuses perf_event_open
    without it, so a profile that allows it is used, or sampling is given up)."""
    sampling = tool == "nsys" and sampling
    given_up = ("Docker refuses perf_event_open without a seccomp profile that allows it "
                "(set docker_seccomp_profile in the "
                "inventory)") if sampling and not seccomp_profile else None
    return DockerPrivileges(counters, seccomp_profile if sampling else None, given_up)


def tool_found(state: NodeState, name: str) -> Tool | None:
    """The tool as the node found it; None also when the tools section failed."""
    return state.tools.named(name)


def tool_refused(state: NodeState, name: str, way: str) -> Verdict | None:
    """The tool is missing, or root would run a program another account can change."""
    tool = tool_found(state, name)
    if tool is None:
        return with_way(_missing(name), way)
    if privileged(state) and tool.writable_by_others:
        return Verdict(way, REFUSED, (f"{name} at {tool.path}: {tool.writable_by_others}, so "
                                      "another account could change what fleet would run as root",),
                       "make it root's and not writable by others (chown root, chmod go-w), or "
                       f"set {name}_path to a copy that is")
    return None


def _missing(name: str) -> Verdict:
    var = f"{name}_path"
    where = ("PATH, /opt/nvidia/nsight-systems/*/bin, /usr/local/cuda/bin, Nsight Compute's copy"
             if name == "nsys"
             else "PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute/*")
    return Verdict("", REFUSED, (f"{name} not found ({where})",),
                   f"install {'Nsight Systems' if name == 'nsys' else 'Nsight Compute'} or set "
                   f"{var} in the inventory")


def privileged(state: NodeState) -> bool:
    return state.euid == 0


def counter_access(state: NodeState) -> tuple[bool, str]:
    admin_only = state.nvidia.profiling_admin_only if state.nvidia is not None else None
    if privileged(state) or state.capabilities.sys_admin:
        return True, "root or CAP_SYS_ADMIN"
    if admin_only == 0:
        return True, "RmProfilingAdminOnly=0"
    if admin_only is None:
        return False, ("cannot read RmProfilingAdminOnly from /proc/driver/nvidia/params, "
                       "so counters count as restricted")
    return False, "RmProfilingAdminOnly=1: GPU counters are for admins only (ERR_NVGPUCTRPERM)"


def nvml_reason(state: NodeState) -> str | None:
    """Why no GPU can be seen through NVML on this node, or None where they can."""
    if not state.nvml.available:
        return f"no GPU visible through NVML ({state.nvml.error or 'unavailable'})"
    if not state.gpus:
        return "NVML lists no GPU on this node"
    return None


def with_way(v: Verdict, way: str) -> Verdict:
    return Verdict(way, v.status, v.reasons, v.remedy, v.flags, v.sysctls, v.tenants)


def report_dir_refused(state: NodeState, way: str) -> Verdict | None:
    """Reports go only where the user alone can write (another account could redirect them)."""
    rd = state.report_dir
    if rd is not None and rd.unsafe:
        return Verdict(way, REFUSED, (f"report directory: {rd.unsafe}",),
                       "remove it, or set report_dir in the inventory to a directory of your own")
    if rd is not None and rd.writable is False:
        return Verdict(way, REFUSED, (f"report directory {rd.path} is not writable",),
                       "set report_dir in the inventory to a directory you can write")
    return None


def nsys_cpu_sampling(state: NodeState, request: Request) -> Verdict:
    if (refused := tool_refused(state, "nsys", "nsys-cpu-sampling")):
        return refused
    level = state.perf_event_paranoid
    if privileged(state):
        return Verdict("nsys-cpu-sampling", OK,
                       ("running as root: process-tree and system-wide sampling",))
    owned = request.owned_sysctls.get(PARANOID_SYSCTL)
    # An owned value already in place may be another fleet run's: hold it too, so that the
    # run that set it does not restore it under this one (the holders are counted).
    if owned is not None and int(owned) <= 2 and level is not None and (level > 2
                                                                        or level == int(owned)):
        return Verdict("nsys-cpu-sampling", OK,
                       (f"perf_event_paranoid={level}; fleet owns {PARANOID_SYSCTL} here and holds "
                        f"it at {owned} for the run, then restores it",),
                       sysctls={PARANOID_SYSCTL: owned})
    if level is not None and level <= 2:
        scope = ("process-tree and system-wide" if level <= 0
                 else "process-tree (system-wide needs <= 0 or root)")
        return Verdict("nsys-cpu-sampling", OK, (f"perf_event_paranoid={level}: {scope} sampling",))
    why = f"perf_event_paranoid={level}" if level is not None else "this kernel has no perf events"
    flags, _ = sampling_given_up(why)
    return Verdict("nsys-cpu-sampling", DEGRADED,
                   (f"{why}: CPU sampling off, fleet will pass {' '.join(flags)}",),
                   f"list {PARANOID_SYSCTL} in owned_sysctls (value 2) to let fleet set it",
                   flags=flags)


def permissions_finding(state: NodeState) -> Finding:
    """``fleet doctor``'s line for problem 4: CPU sampling and the GPU counters."""
    allowed, how = counter_access(state)
    level = state.perf_event_paranoid
    return Finding(OK if allowed and (level is not None and level <= 2 or privileged(state))
                   else "warn",
                   f"perf_event_paranoid={level}; GPU counters: "
                   f"{'yes, ' if allowed else 'no: '}{how}")


def sudo_sysctls(wanted: Dict[str, Any], node_owned: "Dict[str, Any] | None",
                 node_problem: "str | None"):
    """Which of ``wanted`` (name -> value) fleet's agent may set as root reached through sudo:
    only those the node's root-owned config lists (``owned_sysctls`` in /etc/fleet/node.json), at
    its value. The caller's own list is no allow-list there: whoever may run the agent under sudo
    chose it. Returns (allowed, why none is set); a missing or unsafe config allows none."""
    if node_problem:
        return {}, f"no sysctl is set as root through sudo: {node_problem}"
    owned = node_owned or {}
    unlisted = [f"{name}={value}" for name, value in wanted.items()
                if name not in owned or str(owned[name]) != str(value)]
    if unlisted:
        return {}, (f"no sysctl is set as root through sudo: {', '.join(unlisted)} is not among "
                    "the owned_sysctls of the node's root-owned config")
    return dict(wanted), None
