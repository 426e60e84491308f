"""What may run where: a pure function from a node's state and a request to verdicts.

No I/O here, and nothing newer than Python 3.8: the agent carries this module
to the nodes for its last-moment check. The node state is the agent's JSON document (``fleet/agent/node.py``);
the request says what the user asks for. Every rule of problems 4
(permissions) and 5 (neighbours) lives in this file and nowhere else, and
every verdict carries its reasons and a remedy a person can act on.

Besides the verdicts of ``assess`` and the doctor's ``findings``, the smaller rules the other
parts only apply live here too: ``uses_counters``, ``unseen_tenants``, ``dcgm_pause``,
``prolog_tenants``, ``newcomers`` (who joined a run's GPUs), ``guards`` (GPU locks, the last-moment check, pinning GPUs, who changes
node state), ``held_sysctls``, ``exclusive_node``, ``docker_privileges``, ``sampling_given_up``
and ``COUNTER_OPTIONS`` (the profiler options only fleet may set).

The rule that matters most: anything that programs the GPU's counters (ncu,
``nsys --gpu-metrics-devices``) is refused on a GPU that anyone else might be
using, because ncu locks clocks, flushes caches and serialises kernels for the
whole GPU. When unsure whether a GPU is shared, it is treated as shared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict

NodeState = Dict[str, Any]  # typing.Dict: this module also runs on nodes with Python 3.8

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


def sampling_given_up(why: str) -> tuple[tuple[str, ...], str]:
    """The nsys flags that turn CPU sampling off, and the line that says it was given up and why."""
    return NO_SAMPLING_FLAGS, "CPU sampling and context switches: " + why


def held_sysctls(tool: str) -> list[str]:
    """The owned sysctls a run of ``tool`` asks to hold: CPU sampling is nsys's alone."""
    return [PARANOID_SYSCTL] if tool == "nsys" else []


def exclusive_node(asked: bool | None, counters: bool) -> bool:
    """Whether a Slurm job takes its nodes whole: counters program the whole GPU, so by default
    a counter-using job shares its nodes with no other job."""
    return bool(asked) if asked is not None else counters


@dataclass(frozen=True)
class Guards:
    """How a planned run keeps its GPUs to itself until the profiler starts."""
    gpu_locks: bool    # the node-wide counter lock per GPU (one counter-using profiler at a time)
    recheck: bool      # look at the GPUs again right before the profiler starts
    pin_gpus: bool     # CUDA_VISIBLE_DEVICES set to the chosen GPUs
    node_state: bool   # the run itself sets owned sysctls and pauses DCGM


def guards(request: Request, counters: bool) -> Guards:
    """Inside a Slurm job the allocation is the lock: ranks sharing a GPU must not refuse each
    other, the plan is made on the node a moment before the profiler, Slurm (or the launcher)
    chose each task's GPUs, and the node's prolog, as root, holds sysctls and pauses DCGM."""
    in_job = request.job is not None
    return Guards(gpu_locks=counters and not in_job, recheck=counters and not in_job,
                  pin_gpus=request.gpus is not None and not in_job, node_state=not in_job)


def job_gpu_indices(slurm_ids: tuple[int, ...] | None, gpus: list[dict]) -> tuple[int, ...] | None:
    """NVML's indices of the GPUs Slurm gave a job (None: every GPU visible). Slurm names them by
    its own ids (gres.conf's /dev/nvidiaN), not by NVML's numbering, which in a job with
    constrained devices counts only the allocated GPUs from 0: matched by the device's minor
    number. Where an id finds no device, every visible GPU counts as the job's: more GPUs
    checked for neighbours, never another one than the job's."""
    by_minor = {g.get("minor"): g["index"] for g in gpus if g.get("minor") is not None}
    if not slurm_ids or not all(i in by_minor for i in slurm_ids):
        return None
    return tuple(sorted(by_minor[i] for i in slurm_ids))


def dcgm_running(state: NodeState) -> bool:
    dcgm = state.get("dcgm") or {}
    return bool(dcgm.get("hostengine") or dcgm.get("exporter") or dcgm.get("listening"))


