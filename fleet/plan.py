"""From a node's state and a profiling request to a plan the agent carries out, or a refusal.

Pure and Python 3.8, like :mod:`fleet.policy`, whose verdicts it follows: the policy says
what is allowed and why; this module turns an allowed request into the exact
profiler command (kept in parts: :class:`Command`), environment, sysctls, locks and
checks for one node: the user's -X flags against fleet's (:mod:`fleet.userflags`), what nsys
is given (:mod:`fleet.nsyspart`), its check, watch and windows (:mod:`fleet.planparts`). The plan
is applied, never patched: what changes at run time (sampling given up, a container around it) is
a new plan made by a method here.
``--dry-run`` prints these plans and touches nothing.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

try:  # as shipped to a Slurm task by fleet (fleet/agent/task.py), modules travel under flat names
    from fleet_rundir import RunDir
    import fleet_policy as policy
    from fleet_nsyspart import NsysPart, nsys_part
    from fleet_planparts import CapturePart, RecheckPart, WatchPart, WindowPart, part_json
    from fleet_request import RECORD, LabPart, ProfileRequest, RankPart  # noqa: F401
    # the user's -X flags: fleet.userflags (its profiler_args_error is read from here too)
    from fleet_userflags import option_values, profiler_args_error, without_overridden
    import fleet_wrapping_windows as windows
except ImportError:
    from . import policy
    from .rundir import RunDir
    from .nsyspart import NsysPart, nsys_part
    from .planparts import CapturePart, RecheckPart, WatchPart, WindowPart, part_json
    # what the user asks: fleet.request
    from .request import RECORD, LabPart, ProfileRequest, RankPart  # noqa: F401
    from .userflags import option_values, profiler_args_error, without_overridden
    from .wrapping import windows

DEGRADED, OK, REFUSED, NodeState = policy.DEGRADED, policy.OK, policy.REFUSED, policy.NodeState

MAX_TIMEOUT = 10 * 366 * 86400  # seconds: past any job's limit (Slurm's INFINITE reads as a year)
MAX_RANKS = 4096  # ranks one lab host's launcher may be counted to start: past any one host's cores
# the plan's parts the node reads besides its command, each read by its own reader
PARTS = {"recheck": RecheckPart, "watch": WatchPart, "window": WindowPart, "capture": CapturePart}


@dataclass(frozen=True)
class Command:
    """What the node runs, in parts. ``argv`` renders it, once, when it is started."""
    # the profiler and its subcommand: (nsys, "profile") or (ncu,)
    profiler: tuple[str, ...] = ()
    # what fleet passes: output, clock control, sampling given up
    fleet_flags: tuple[str, ...] = ()
    user_flags: tuple[str, ...] = ()            # -X: the user's own profiler flags
    workload: tuple[str, ...] = ()
    # what the profiler runs inside: docker run ... IMAGE
    wrapper: tuple[str, ...] = ()
    # what starts one profiler per rank: mpirun and its options
    launcher: tuple[str, ...] = ()

    def argv(self) -> tuple[str, ...]:
        return (*self.wrapper, *self.launcher, *self.profiler, *self.fleet_flags, *self.user_flags,
                "--", *self.workload)

    @classmethod
    def from_json(cls, doc: dict) -> "Command":
        return cls(**{f.name: tuple(doc.get(f.name) or ()) for f in fields(cls)})


@dataclass(frozen=True)
class Plan:
    host: str
    status: str                                 # ok | refused
    reasons: tuple[str, ...] = ()
    remedy: str | None = None
    command: Command = Command()
    env: dict[str, str] = field(default_factory=dict)
    # report name without extension (placeholders allowed)
    output: str = ""
    report_dir: str = ""
    sysctls: dict[str, Any] = field(default_factory=dict)   # owned sysctls to set for the run
    owned_sysctls: dict[str, Any] = field(default_factory=dict)
    gpu_locks: tuple[str, ...] = ()             # GPU UUIDs whose counters the run takes
    # last-moment tenant check before the profiler; None: none (the plan's parts: fleet.planparts)
    recheck: RecheckPart | None = None
    pause_dcgm: bool = False
    given_up: tuple[str, ...] = ()
    tenants: tuple[policy.Tenant, ...] = ()
    timeout: float | None = None
    lock_wait: float = 0.0
    tool: str = ""
    nsys: str | None = None                     # for finishing a leftover .qdstrm
    ncu: str | None = None                      # for reading an ncu report's metrics on the node
    # the run watch: GPUs, allow_own, job, counters
    watch: WatchPart | None = None
    # a launcher's ranks 0..N-1, each to leave a report; None: not known
    ranks: int | None = None
    placement: str | None = None                # --gpu free: which GPU was chosen here, and why
    # nsys's named session (--session-new): a yield stops it
    session: str | None = None
    # start, duration, detach, output: nsys leaves the workload on
    window: WindowPart | None = None
    # range, nvtx, repeat: the windows the workload opens
    capture: CapturePart | None = None

    def to_json(self) -> dict:
        doc = asdict(self)
        for name in PARTS:  # each as the plan always wrote it, {} for none
            doc[name] = part_json(getattr(self, name))
        # for people and logs only
        doc["argv"] = list(self.command.argv()) if self.status == OK else []
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> "Plan":
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in doc.items() if k in known}
        kw["command"] = Command.from_json(doc.get("command") or {})
        for name, part in PARTS.items():
            kw[name] = part.from_json(doc.get(name))
        for key in ("reasons", "gpu_locks", "given_up"):
            kw[key] = tuple(kw.get(key) or ())
        kw["tenants"] = tuple(t if isinstance(t, policy.Tenant) else policy.Tenant(**t)
                              if isinstance(t, dict)
                              else policy.Tenant(-1, -1, None, None, str(t))
                              for t in kw.get("tenants") or ())
        return cls(**kw)

    def stopped_by_nsys(self) -> bool:
        """Whether nsys stops the workload at the timeout itself (fleet's --duration; a window's
        --duration ends the collection alone)."""
        by_duration = any(f.startswith("--duration=") for f in self.command.fleet_flags)
        return self.tool == "nsys" and not self.window and by_duration

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.command.argv())

    def without_sampling(self, why: str) -> "Plan":
        """CPU sampling given up (an owned sysctl that could not be set, a container that
        cannot allow it): nsys traces without it rather than not at all."""
        flags, line = policy.sampling_given_up(why)
        if self.tool != "nsys":
            return self
        extra = tuple(f for f in without_overridden("nsys", list(flags), self.command.user_flags)
                      if f not in self.command.fleet_flags)
        return replace(self, command=replace(self.command, fleet_flags=self.command.fleet_flags
                                             + extra),
                       sysctls={}, given_up=self.given_up + (line,))


def _refuse(host: str, v: policy.Verdict) -> Plan:
    return Plan(host, REFUSED, v.reasons, v.remedy, tenants=v.tenants)


def plan(host: str, state: policy.NodeState, req: ProfileRequest,
         owned_sysctls: dict[str, Any] | None = None) -> Plan:
    owned = dict(owned_sysctls or {})
    request = policy.Request(gpus=req.gpus, allow_own=req.allow_own, owned_sysctls=owned,
                             pause_dcgm=req.pause_dcgm, job=req.job)
    verdicts = {v.way: v for v in policy.assess(state, request)}
    counters = verdicts["ncu" if req.tool == "ncu" else "nsys-gpu-metrics"]
    base = verdicts["nsys-trace"] if req.tool == "nsys" else counters
    refused = _asked_amiss(host, state, req) or _refused_by_policy(host, req, base, counters)
    if refused is not None:
        return refused

    rd = (state.report_dir and state.report_dir.path) or "/var/tmp/fleet"
    # Named by the inventory's host name, which is unique even where nodes share a report
    # directory (NFS) and their hostnames collide (containers); with a launcher, by rank too.
    starts, workload, output = _launched(host, req, f"{rd}/{req.run_id}")
    window, capture, workload = _windows(host, req, f"{rd}/{req.run_id}", workload)
    chosen = policy.chosen_gpus(state, request)
    tools = state.tools
    if req.tool == "nsys":
        nsys = nsys_part(host, req, verdicts, chosen, output)
        command = Command((tools.nsys.path, "profile"), nsys.flags, req.profiler_args, workload,
                          launcher=starts)
    else:
        flags = without_overridden("ncu", ["--clock-control", req.clock_control, "--export",
                                           output],
                                   req.profiler_args)
        command = Command((tools.ncu.path,), tuple(flags), req.profiler_args, workload,
                          launcher=starts)
        nsys = NsysPart((), [], {}, None)  # ncu gives up nothing, sets no sysctl and has no session
    notes = counters.reasons if req.uses_counters else base.reasons
    return Plan(host, OK, tuple(notes), None, command, output=output,
                report_dir=f"{rd}/{req.run_id}",
                sysctls=nsys.sysctls, owned_sysctls=owned, given_up=tuple(nsys.given_up),
                timeout=req.timeout, lock_wait=req.lock_wait, tool=req.tool, ranks=req.ranks,
                nsys=tools.nsys and tools.nsys.path, ncu=tools.ncu and tools.ncu.path,
                session=nsys.session, window=window, capture=capture,
                **_guarded(state, req, request, chosen))


def _guarded(state: policy.NodeState, req: ProfileRequest, request: policy.Request,
             chosen: tuple[policy.Gpu, ...]) -> dict:
    """What guards the run, as the policy's guards for it say (the Plan's fields): the workload
    pinned to its GPUs, their counter locks, the last-moment check, DCGM paused, the run watch."""
    guard = policy.guards(request, req.uses_counters)
    pinned = {"CUDA_VISIBLE_DEVICES": ",".join(_uuid(g) for g in chosen)} if guard.pin_gpus else {}
    return {"env": {**pinned, **windows.app_env(req)},
            "gpu_locks": tuple(_uuid(g) for g in chosen) if guard.gpu_locks else (),
            "recheck": RecheckPart(tuple(g.index for g in chosen), req.allow_own)
            if guard.recheck else None,
            "pause_dcgm": guard.node_state and policy.dcgm_pause(state, chosen, req.pause_dcgm,
                                                                 req.uses_counters),
            "watch": WatchPart(tuple(g.index for g in chosen) if req.gpus is not None else None,
                               req.allow_own, req.job, req.uses_counters)}


def _uuid(g: policy.Gpu) -> str:
    """A GPU's UUID, by which a run pins and locks it: a GPU the node names none for cannot be."""
    if g.uuid is None:
        raise ValueError(f"GPU {g.index} has no UUID in the node's state")
    return g.uuid


