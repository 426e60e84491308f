"""From a node's state and a profiling request to a plan the agent carries out, or a refusal.

Pure and Python 3.8, like :mod:`fleet.policy`, whose verdicts it follows: the policy says
what is allowed and why; this module turns an allowed request into the exact
profiler command (kept in parts: :class:`Command`), environment, sysctls, locks and
checks for one node. The plan is applied, never patched: what changes at run time
(sampling given up, a container around it) is a new plan made by a method here.
``--dry-run`` prints these plans and touches nothing.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

try:  # as shipped to a Slurm task by fleet (fleet/agent/task.py), modules travel under flat names
    from fleet_rundir import RunDir
    import fleet_policy as policy
    from fleet_wrapping_nsysopts import (NSYS_REPEATABLE, NSYS_SHORT,  # noqa: F401
                                         NSYS_SWITCHES, nsys_options)
    from fleet_request import RECORD, LabPart, ProfileRequest, RankPart  # noqa: F401
    import fleet_wrapping_windows as windows
except ImportError:
    from . import policy
    from .rundir import RunDir
    from .wrapping.nsysopts import (NSYS_REPEATABLE, NSYS_SHORT,  # noqa: F401
                                    NSYS_SWITCHES, nsys_options)
    # what the user asks: fleet.request
    from .request import RECORD, LabPart, ProfileRequest, RankPart  # noqa: F401
    from .wrapping import windows

DEGRADED, OK, REFUSED, NodeState = policy.DEGRADED, policy.OK, policy.REFUSED, policy.NodeState

# The user's -X flags meet fleet's own. Output names are fleet's: it finds, hashes and brings
# home the report by them. Elsewhere the user's explicit choice wins and fleet drops its own
# flag (nsys refuses an option given twice). Spellings as nsys and ncu 2025.3 take them.
OUTPUT_OPTIONS = {"nsys": ("-o", "--output"), "ncu": ("-o", "--export")}
USER_WINS = {"nsys": ("--sample", "--cpuctxsw", "--duration", "--session-new"),
             "ncu": ("--clock-control",)}
# nsys options under which its --duration no longer counts from the workload's start: fleet's
# --timeout is then the agent's signal at the time, not --duration.
DURATION_MOVED_BY = ("--delay", "--capture-range", "--kill")
MAX_TIMEOUT = 10 * 366 * 86400  # seconds: past any job's limit (Slurm's INFINITE reads as a year)
MAX_RANKS = 4096  # ranks one lab host's launcher may be counted to start: past any one host's cores

def _names(word: str, name: str) -> bool:
    """Whether ``word`` gives ncu's option ``name``: ncu also takes a long option's unique prefix
    (``--exp`` for ``--export``, seen with 2025.3), and a short one's value attached."""
    given = word.split("=", 1)[0]
    if name.startswith("--"):
        return given == name or (given.startswith("--") and len(given) > 2
                                 and name.startswith(given))
    return word == name or (word.startswith(name) and len(word) > len(name))


def _option_values(tool: str, words: tuple[str, ...],
                   spellings: tuple[str, ...]) -> list[str | None]:
    """The values the words give any of these options (None for one given without a value)."""
    if tool == "nsys":
        wanted = {NSYS_SHORT.get(s, s) for s in spellings}
        return [value for name, value, _ in nsys_options(words)[0] if name in wanted]
    found = []
    for i, w in enumerate(words):
        name = next((n for n in spellings if _names(w, n)), None)
        if name is None:
            continue
        if "=" in w and name.startswith("--"):
            found.append(w.split("=", 1)[1])
        elif not name.startswith("--") and len(w) > len(name):
            found.append(w[len(name):])
        else:
            found.append(words[i + 1] if i + 1 < len(words) else None)
    return found