def _dcgm_pausable(state: NodeState) -> bool:
    """``dcgmi profile --pause`` reaches a host engine: a running nv-hostengine or port 5555.
    A dcgm-exporter with its embedded engine cannot be paused from outside."""
    dcgm = state.get("dcgm") or {}
    return bool(dcgm.get("hostengine")) or any((l or {}).get("port") == 5555 for l in dcgm.get("listening") or [])


def pre_hopper(gpus: list[dict]) -> list[int]:
    """GPUs on which DCGM's profiling metrics and a profiler cannot share the counters."""
    return [g["index"] for g in gpus if (g.get("architecture") or 0) < HOPPER]


def dcgm_pause(state: NodeState, gpus: list[dict], asked: bool, counters: bool) -> bool:
    """Whether fleet pauses DCGM profiling for the run: the one condition the verdict promises,
    the planner plans and the Slurm prolog carries out."""
    return bool(counters and asked and dcgm_running(state) and _dcgm_pausable(state) and pre_hopper(gpus))


def prolog_tenants(verdict: dict | None, job: str | None, uuids: list | None = None) -> list[str]:
    """Tenants that fleet's Slurm prolog, as root, saw on job ``job``'s GPUs, or on the rank's
    own (``uuids``: its GPUs' UUIDs) where the verdict has them GPU by GPU (``by_gpu``). ``verdict``
    is None where no prolog is installed, else the prolog's document, or ``{"error": ...}`` when
    none can be read. Anything but a whole verdict of this job that saw the GPUs says nothing of
    them: then they count as shared, and so does a GPU of the rank the verdict does not name."""
    if verdict is None:
        return []
    why = verdict.get("error")
    if why is None and str(verdict.get("job")) != str(job):
        why = f"it is job {verdict.get('job')}'s, not job {job}'s"
    elif why is None and verdict.get("nvml") is not True:
        why = "root could not see the GPUs through NVML"
    elif why is None and not isinstance(verdict.get("tenants"), list):
        why = "it names no tenants list"
    if why:
        return [f"the node's prolog verdict says nothing of the GPUs ({why}): they count as shared"]
    by_gpu = verdict.get("by_gpu")
    if uuids and isinstance(by_gpu, dict) and all(isinstance(u, str) and u for u in uuids):
        out = []
        for uuid in uuids:
            seen = by_gpu.get(uuid)
            out += ([str(t) for t in seen] if isinstance(seen, list) else
                    [f"the node's prolog verdict says nothing of GPU {uuid}: it counts as shared"])
        return out
    return [str(t) for t in verdict["tenants"]]


@dataclass(frozen=True)
class DockerPrivileges:
    cap_sys_admin: bool                 # GPU counters: the one capability they need
    seccomp_profile: str | None         # CPU sampling: a profile that allows perf_event_open
    given_up: str | None = None         # why CPU sampling cannot be had in the container


def docker_privileges(tool: str, counters: bool, sampling: bool, seccomp_profile: str | None) -> DockerPrivileges:
    """The least privilege a profiled workload in ``docker run`` needs. Never --privileged;
    never SYS_ADMIN for CPU sampling (Docker's default seccomp profile refuses perf_event_open
    without it, so a profile that allows it is used, or sampling is given up)."""
    sampling = tool == "nsys" and sampling
    given_up = ("Docker refuses perf_event_open without a seccomp profile that allows it "
                "(set docker_seccomp_profile in the inventory)") if sampling and not seccomp_profile else None
    return DockerPrivileges(counters, seccomp_profile if sampling else None, given_up)


def chosen_gpus(state: NodeState, request: Request) -> list[dict]:
    gpus = state.get("gpus") or []
    if request.gpus is None:
        return gpus
    return [g for g in gpus if g.get("index") in request.gpus]