def _asked_amiss(host: str, state: policy.NodeState, req: ProfileRequest) -> Plan | None:
    """The refusal of what no node can run as asked: a GPU it lacks, profiler options the profiler
    would refuse, a window or a timeout out of bounds; None where the request holds."""
    missing = [i for i in (req.gpus or ()) if i not in [g.index for g in state.gpus]]
    if missing:
        return Plan(host, REFUSED, (f"no GPU {missing} on this node",),
                    "choose a GPU that `fleet probe` lists")
    if (why := profiler_args_error(req.tool, req.profiler_args) or window_problem(req)):
        return Plan(host, REFUSED, (why,), "leave the option out")
    if req.timeout is not None and not 0 < req.timeout <= MAX_TIMEOUT:  # NaN too
        return Plan(host, REFUSED, (f"--timeout {req.timeout!r}: must be more than 0 and at most "
                                    f"{MAX_TIMEOUT} seconds",),
                    "give the seconds the workload may run")
    return None


def _refused_by_policy(host: str, req: ProfileRequest, base: policy.Verdict,
                       counters: policy.Verdict) -> Plan | None:
    """The policy's refusal of the run here (the trace, or the counters it would program), or
    None."""
    if base.status == REFUSED:
        return _refuse(host, base)
    if req.uses_counters and counters.status != OK:
        return _refuse(host, counters)
    return None