def profiler_args_error(tool: str, args: tuple[str, ...]) -> str | None:
    """Why the user's profiler flags cannot be run as given, or None: nsys would refuse them, or
    they take what is fleet's."""
    if tool == "nsys" and (why := nsys_options(args)[1]):
        return why
    if _option_values(tool, args, OUTPUT_OPTIONS.get(tool, ())):
        return (f"-X {' / '.join(OUTPUT_OPTIONS[tool])} is fleet's: it names each report so it can "
                "find, hash and bring it home (reports land in the store, --store; `fleet reports "
                "pull RUN DIR` copies them out)")
    if _option_values(tool, args, policy.COUNTER_OPTIONS.get(tool, ())):
        return ("-X --gpu-metrics-devices would program the counters of GPUs fleet has not checked "
                "for tenants: pass --gpu-metrics, and fleet samples the GPUs the run "
                "was given once they are free")
    return None


def _without_overridden(tool: str, flags: list[str], user: tuple[str, ...]) -> list[str]:
    """Fleet's flags less those the user chose a value for (a flag and its value go together)."""
    chosen = {name for name in USER_WINS.get(tool, ()) if _option_values(tool, user, (name,))}
    kept, skip = [], False
    for i, f in enumerate(flags):
        if skip:
            skip = False
            continue
        name = f.split("=", 1)[0]
        if name in chosen:
            skip = "=" not in f and i + 1 < len(flags) and not flags[i + 1].startswith("-")
            continue
        kept.append(f)
    return kept


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
    # last-moment tenant check before the profiler
    recheck: dict[str, Any] = field(default_factory=dict)
    pause_dcgm: bool = False
    given_up: tuple[str, ...] = ()
    tenants: tuple[policy.Tenant, ...] = ()
    timeout: float | None = None
    lock_wait: float = 0.0
    tool: str = ""
    nsys: str | None = None                     # for finishing a leftover .qdstrm
    ncu: str | None = None                      # for reading an ncu report's metrics on the node
    # the run watch: GPUs, allow_own, job, counters
    watch: dict[str, Any] = field(default_factory=dict)
    # a launcher's ranks 0..N-1, each to leave a report; None: not known
    ranks: int | None = None
    placement: str | None = None                # --gpu free: which GPU was chosen here, and why
    # nsys's named session (--session-new): a yield stops it
    session: str | None = None
    # start, duration, detach, output: nsys leaves the workload on
    window: dict[str, Any] = field(default_factory=dict)
    # range, nvtx, repeat: the windows the workload opens
    capture: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        doc = asdict(self)
        # for people and logs only
        doc["argv"] = list(self.command.argv()) if self.status == OK else []
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> "Plan":
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in doc.items() if k in known}
        kw["command"] = Command.from_json(doc.get("command") or {})
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
        extra = tuple(f for f in _without_overridden("nsys", list(flags), self.command.user_flags)
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
        nsys = _nsys(host, req, verdicts, chosen, output)
        command = Command((tools.nsys.path, "profile"), nsys.flags, req.profiler_args, workload,
                          launcher=starts)
    else:
        flags = _without_overridden("ncu", ["--clock-control", req.clock_control, "--export",
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
            "recheck": {"gpus": [g.index for g in chosen], "allow_own": req.allow_own}
            if guard.recheck else {},
            "pause_dcgm": guard.node_state and policy.dcgm_pause(state, chosen, req.pause_dcgm,
                                                                 req.uses_counters),
            "watch": {"gpus": [g.index for g in chosen] if req.gpus is not None else None,
                      "allow_own": req.allow_own, "job": req.job, "counters": req.uses_counters}}


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


@dataclass(frozen=True)
class NsysPart:
    """What fleet gives nsys for a run: its flags, what was given up, the owned sysctls to set, and
    the name of the run's nsys session (None: none)."""
    flags: tuple[str, ...]
    given_up: list[str]
    sysctls: dict[str, Any]
    session: str | None


def _nsys(host: str, req: ProfileRequest, verdicts: dict, chosen: tuple[policy.Gpu, ...],
          output: str) -> NsysPart:
    sampling = verdicts["nsys-cpu-sampling"]
    flags = [f"--output={output}", *sampling.flags]
    # One nsys on the node itself, which `nsys stop` there reaches: not under a launcher (each
    # rank's nsys would need a session of its own) nor in a container. Those yield with SIGTERM, as
    # before. The session is every such run's: a yield stops it, and so does Ctrl-C's "leave the
    # workload running".
    reachable = req.launcher is None and req.docker_image is None
    if req.gpu_metrics:
        flags.append("--gpu-metrics-devices=" + ",".join(str(g.index) for g in chosen))
    if reachable:
        flags.append("--session-new=" + session_name(req.run_id, host))
    flags = _without_overridden("nsys", flags + _nsys_end(req), req.profiler_args)
    return NsysPart(tuple(flags), _given_up(verdicts), dict(sampling.sysctls),
                    _session(req, flags, reachable))


def _given_up(verdicts: dict) -> list[str]:
    """What the nsys run gives up, by the policy's verdicts: CPU sampling, GPU activity."""
    base, sampling = verdicts["nsys-trace"], verdicts["nsys-cpu-sampling"]
    given_up = ([policy.sampling_given_up(sampling.reasons[0].split(":")[0])[1]]
                if sampling.status == DEGRADED else [])
    return given_up + (["GPU activity: " + base.reasons[0]] if base.status == DEGRADED else [])


def _nsys_end(req: ProfileRequest) -> list[str]:
    """How nsys's collection ends: a window's (fleet.wrapping.windows: the report written, the
    workload going on), or the timeout's own --duration, which keeps the kernels where SIGTERM or
    SIGINT to nsys or to the workload lost every one of them on an H200
    (tests/fixtures/tools-2025.3-h200). A Slurm rank's time bound with a window the workload opens
    is the agent's signal, not --duration."""
    if (flags := windows.nsys_flags(req)):
        return flags
    if req.timeout and not _option_values("nsys", req.profiler_args, DURATION_MOVED_BY):
        return [f"--duration={-int(-req.timeout // 1)}"]
    return []


def _session(req: ProfileRequest, flags: list[str], reachable: bool) -> str | None:
    """The run's nsys session a yield stops: fleet's, or the one the user named with -X."""
    ours = [f.split("=", 1)[1] for f in flags if f.startswith("--session-new=")]
    theirs = [v for v in _option_values("nsys", req.profiler_args, ("--session-new",)) if v
              and reachable]
    return (ours or theirs or [None])[0]


# --detach: the workload's output goes to a file of the run's from its start ($0: the file, made
# anew: set -C refuses one that is there, a link too), so that it writes nowhere fleet's agent reads
# once the agent left.
DETACH_SH = 'set -C; exec >"$0" 2>&1; exec "$@"'


def window_problem(req: ProfileRequest) -> str | None:
    """Why the request's window (--window, --nvtx-window, --cuda-profiler-window, with --detach or
    --repeat) cannot be planned as asked, or None (fleet.wrapping.windows)."""
    return windows.problem(req, lambda option: _option_values("nsys", req.profiler_args, (option,)))


def _windows(host: str, req: ProfileRequest, run_dir: str, workload: tuple[str, ...]):
    """(the plan's time window, its windows the workload opens, the workload): with --detach, the
    workload's output goes to the run's file from its start."""
    window = _window(host, req, run_dir)
    capture = windows.capture(req, RunDir(run_dir).workload_out(host))
    out_file = window.get("output") or capture.get("output")
    return window, capture, detached(workload, out_file) if out_file else workload


def _window(host: str, req: ProfileRequest, run_dir: str) -> dict[str, Any]:
    if not req.window:
        return {}
    spec = {"start": req.window[0], "duration": req.window[1], "detach": req.detach,
            "output": RunDir(run_dir).workload_out(host) if req.detach else ""}
    # a Slurm rank's: when every rank's window starts
    if req.rank is not None and req.rank.window_at is not None:
        spec["at"] = req.rank.window_at
    return spec


def detached(workload: tuple[str, ...], output: str) -> tuple[str, ...]:
    """The workload with its output in ``output``, from its start (DETACH_SH)."""
    return ("sh", "-c", DETACH_SH, output, *workload)


def session_name(run_id: str, host: str) -> str:
    """The run's nsys session on a host (``fleet-RUN-HOST``): a newcomer on a GPU whose metrics nsys
    samples is yielded to by ``nsys stop`` of it, which keeps the report's kernels and leaves the
    workload running (tests/fixtures/nsys-sessions-h100), where SIGTERM ended the workload and lost
    them. Unique on the node while the run is, and of letters, digits, '.', '_' and '-' only."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"fleet-{run_id}-{host}")[:120]


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