def tenants(state: NodeState, request: Request) -> list[Tenant]:
    """Everyone else on the chosen GPUs. An unresolvable pid counts as someone else."""
    out = []
    mps_servers = set((state.get("mps") or {}).get("servers") or [])
    for g in chosen_gpus(state, request):
        for p in g.get("processes") or []:
            if p.get("pid") in mps_servers or p.get("name") == "nvidia-cuda-mps-server":
                why = "is an MPS server: its clients share this GPU"
            elif p.get("foreign", True):
                why = p.get("why") or "belongs to another user"
            elif request.allow_own or (request.job is not None and p.get("slurm_job") == request.job):
                continue  # other ranks of the same job are the workload, not neighbours
            else:
                why = "is your own other process (pass --allow-own to let it stay)"
            out.append(Tenant(g["index"], p["pid"], p.get("user"), p.get("used_memory"), why))
    return out


UNSEEN_SLACK = 64 << 20  # bytes: a listed process's count may trail the device's; a CUDA context is ~500 MiB


def _unseen(state: NodeState, request: Request) -> list[tuple[int, int | None, str]]:
    """(GPU, bytes the lists do not explain or None, why) for each chosen GPU that shows
    processes the process lists hide: the one reading of the signals behind ``unseen_tenants``
    and ``newcomers``."""
    out = []
    other_ns = state.get("host_pid_namespace") is not True
    ns = "in another PID namespace" if state.get("host_pid_namespace") is False else "perhaps in another PID namespace"
    where = f" (the agent is {ns})" if other_ns else ""
    for g in chosen_gpus(state, request):
        listed = g.get("processes") or []
        if g.get("process_list_error"):
            out.append((g["index"], None, f"GPU {g['index']}: NVML does not list its processes ({g['process_list_error']})"))
            continue
        by_processes = g.get("memory_used_by_processes")
        counted = [p.get("used_memory") for p in listed]
        unexplained = by_processes - sum(counted) if by_processes is not None and None not in counted else None
        if unexplained is not None and unexplained > UNSEEN_SLACK:
            out.append((g["index"], unexplained, f"GPU {g['index']}: {unexplained / 2**30:.1f} GiB in use by processes "
                        f"not visible from here{where}"))
        elif other_ns and [p for p in g.get("sampled_pids") or [] if p not in {q.get("pid") for q in listed}]:
            # The samples name every process, ours by our namespace's pids (as the lists do), the
            # others' by theirs (measured on an H200 test machine): one not listed is not ours.
            out.append((g["index"], None, f"GPU {g['index']}: its utilization samples name processes not visible "
                        f"from here{where}"))
        elif other_ns and unexplained is None:
            out.append((g["index"], None, f"GPU {g['index']}: the agent is {ns}, where NVML lists no process of the "
                        "others, and this driver gives no memory figure to check that against"))
    return out


def unseen_tenants(state: NodeState, request: Request) -> list[str]:
    """What shows processes on the chosen GPUs that the process lists hide. The driver lists only
    the caller's PID namespace, but its memory in use (v2, reservation left out) and its
    utilization samples count every process (measured on an H200 test machine). Where the lists
    cannot be checked against those, a GPU seen from another namespace counts as shared."""
    return [why for _, _, why in _unseen(state, request)]


# Memory no listed process explains may grow by this much during a run before it counts as a
# newcomer: under ncu about 140 MiB of the workload's GPU memory is not in its process entry
# (an H200 test machine), while a CUDA context alone, of anyone, holds about 500 MiB.
NEWCOMER_UNSEEN_BYTES = 256 << 20


@dataclass(frozen=True)
class Newcomer:
    gpu: int
    pid: int | None
    user: str | None
    used_memory: int | None
    unseen: bool
    why: str

    @property
    def key(self) -> tuple:
        return (self.gpu, "unseen") if self.unseen else (self.gpu, self.pid)


