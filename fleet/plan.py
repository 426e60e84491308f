"""From a node's state and a profiling request to a plan the agent carries out, or a refusal.

Pure and Python 3.8, like :mod:`fleet.policy`, whose verdicts it follows: the policy says
what is allowed and why; this module turns an allowed request into the exact
profiler command line, environment, sysctls, locks and checks for one node.
``--dry-run`` prints these plans and touches nothing.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

try:  # as shipped to a Slurm task by fleet (fleet/agent/task.py), modules travel under flat names
    import fleet_policy as policy
except ImportError:
    from . import policy

DEGRADED, OK, REFUSED, NodeState = policy.DEGRADED, policy.OK, policy.REFUSED, policy.NodeState

@dataclass(frozen=True)
class ProfileRequest:
    tool: str                                   # nsys | ncu
    command: tuple[str, ...]
    run_id: str
    gpus: tuple[int, ...] | None = None
    gpu_metrics: bool = False                   # nsys --gpu-metrics-devices
    allow_own: bool = False
    pause_dcgm: bool = False
    profiler_args: tuple[str, ...] = ()         # passed through to nsys/ncu
    timeout: float | None = None                # seconds, then SIGTERM to the profiler
    lock_wait: float = 0.0                      # seconds to wait for another run's GPU lock
    clock_control: str = "base"                 # ncu; always explicit
    output_name: str | None = None              # under the run's directory; default HOST-%p
    job: str | None = None                      # planned inside this Slurm job (its ranks are not tenants)
    docker_image: str | None = None             # lab servers: the workload runs in this image (fleet.containers)


@dataclass(frozen=True)
class Plan:
    host: str
    status: str                                 # ok | refused
    reasons: tuple[str, ...] = ()
    remedy: str | None = None
    argv: tuple[str, ...] = ()                  # the profiler and the workload
    env: dict[str, str] = field(default_factory=dict)
    output: str = ""                            # report name without extension (placeholders allowed)
    report_dir: str = ""
    sysctls: dict[str, Any] = field(default_factory=dict)   # owned sysctls to set for the run
    owned_sysctls: dict[str, Any] = field(default_factory=dict)
    gpu_locks: tuple[str, ...] = ()             # GPU UUIDs whose counters the run takes
    recheck: dict[str, Any] = field(default_factory=dict)   # last-moment tenant check before the profiler
    pause_dcgm: bool = False
    given_up: tuple[str, ...] = ()
    tenants: tuple[policy.Tenant, ...] = ()
    timeout: float | None = None
    lock_wait: float = 0.0
    tool: str = ""
    nsys: str | None = None                     # for finishing a leftover .qdstrm
    ncu: str | None = None                      # for reading an ncu report's metrics on the node

    def to_json(self) -> dict:
        return asdict(self)

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


def _refuse(host: str, v: policy.Verdict) -> Plan:
    return Plan(host, REFUSED, v.reasons, v.remedy, tenants=v.tenants)


def plan(host: str, state: NodeState, req: ProfileRequest, owned_sysctls: dict[str, Any] | None = None) -> Plan:
    owned = dict(owned_sysctls or {})
    request = policy.Request(gpus=req.gpus, allow_own=req.allow_own, owned_sysctls=owned,
                             pause_dcgm=req.pause_dcgm, job=req.job)
    verdicts = {v.way: v for v in policy.assess(state, request)}
    missing = [i for i in (req.gpus or ()) if i not in [g.get("index") for g in state.get("gpus") or []]]
    if missing:
        return Plan(host, REFUSED, (f"no GPU {missing} on this node",), "choose a GPU that `fleet probe` lists")
    uses_counters = req.tool == "ncu" or req.gpu_metrics
    counters = verdicts["ncu" if req.tool == "ncu" else "nsys-gpu-metrics"]
    base = verdicts["nsys-trace"] if req.tool == "nsys" else counters
    if base.status == REFUSED:
        return _refuse(host, base)
    if uses_counters and counters.status != OK:
        return _refuse(host, counters)

    rd = (state.get("report_dir") or {}).get("path") or "/var/tmp/fleet"
    # Named by the inventory's host name, which is unique even where nodes share a report
    # directory (NFS) and their hostnames collide (containers).
    output = f"{rd}/{req.run_id}/{req.output_name or host + '-%p'}"
    chosen = policy.chosen_gpus(state, request)
    env = {"CUDA_VISIBLE_DEVICES": ",".join(g["uuid"] for g in chosen)} if req.gpus is not None else {}
    given_up: list[str] = []
    sysctls: dict[str, Any] = {}
    tools = state.get("tools") or {}
    if req.tool == "nsys":
        sampling = verdicts["nsys-cpu-sampling"]
        flags = list(sampling.flags)
        if sampling.status == DEGRADED:
            given_up.append("CPU sampling and context switches: " + sampling.reasons[0].split(":")[0])
        sysctls.update(sampling.sysctls)
        if base.status == DEGRADED:
            given_up.append("GPU activity: " + base.reasons[0])
        if req.gpu_metrics:
            flags.append("--gpu-metrics-devices=" + ",".join(str(g["index"]) for g in chosen))
        argv = [tools["nsys"]["path"], "profile", f"--output={output}", *flags, *req.profiler_args, "--",
                *req.command]
    else:
        argv = [tools["ncu"]["path"], "--clock-control", req.clock_control, "--export", output,
                *req.profiler_args, "--", *req.command]
    recheck = {"gpus": [g["index"] for g in chosen], "allow_own": req.allow_own} if uses_counters else {}
    dcgm = state.get("dcgm") or {}
    pause = bool(uses_counters and req.pause_dcgm and (dcgm.get("hostengine") or dcgm.get("listening"))
                 and any((g.get("architecture") or 0) < policy.HOPPER for g in chosen))
    notes = counters.reasons if uses_counters else base.reasons
    return Plan(host, OK, tuple(notes), None, tuple(argv), env, output, f"{rd}/{req.run_id}", sysctls, owned,
                tuple(g["uuid"] for g in chosen) if uses_counters else (), recheck, pause, tuple(given_up),
                timeout=req.timeout, lock_wait=req.lock_wait, tool=req.tool,
                nsys=(tools.get("nsys") or {}).get("path"), ncu=(tools.get("ncu") or {}).get("path"))
