"""``fleet probe`` and ``fleet doctor``: node states and verdicts, as documents and as text.

The verdicts come from :mod:`fleet.policy`; this module only assembles and
shows them.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from .. import collection, placement, policy, wrapping
from ..transport import Result
from ..visible import visible

if TYPE_CHECKING:
    from ..inventory import Host

MARK = {"ok": "ok", "warn": "!!", "bad": "XX", "n/a": "--", "degraded": "degraded",
        "refused": "REFUSED"}


def request_for(host: "Host") -> policy.Request:
    return policy.Request(owned_sysctls=dict(host.vars.get("owned_sysctls") or {}))


def diagnosis(host: "Host", r: Result) -> dict:
    """One node's doctor document."""
    state = r.extra.get("state")
    if state is None:
        return {"host": host.name, "error": r.error, "error_kind": r.error_kind}
    request = request_for(host)
    return {"host": host.name, "error": None, "node": state.host, "nvml": asdict(state.nvml),
            "gpus": [{"index": g.index, "name": g.name, "architecture_name": g.architecture_name,
                      "mig_mode": asdict(g.mig_mode)} for g in state.gpus],
            "problems": {k: asdict(v) for k, v in problems(state).items()},
            "verdicts": [v.to_json() for v in policy.assess(state, request)]}


def problems(state: policy.NodeState) -> dict[str, policy.Finding]:
    """The five problems of the design, one finding each, each asked of its own door:
    fleet/placement, fleet/wrapping, fleet/collection, and the policy's
    permissions and neighbours."""
    return {"placement": placement.finding(state), "wrapping": wrapping.finding(state),
            "collection": collection.finding(state), **policy.findings(state)}


def worst(diagnoses: list[dict]) -> str:
    statuses = {v["status"] for d in diagnoses if d["error"] is None for v in d["verdicts"]}
    return (policy.REFUSED if policy.REFUSED in statuses
            else policy.DEGRADED if policy.DEGRADED in statuses else policy.OK)


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f}"


def _text(lines: list[str]) -> str:
    """The lines as one block, each line one line whatever a node or another user put in it (a
    process's name is its owner's choice): a newline in it is shown, never a line of fleet's own."""
    return "".join(visible(line) + "\n" for line in lines)


def render_doctor(d: dict) -> str:
    if d["error"]:
        return _text([f"{d['host']}: cannot examine: {d['error']}"])
    lines = [f"{d['host']}" + (f" ({d['node']})" if d["node"] and d["node"] != d["host"] else "")]
    for name, f in d["problems"].items():
        lines.append(f"  {name:<12} {MARK[f['status']]:>2}  {f['text']}")
    lines.append("")
    for v in d["verdicts"]:
        lines.append(f"  {v['way']:<18} {MARK[v['status']]:<9} {'; '.join(v['reasons'])}")
        if v["remedy"] and v["status"] != policy.OK:
            lines.append(f"  {'':<18} {'':<9} -> {v['remedy']}")
    return _text(lines)


def render_probe(host: str, r: Result) -> str:
    state = r.extra.get("state")
    if state is None:
        return _text([f"{host}: {r.error}"])
    head = f"{host}: "
    if not state.nvml.available:
        return _text([head + f"no GPU: {state.nvml.error}"])
    flags = _probe_flags(state)
    lines = [head + f"driver {state.nvml.driver}, {len(state.gpus)} GPU(s)"
             + (f" [{', '.join(flags)}]" if flags else "")]
    for g in state.gpus:
        lines += _gpu_lines(state, g)
    return _text(lines)


def _probe_flags(state: policy.NodeState) -> list[str]:
    """The node's services that share its GPUs, for the probe's first line: MPS, DCGM."""
    flags = []
    if state.mps.control_daemon:
        flags.append("MPS")
    if policy.dcgm_running(state):
        flags.append("DCGM")
    return flags


def _gpu_lines(state: policy.NodeState, g: policy.Gpu) -> list[str]:
    """One GPU's lines of the probe: the GPU, each of its processes, and the tenants not seen."""
    mig = " MIG" if g.mig else ""
    lines = [f"  GPU {g.index} {g.name} ({g.architecture_name}{mig}, {g.compute_mode}) "
             f"{_gib(g.memory_used)}/{_gib(g.memory_total)} GiB"]
    for p in g.processes:
        who = p.user or "?"
        tag = "  FOREIGN" if p.foreign else ""
        lines.append(f"      pid {p.pid!s:<8} {who:<12} {_gib(p.used_memory):>6} GiB  "
                     f"{','.join(p.kinds)} {p.name or ''}{tag}")
    unseen = policy.unseen_tenants(state, policy.Request(gpus=(g.index,)))
    if not g.processes:
        lines.append("      no processes listed" if unseen else "      no processes")
    return lines + [f"      UNSEEN  {u.split(': ', 1)[1]}" for u in unseen]
