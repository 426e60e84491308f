"""The verdicts: for each way to profile, may it run on this node now, with its reasons and a
remedy a person can act on; and the doctor's findings of problems 4 and 5.

The rule that matters most: anything that programs the GPU's counters (ncu,
``nsys --gpu-metrics-devices``) is refused on a GPU that anyone else might be
using, because ncu locks clocks, flushes caches and serialises kernels for the
whole GPU. Pure and Python 3.8: it travels to the nodes.
"""

from __future__ import annotations

try:  # as shipped, the policy's parts travel under flat names (fleet/agent/bundle.py)
    from fleet_policy_neighbours import (dcgm_for_counters, neighbours_finding, sharing, tenants,
                                         unseen_tenants)
    from fleet_policy_permissions import (counter_access, nsys_cpu_sampling, nvml_reason,
                                          permissions_finding, report_dir_refused, tool_refused)
    from fleet_policy_nodestate import NodeState
    from fleet_policy_vocabulary import DEGRADED, OK, REFUSED, Finding, Request, Verdict
except ImportError:
    from .neighbours import dcgm_for_counters, neighbours_finding, sharing, tenants, unseen_tenants
    from .permissions import (counter_access, nsys_cpu_sampling, nvml_reason, permissions_finding,
                              report_dir_refused, tool_refused)
    from .nodestate import NodeState
    from .vocabulary import DEGRADED, OK, REFUSED, Finding, Request, Verdict

__all__ = ["nsys_trace", "counters", "assess", "findings"]


def nsys_trace(state: NodeState, request: Request) -> Verdict:
    if (refused := tool_refused(state, "nsys", "nsys-trace")):
        return refused
    if (refused := report_dir_refused(state, "nsys-trace")):
        return refused
    if (why := nvml_reason(state)):
        return Verdict("nsys-trace", DEGRADED, (why, "only CPU-side activity can be traced"))
    warnings = tuple(f"warning: {u}: the trace shares the GPU with them"
                     for u in unseen_tenants(state, request))
    return Verdict("nsys-trace", OK,
                   ("CUDA/NVTX tracing programs no GPU counters: safe beside other tenants",)
                   + warnings)


def counters(state: NodeState, request: Request, way: str, tool: str) -> Verdict:
    """ncu and nsys GPU metrics: they program the counters of the whole GPU, so they need counter
    access and GPUs nobody else may be using."""
    if (refused := tool_refused(state, tool, way)):
        return refused
    if (refused := report_dir_refused(state, way)):
        return refused
    if (why := nvml_reason(state)):
        return Verdict(way, REFUSED, (why,), "run on a node with an NVIDIA GPU and driver")
    allowed, how = counter_access(state)
    refusals = [] if allowed else [(how,
                                    "run as root, or have an admin set "
                                    "NVreg_RestrictProfilingToAdminUsers=0")]
    refusals += sharing(state, request)
    pause, dcgm = dcgm_for_counters(state, request)
    refusals += [dcgm] if dcgm else []
    if refusals:
        return Verdict(way, REFUSED, tuple(reason for reason, _ in refusals),
                       "; ".join(dict.fromkeys(remedy for _, remedy in refusals)),
                       tenants=tuple(tenants(state, request)))
    notes = [f"counter access: {how}", "no other process on the GPU"]
    if pause:
        notes.append("fleet will pause DCGM profiling for the run and resume it after")
    return Verdict(way, OK, tuple(notes))


def assess(state: NodeState, request: Request = Request()) -> list[Verdict]:
    """A verdict for each way to profile, in the order of WAYS."""
    return [nsys_trace(state, request), nsys_cpu_sampling(state, request),
            counters(state, request, "nsys-gpu-metrics", "nsys"), counters(state, request, "ncu",
                                                                           "ncu")]


def findings(state: NodeState) -> dict[str, Finding]:
    """Problems 4 (permissions) and 5 (neighbours), one finding each, for ``fleet doctor``."""
    permissions = permissions_finding(state)
    if (why := nvml_reason(state)):
        return {"permissions": permissions, "neighbours": Finding("n/a", why)}
    return {"permissions": permissions, "neighbours": neighbours_finding(state)}
