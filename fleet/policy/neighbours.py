"""Problem 5, neighbours: who else is on a run's GPUs, and how a run keeps them to itself.

Tenants in the process lists, processes the lists hide (another PID namespace), MPS, MIG, DCGM's
profiling metrics, what the Slurm prolog saw as root, newcomers during a run, and the guards of
a planned run. When unsure whether a GPU is shared, it counts as shared. Pure and Python 3.8:
it travels to the nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

try:  # as shipped, the policy's parts travel under flat names (fleet/agent/bundle.py)
    from fleet_policy_gpustate import Gpu
    from fleet_policy_nodestate import NodeState, PrologVerdict
    from fleet_policy_vocabulary import HOPPER, OK, Finding, Request, Tenant
except ImportError:
    from .gpustate import Gpu
    from .nodestate import NodeState, PrologVerdict
    from .vocabulary import HOPPER, OK, Finding, Request, Tenant

__all__ = ["exclusive_node", "Guards", "guards", "job_gpu_indices", "dcgm_running", "pre_hopper",
           "dcgm_pause",
           "prolog_tenants", "chosen_gpus", "tenants", "UNSEEN_SLACK", "unseen_tenants",
           "NEWCOMER_UNSEEN_BYTES",
           "Newcomer", "newcomers", "unexplained_memory", "free_gpus", "not_free", "busyness"]


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


def job_gpu_indices(slurm_ids: tuple[int, ...] | None,
                    gpus: tuple[Gpu, ...]) -> tuple[int, ...] | None:
    """NVML's indices of the GPUs Slurm gave a job (None: every GPU visible). Slurm names them by
    its own ids (gres.conf's /dev/nvidiaN), not by NVML's numbering, which in a job with
    constrained devices counts only the allocated GPUs from 0: matched by the device's minor
    number. Where an id finds no device, every visible GPU counts as the job's: more GPUs
    checked for neighbours, never another one than the job's."""
    by_minor = {g.minor: g.index for g in gpus if g.minor is not None}
    if not slurm_ids or not all(i in by_minor for i in slurm_ids):
        return None
    return tuple(sorted(by_minor[i] for i in slurm_ids))


def dcgm_running(state: NodeState) -> bool:
    return bool(state.dcgm.hostengine or state.dcgm.exporter or state.dcgm.listening)


def _dcgm_pausable(state: NodeState) -> bool:
    """``dcgmi profile --pause`` reaches a host engine: a running nv-hostengine or port 5555.
    A dcgm-exporter with its embedded engine cannot be paused from outside."""
    return bool(state.dcgm.hostengine) or any(listener.port == 5555
                                              for listener in state.dcgm.listening)


def pre_hopper(gpus: tuple[Gpu, ...]) -> list[int]:
    """GPUs on which DCGM's profiling metrics and a profiler cannot share the counters."""
    return [g.index for g in gpus if (g.architecture or 0) < HOPPER]


def dcgm_pause(state: NodeState, gpus: tuple[Gpu, ...], asked: bool, counters: bool) -> bool:
    """Whether fleet pauses DCGM profiling for the run: the one condition the verdict promises,
    the planner plans and the Slurm prolog carries out."""
    return bool(counters and asked and dcgm_running(state) and _dcgm_pausable(state)
                and pre_hopper(gpus))


def prolog_tenants(verdict: PrologVerdict | None, job: str | None,
                   uuids: list | None = None) -> list[str]:
    """Tenants that fleet's Slurm prolog, as root, saw on job ``job``'s GPUs, or on the rank's
    own (``uuids``: its GPUs' UUIDs) where the verdict has them GPU by GPU (``by_gpu``). ``verdict``
    is None where no prolog is installed, else the prolog's verdict, or one of ``error`` alone when
    none can be read. Anything but a whole verdict of this job that saw the GPUs says nothing of
    them: then they count as shared, and so does a GPU of the rank the verdict does not name."""
    if verdict is None:
        return []
    why = _prolog_silent(verdict, job)
    if why:
        return [f"the node's prolog verdict says nothing of the GPUs ({why}): they count as shared"]
    if uuids and verdict.by_gpu is not None and all(isinstance(u, str) and u for u in uuids):
        return [t for uuid in uuids for t in _gpu_tenants(verdict.by_gpu, uuid)]
    return list(verdict.tenants or ())


def _prolog_silent(verdict: PrologVerdict, job: str | None) -> str | None:
    """Why the prolog's verdict says nothing of this job's GPUs (its error, another job's, NVML
    unseen, no tenants list), or None where it is whole."""
    why = verdict.error
    if why is None and str(verdict.job) != str(job):
        why = f"it is job {verdict.job}'s, not job {job}'s"
    elif why is None and verdict.nvml is not True:
        why = "root could not see the GPUs through NVML"
    elif why is None and verdict.tenants is None:
        why = "it names no tenants list"
    return why


def _gpu_tenants(by_gpu: dict, uuid: str) -> list[str]:
    """The tenants the prolog saw on one GPU; a GPU it does not name counts as shared."""
    seen = by_gpu[uuid] if uuid in by_gpu else None
    if seen is not None:
        return list(seen)
    return [f"the node's prolog verdict says nothing of GPU {uuid}: it counts as shared"]


def chosen_gpus(state: NodeState, request: Request) -> tuple[Gpu, ...]:
    return state.chosen(request.gpus)


def tenants(state: NodeState, request: Request) -> list[Tenant]:
    """Everyone else on the chosen GPUs. An unresolvable pid counts as someone else."""
    out = []
    mps_servers = set(state.mps.servers)
    for g in chosen_gpus(state, request):
        for p in g.processes:
            if p.pid in mps_servers or p.name == "nvidia-cuda-mps-server":
                why = "is an MPS server: its clients share this GPU"
            elif p.foreign:
                why = p.why or "belongs to another user"
            elif request.allow_own or (request.job is not None and p.slurm_job == request.job):
                continue  # other ranks of the same job are the workload, not neighbours
            else:
                why = "is your own other process (pass --allow-own to let it stay)"
            out.append(Tenant(g.index, p.pid, p.user, p.used_memory, why))
    return out


# bytes: a listed process's count may trail the device's; a CUDA context is ~500 MiB
UNSEEN_SLACK = 64 << 20


def _unseen(state: NodeState, request: Request) -> list[tuple[int, int | None, str]]:
    """(GPU, bytes the lists do not explain or None, why) for each chosen GPU that shows
    processes the process lists hide: the one reading of the signals behind ``unseen_tenants``
    and ``newcomers``."""
    other_ns = state.host_pid_namespace is not True
    ns = ("in another PID namespace" if state.host_pid_namespace is False
          else "perhaps in another PID namespace")
    where = f" (the agent is {ns})" if other_ns else ""
    out = []
    for g in chosen_gpus(state, request):
        if g.process_list_error:
            out.append((g.index, None,
                        f"GPU {g.index}: NVML does not list its "
                        f"processes ({g.process_list_error})"))
            continue
        found = _unseen_on(g, other_ns, ns, where)
        out += [found] if found else []
    return out


def _unseen_on(g: Gpu, other_ns: bool, ns: str, where: str) -> tuple[int, int | None, str] | None:
    """What shows processes on one GPU that its list hides: memory the listed processes do not
    account for, utilization samples of processes not listed, or, from another PID namespace, no
    memory figure to check the list against; None where nothing does."""
    listed = g.processes
    by_processes = g.memory_used_by_processes
    counted = [p.used_memory for p in listed]
    unexplained = (by_processes - sum(counted) if by_processes is not None and None not in counted
                   else None)
    if unexplained is not None and unexplained > UNSEEN_SLACK:
        return (g.index, unexplained,
                f"GPU {g.index}: {unexplained / 2**30:.1f} GiB in use by processes "
                f"not visible from here{where}")
    if other_ns and [p for p in g.sampled_pids or () if p not in {q.pid for q in listed}]:
        # The samples name every process, ours by our namespace's pids (as the lists do), the
        # others' by theirs (measured on an H200 test machine): one not listed is not ours.
        return (g.index, None, f"GPU {g.index}: its utilization samples name processes not visible "
                f"from here{where}")
    if other_ns and unexplained is None:
        return (g.index, None,
                f"GPU {g.index}: the agent is {ns}, where NVML lists no process of the "
                "others, and this driver gives no memory figure to check that against")
    return None


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


def newcomers(state: NodeState, request: Request, workload: frozenset = frozenset(),
              contained: bool = False,
              unexplained_floor: dict | None = None,
              known: frozenset = frozenset()) -> list[Newcomer]:
    """Who, during a run, is on its GPUs besides the workload: the start check's rule
    (``tenants``, ``unseen_tenants``) less the workload's own processes. ``workload``: the pids
    of the profiler's process tree; ``contained``: the workload runs in a container, whose
    processes are not below the profiler on the host, so the user's own processes count as
    its. Memory no listed process explains is a newcomer once it has grown past
    ``NEWCOMER_UNSEEN_BYTES`` over the least seen this run (``unexplained_floor``: GPU ->
    bytes). ``known``: the keys of those already there when a run that programs no counters
    began (they were allowed then; a counter-using run's start check let nobody stay)."""
    out = [Newcomer(t.gpu, t.pid, t.user, t.used_memory, False, t.why)
           for t in tenants(state, replace(request, allow_own=True) if contained else request)
           if t.pid not in workload]
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
        counted = [p.used_memory for p in g.processes]
        if g.memory_used_by_processes is not None and None not in counted:
            out[g.index] = g.memory_used_by_processes - sum(counted)
    return out


def sharing(state: NodeState, request: Request) -> list[tuple[str, str]]:
    """(reason, remedy) for each way the chosen GPUs may be shared with someone, short of DCGM:
    what refuses a run that programs the counters. Tenants first, one reason each."""
    found = [(f"tenant: {t}",
              "wait until the GPU is free, choose another GPU (--gpu), or trace with nsys instead")
             for t in tenants(state, request)]
    found += [(f"unseen tenant: {u}",
               "run fleet from the host's PID namespace (the host's shell, docker --pid=host), "
               "or in a Slurm job on whole nodes") for u in unseen_tenants(state, request)]
    if state.mps.control_daemon:
        found.append(("an MPS control daemon runs on this node: clients "
                      "of any user may share the GPU",
                      "profile where MPS is off"))
    for g in chosen_gpus(state, request):
        if g.mig:
            found.append((f"GPU {g.index} is in MIG mode: its other instances may belong to "
                          "others, and counters and clocks are shared",
                          "profile on a GPU with MIG disabled"))
    seen_by_prolog = prolog_tenants(state.prolog_verdict, request.job,
                                    [g.uuid for g in chosen_gpus(state, request)] if request.gpus
                                    else None)
    # the node's Slurm prolog, as root, saw someone on the job's GPUs
    found += [(f"tenant seen by the node's prolog: {t}", "run where the job's GPUs are free")
              for t in seen_by_prolog]
    return found


def busyness(g: Gpu) -> tuple:
    """How busy a free GPU is, least first: memory in use by processes, then utilization."""
    return (g.memory_used_by_processes or g.memory_used or 0, (g.utilization and g.utilization.gpu)
            or 0, g.index)


def free_gpus(state: NodeState, request: Request) -> list[Gpu]:
    """The node's GPUs (among the request's, if it names some) that nobody else may be using now,
    by the rule that refuses ncu there (``sharing``): no tenant, nothing unseen, no MPS, no MIG,
    nothing the prolog saw. Least busy first. What ``--gpu free`` chooses from."""
    free = [g for g in chosen_gpus(state, request)
            if not sharing(state, replace(request, gpus=(g.index,)))]
    return sorted(free, key=busyness)


def not_free(state: NodeState, request: Request) -> list[str]:
    """Why each of the node's GPUs is not free: its first sharing reason, one line a GPU."""
    out = []
    for g in chosen_gpus(state, request):
        found = sharing(state, replace(request, gpus=(g.index,)))
        if found:
            out.append(f"GPU {g.index}: {found[0][0]}")
    return out


def dcgm_for_counters(state: NodeState, request: Request) -> tuple[bool, tuple[str, str] | None]:
    """Whether fleet pauses DCGM profiling for a counter-using run, and else the (reason, remedy)
    that refuses it where DCGM holds the counters of a GPU older than Hopper."""
    old = pre_hopper(chosen_gpus(state, request))
    pause = dcgm_pause(state, chosen_gpus(state, request), request.pause_dcgm, True)
    if pause and request.job is not None:  # in a job the prolog pauses DCGM, as root
        pause = state.prolog_verdict is not None and state.prolog_verdict.dcgm == "paused"
    if not (dcgm_running(state) and old and not pause):
        return pause, None
    if request.pause_dcgm and request.job is not None:
        return pause, (f"DCGM runs here and GPU(s) {old} predate Hopper, and the node's prolog did "
                       "not pause DCGM profiling for this job",
                       "ask the admins to install fleet's prolog with --pause-dcgm")
    if request.pause_dcgm:
        return pause, (f"DCGM runs here and GPU(s) {old} predate Hopper, and no DCGM host engine "
                       "answers `dcgmi profile --pause` (dcgm-exporter's embedded engine "
                       "cannot be paused from outside)",
                       "run dcgm-exporter against nv-hostengine, or stop it for the run")
    return pause, (f"DCGM runs here and GPU(s) {old} predate Hopper: DCGM "
                   "profiling metrics hold the counters",
                   "pass --pause-dcgm on a node you own (fleet pauses and "
                   "always resumes DCGM profiling)")


def neighbours_finding(state: NodeState) -> Finding:
    """``fleet doctor``'s line for problem 5: everyone on the node's GPUs, the user's own
    processes too (a person wants to see them), and MIG, MPS and DCGM."""
    everyone = tenants(state, Request())
    flags = [f"MIG on GPU {g.index}" for g in state.gpus if g.mig]
    if state.mps.control_daemon:
        flags.append("MPS")
    if dcgm_running(state):
        flags.append("DCGM")
    parts = [str(t) for t in everyone] + unseen_tenants(state, Request()) + flags
    return Finding("warn" if parts else OK, "; ".join(parts) if parts else
                   f"no other process on {len(state.gpus)} GPU(s)")