def newcomers(state: NodeState, request: Request, workload: frozenset = frozenset(), contained: bool = False,
              unexplained_floor: dict | None = None, known: frozenset = frozenset()) -> list[Newcomer]:
    """Who, during a run, is on its GPUs besides the workload: the start check's rule
    (``tenants``, ``unseen_tenants``) less the workload's own processes. ``workload``: the pids
    of the profiler's process tree; ``contained``: the workload runs in a container, whose
    processes are not below the profiler on the host, so the user's own processes count as
    its. Memory no listed process explains is a newcomer once it has grown past
    ``NEWCOMER_UNSEEN_BYTES`` over the least seen this run (``unexplained_floor``: GPU ->
    bytes). ``known``: the keys of those already there when a run that programs no counters
    began (they were allowed then; a counter-using run's start check let nobody stay)."""
    out = [Newcomer(t.gpu, t.pid, t.user, t.used_memory, False, t.why)
           for t in tenants(state, replace(request, allow_own=True) if contained else request) if t.pid not in workload]
    floor = unexplained_floor or {}
    for gpu, unexplained, why in _unseen(state, request):
        if unexplained is not None and unexplained - floor.get(gpu, 0) <= NEWCOMER_UNSEEN_BYTES:
            continue
        out.append(Newcomer(gpu, None, None, unexplained, True, why))
    return [n for n in out if n.key not in known]


def unexplained_memory(state: NodeState, request: Request) -> dict:
    """GPU -> bytes in use that no listed process explains (where the driver gives both figures)."""
    out = {}
    for g in chosen_gpus(state, request):
        counted = [p.get("used_memory") for p in g.get("processes") or []]
        if g.get("memory_used_by_processes") is not None and None not in counted:
            out[g["index"]] = g["memory_used_by_processes"] - sum(counted)
    return out


def tool_found(state: NodeState, name: str) -> dict | None:
    tool = (state.get("tools") or {}).get(name)  # None also when the tools section failed ({"error": ...})
    return tool if isinstance(tool, dict) else None


def _tool_refused(state: NodeState, name: str, way: str) -> Verdict | None:
    """The tool is missing, or root would run a program another account can change."""
    tool = tool_found(state, name)
    if tool is None:
        return _with_way(_missing(name), way)
    if _privileged(state) and tool.get("writable_by_others"):
        return Verdict(way, REFUSED, (f"{name} at {tool.get('path')}: {tool['writable_by_others']}, so another "
                                      "account could change what fleet would run as root",),
                       f"make it root's and not writable by others (chown root, chmod go-w), or set {name}_path "
                       "to a copy that is")
    return None


def _missing(name: str) -> Verdict:
    var = f"{name}_path"
    where = ("PATH, /opt/nvidia/nsight-systems/*/bin, /usr/local/cuda/bin, Nsight Compute's copy" if name == "nsys"
             else "PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute/*")
    return Verdict("", REFUSED, (f"{name} not found ({where})",),
                   f"install {'Nsight Systems' if name == 'nsys' else 'Nsight Compute'} or set {var} in the inventory")


def _privileged(state: NodeState) -> bool:
    return state.get("euid") == 0


def _counter_access(state: NodeState) -> tuple[bool, str]:
    caps = state.get("capabilities") or {}
    admin_only = (state.get("nvidia") or {}).get("profiling_admin_only")
    if _privileged(state) or caps.get("sys_admin"):
        return True, "root or CAP_SYS_ADMIN"
    if admin_only == 0:
        return True, "RmProfilingAdminOnly=0"
    if admin_only is None:
        return False, "cannot read RmProfilingAdminOnly from /proc/driver/nvidia/params, so counters count as restricted"
    return False, "RmProfilingAdminOnly=1: GPU counters are for admins only (ERR_NVGPUCTRPERM)"


def _nvml_reason(state: NodeState) -> str | None:
    nvml = state.get("nvml") or {}
    if not nvml.get("available"):
        return f"no GPU visible through NVML ({nvml.get('error') or 'unavailable'})"
    if not state.get("gpus"):
        return "NVML lists no GPU on this node"
    return None


def _with_way(v: Verdict, way: str) -> Verdict:
    return Verdict(way, v.status, v.reasons, v.remedy, v.flags, v.sysctls, v.tenants)