# --detach: the workload's output goes to a file of the run's from its start ($0: the file, made
# anew: set -C refuses one that is there, a link too), so that it writes nowhere fleet's agent reads
# once the agent left.
DETACH_SH = 'set -C; exec >"$0" 2>&1; exec "$@"'


def window_problem(req: ProfileRequest) -> str | None:
    """Why the request's window (--window, --nvtx-window, --cuda-profiler-window, with --detach or
    --repeat) cannot be planned as asked, or None (fleet.wrapping.windows)."""
    return windows.problem(req, lambda option: option_values("nsys", req.profiler_args, (option,)))


def _windows(host: str, req: ProfileRequest, run_dir: str, workload: tuple[str, ...]):
    """(the plan's time window, its windows the workload opens, the workload): with --detach, the
    workload's output goes to the run's file from its start."""
    window = _window(host, req, run_dir)
    capture = windows.capture(req, RunDir(run_dir).workload_out(host))
    out_file = (window.output if window else "") or (capture.output if capture else "")
    return window, capture, detached(workload, out_file) if out_file else workload


def _window(host: str, req: ProfileRequest, run_dir: str) -> WindowPart | None:
    if not req.window:
        return None
    # a Slurm rank's: when every rank's window starts
    at = req.rank.window_at if req.rank is not None else None
    return WindowPart(req.window[0], req.window[1], req.detach,
                      RunDir(run_dir).workload_out(host) if req.detach else "", at)


def detached(workload: tuple[str, ...], output: str) -> tuple[str, ...]:
    """The workload with its output in ``output``, from its start (DETACH_SH)."""
    return ("sh", "-c", DETACH_SH, output, *workload)




def _launched(host: str, req: ProfileRequest, run_dir: str) -> tuple[tuple[str, ...],
                                                                     tuple[str, ...], str]:
    """(what starts the profilers, the program, the output name). With --launcher on a lab server, a
    profiler per rank: ``mpirun OPTS nsys profile -o HOST/rank%q{OMPI_COMM_WORLD_RANK} -- PROGRAM``
    (the words made on the controller, fleet.wrapping.launchers.lab_launch), one agent holding the
    host's checks for all of them (why: :mod:`fleet.wrapping.launchers`)."""
    if req.launcher is None:
        return (), req.command, f"{run_dir}/{req.output_name or host + '-%p'}"
    return (req.starts, req.program,
            RunDir(run_dir).node(host).file(RunDir.rank_report(req.launcher)))