def _report_dir_refused(state: NodeState, way: str) -> Verdict | None:
    """Reports go only where the user alone can write (another account could redirect them)."""
    rd = state.get("report_dir") or {}
    if rd.get("unsafe"):
        return Verdict(way, REFUSED, (f"report directory: {rd['unsafe']}",),
                       "remove it, or set report_dir in the inventory to a directory of your own")
    if rd.get("writable") is False:
        return Verdict(way, REFUSED, (f"report directory {rd.get('path')} is not writable",),
                       "set report_dir in the inventory to a directory you can write")
    return None


def nsys_trace(state: NodeState, request: Request) -> Verdict:
    if (refused := _tool_refused(state, "nsys", "nsys-trace")):
        return refused
    if (refused := _report_dir_refused(state, "nsys-trace")):
        return refused
    if (why := _nvml_reason(state)):
        return Verdict("nsys-trace", DEGRADED, (why, "only CPU-side activity can be traced"))
    warnings = tuple(f"warning: {u}: the trace shares the GPU with them" for u in unseen_tenants(state, request))
    return Verdict("nsys-trace", OK, ("CUDA/NVTX tracing programs no GPU counters: safe beside other tenants",)
                   + warnings)


def nsys_cpu_sampling(state: NodeState, request: Request) -> Verdict:
    if (refused := _tool_refused(state, "nsys", "nsys-cpu-sampling")):
        return refused
    level = state.get("perf_event_paranoid")
    if _privileged(state):
        return Verdict("nsys-cpu-sampling", OK, ("running as root: process-tree and system-wide sampling",))
    owned = request.owned_sysctls.get(PARANOID_SYSCTL)
    # An owned value already in place may be another fleet run's: hold it too, so that the
    # run that set it does not restore it under this one (the holders are counted).
    if owned is not None and int(owned) <= 2 and level is not None and (level > 2 or level == int(owned)):
        return Verdict("nsys-cpu-sampling", OK,
                       (f"perf_event_paranoid={level}; fleet owns {PARANOID_SYSCTL} here and holds it at {owned} "
                        "for the run, then restores it",), sysctls={PARANOID_SYSCTL: owned})
    if level is not None and level <= 2:
        scope = "process-tree and system-wide" if level <= 0 else "process-tree (system-wide needs <= 0 or root)"
        return Verdict("nsys-cpu-sampling", OK, (f"perf_event_paranoid={level}: {scope} sampling",))
    why = f"perf_event_paranoid={level}" if level is not None else "this kernel has no perf events"
    flags, _ = sampling_given_up(why)
    return Verdict("nsys-cpu-sampling", DEGRADED, (f"{why}: CPU sampling off, fleet will pass {' '.join(flags)}",),
                   f"list {PARANOID_SYSCTL} in owned_sysctls (value 2) to let fleet set it", flags=flags)


def counters(state: NodeState, request: Request, way: str, tool: str) -> Verdict:
    """ncu and nsys GPU metrics: they program the counters of the whole GPU."""
    if (refused := _tool_refused(state, tool, way)):
        return refused
    if (refused := _report_dir_refused(state, way)):
        return refused
    if (why := _nvml_reason(state)):
        return Verdict(way, REFUSED, (why,), "run on a node with an NVIDIA GPU and driver")
    reasons, remedies = [], []
    allowed, how = _counter_access(state)
    if not allowed:
        reasons.append(how)
        remedies.append("run as root, or have an admin set NVreg_RestrictProfilingToAdminUsers=0")
    found = tenants(state, request)
    if found:
        reasons += [f"tenant: {t}" for t in found]
        remedies.append("wait until the GPU is free, choose another GPU (--gpu), or trace with nsys instead")
    unseen = unseen_tenants(state, request)
    if unseen:
        reasons += [f"unseen tenant: {u}" for u in unseen]
        remedies.append("run fleet from the host's PID namespace (the host's shell, docker --pid=host), "
                        "or in a Slurm job on whole nodes")
    if (state.get("mps") or {}).get("control_daemon"):
        reasons.append("an MPS control daemon runs on this node: clients of any user may share the GPU")
        remedies.append("profile where MPS is off")
    for g in chosen_gpus(state, request):
        if (g.get("mig_mode") or {}).get("current") == 1:
            reasons.append(f"GPU {g['index']} is in MIG mode: its other instances may belong to others, "
                           "and counters and clocks are shared")
            remedies.append("profile on a GPU with MIG disabled")
    seen_by_prolog = prolog_tenants(state.get("prolog_verdict"), request.job,
                                    [g.get("uuid") for g in chosen_gpus(state, request)] if request.gpus else None)
    if seen_by_prolog:  # the node's Slurm prolog, as root, saw someone on the job's GPUs
        reasons += [f"tenant seen by the node's prolog: {t}" for t in seen_by_prolog]
        remedies.append("run where the job's GPUs are free")
    old = pre_hopper(chosen_gpus(state, request))
    pause = dcgm_pause(state, chosen_gpus(state, request), request.pause_dcgm, True)
    if pause and request.job is not None:  # in a job the prolog pauses DCGM, as root
        pause = (state.get("prolog_verdict") or {}).get("dcgm") == "paused"
    if dcgm_running(state) and old and not pause:
        if request.pause_dcgm and request.job is not None:
            reasons.append(f"DCGM runs here and GPU(s) {old} predate Hopper, and the node's prolog did not pause "
                           "DCGM profiling for this job")
            remedies.append("ask the admins to install fleet's prolog with --pause-dcgm")
        elif request.pause_dcgm:
            reasons.append(f"DCGM runs here and GPU(s) {old} predate Hopper, and no DCGM host engine answers "
                           "`dcgmi profile --pause` (dcgm-exporter's embedded engine cannot be paused from outside)")
            remedies.append("run dcgm-exporter against nv-hostengine, or stop it for the run")
        else:
            reasons.append(f"DCGM runs here and GPU(s) {old} predate Hopper: DCGM profiling metrics hold the counters")
            remedies.append("pass --pause-dcgm on a node you own (fleet pauses and always resumes DCGM profiling)")
    if reasons:
        return Verdict(way, REFUSED, tuple(reasons), "; ".join(dict.fromkeys(remedies)), tenants=tuple(found))
    notes = [f"counter access: {how}", "no other process on the GPU"]
    if pause:
        notes.append("fleet will pause DCGM profiling for the run and resume it after")
    return Verdict(way, OK, tuple(notes))


def assess(state: NodeState, request: Request = Request()) -> list[Verdict]:
    """A verdict for each way to profile, in the order of WAYS."""
    return [nsys_trace(state, request), nsys_cpu_sampling(state, request),
            counters(state, request, "nsys-gpu-metrics", "nsys"), counters(state, request, "ncu", "ncu")]


def findings(state: NodeState) -> dict[str, Finding]:
    """Problems 4 (permissions) and 5 (neighbours), one finding each, for ``fleet doctor``."""
    allowed, how = _counter_access(state)
    level = state.get("perf_event_paranoid")
    permissions = Finding(OK if allowed and (level is not None and level <= 2 or _privileged(state)) else "warn",
                          f"perf_event_paranoid={level}; GPU counters: {'yes, ' if allowed else 'no: '}{how}")
    if (why := _nvml_reason(state)):
        return {"permissions": permissions, "neighbours": Finding("n/a", why)}
    everyone = tenants(state, Request())  # own processes too: a person wants to see them
    flags = [f"MIG on GPU {g['index']}" for g in state["gpus"] if (g.get("mig_mode") or {}).get("current") == 1]
    if (state.get("mps") or {}).get("control_daemon"):
        flags.append("MPS")
    if dcgm_running(state):
        flags.append("DCGM")
    parts = [str(t) for t in everyone] + unseen_tenants(state, Request()) + flags
    return {"permissions": permissions,
            "neighbours": Finding("warn" if parts else OK, "; ".join(parts) if parts else
                                  f"no other process on {len(state['gpus'])} GPU(s)")}


def sudo_sysctls(wanted: Dict[str, Any], node_owned: "Dict[str, Any] | None", node_problem: "str | None"):
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
        return {}, (f"no sysctl is set as root through sudo: {', '.join(unlisted)} is not among the owned_sysctls "
                    "of the node's root-owned config")
    return dict(wanted), None
