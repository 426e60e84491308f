"""Carry out one node's profiling plan, and leave the node as it was.

Runs ON THE NODE (standard library, Python 3.8), started by fleet with the
plan from ``fleet/plan.py``. In order: put back what dead runs left changed;
take the GPU counter locks; set owned sysctls; pause DCGM; look at the GPUs
once more, right before a counter-using profiler starts; run the profiler
(:mod:`profiler`), relaying its output, with the run's GPUs watched throughout
(:mod:`watch`: a counter-using profiler yields to a newcomer, stopped at once);
stop it only with SIGTERM/SIGINT so its report is finished (a --timeout on nsys
is nsys's own --duration, which keeps the kernels);
find, finish and hash its reports (:mod:`reports`); put everything back.

The result is one JSON document, a "profile" answer of the one wire (:mod:`wire`):
the last line on stdout for fleet over SSH, and the ``HOST.result.json`` file
beside the reports that a Slurm run's gather reads with the same framing. If fleet went away
meanwhile (its connection closed), the run goes on, the node is still put back, and the file is
still written; a result that cannot be written is an error the run reports.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_files as files
    import fleet_agent_gpus as nvml_gpus
    import fleet_agent_holders as holders
    import fleet_agent_holds as holds
    import fleet_agent_node as node
    import fleet_agent_owned as owned
    import fleet_agent_procs as procfs
    import fleet_agent_profiler as profiler
    import fleet_agent_reports as reports
    import fleet_rundir as rundir
    import fleet_agent_watch as watching
    import fleet_agent_window as window
    import fleet_agent_wire as wire
    import fleet_agent_workload as workload
    import fleet_plan as planner
    import fleet_policy as policy
    import fleet_safenames as safenames
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import files, node, owned, profiler, reports, wire, window, workload
    from . import procs as procfs
    from . import watch as watching
    from . import holders, holds
    from . import gpus as nvml_gpus
    from .. import plan as planner
    from .. import policy, rundir, safenames

AgentStatus = wire.AgentStatus  # the run's status, one of the wire's words

REFUSED_EXIT = 5
# the run's phases, from the process's start (the interpreter and the bundle's imports)
CLOCK = procfs.Clock()


def recheck(plan):
    """Tenants on the plan's GPUs now, by the same rule the plan was made with."""
    procs = node.processes()
    nvml, gpus = nvml_gpus.gpus(procs, os.getuid())
    if not nvml.get("available"):
        return ["NVML is not available any more: %s" % nvml.get("error")]
    state = policy.NodeState.read({"gpus": gpus, "mps": node.daemons(procs)[0]})
    request = policy.Request(gpus=plan.recheck.gpus, allow_own=plan.recheck.allow_own)
    return [str(t) for t in policy.tenants(state, request)]


@dataclass(frozen=True)
class RunArgs:
    """A profile call's arguments, read once: the plan (a Plan already where a Slurm task planned
    here), what the result says besides (``context``: a launcher's, a rank's job, rank and nonce;
    its ``whose`` goes into the result's own), and whether the result is stdout's last line too
    (not on Slurm, where its file is the only channel). A value not of its kind reads as absent."""
    plan: planner.Plan
    context: dict
    whose: dict
    result_line: bool = True

    @classmethod
    def read(cls, args):
        plan, context, line = args["plan"], args.get("context"), args.get("result_line")
        context = context if isinstance(context, dict) else {}
        whose = context.get("whose")
        return cls(plan if isinstance(plan, planner.Plan) else planner.Plan.from_json(plan),
                   context, whose if isinstance(whose, dict) else {},
                   line if isinstance(line, bool) else True)


def main(args, stops=None):
    """``stops`` collects stop signals already caught by a caller (a Slurm task, while planning)."""
    args = RunArgs.read(args)
    plan, holder = args.plan, holders.me()
    # "ok" is earned at the end of carry_out, never assumed: whatever stops it early says so.
    result = {"status": AgentStatus.ERROR, "host": plan.host, "node": os.uname()[1], "reasons": [],
              "notes": [],
              "reports": [], "given_up": list(plan.given_up), "changed": {}, "exit_status": None,
              "unfinished": [], "phases": CLOCK.begin()}
    result.update(args.context)
    # Whose the report is (a Slurm task says more: its job, step, rank, launcher): the user, to tell
    # the workload's own processes on the GPU from those of others (fleet.completeness).
    result["whose"] = dict({"host": plan.host, "user": node.user_name(os.getuid())}, **args.whose)
    stops = [] if stops is None else stops
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, profiler.LEAVE):
        signal.signal(sig, lambda s, f: stops.append(s))
    relay, code = profiler.Relay(plan.tool), 1
    problem = unsafe_paths(plan) or ranks_problem(plan)
    if problem:  # nothing is written: not the reports, not the result file beside them
        result["reasons"].append(problem)
        if args.result_line:
            relay.write(sys.stdout.buffer, frame(result).encode(), ours=True)
        else:
            sys.stderr.write("fleet: %s\n" % problem)
        return code
    try:
        code = carry_out(plan, result, relay, stops, holder)
    except Exception as e:  # a fault of the agent's own: reported as one, with the node put back
        result["status"], code = AgentStatus.ERROR, 1
        result["reasons"].append("the agent failed: %s: %s" % (type(e).__name__, e))
    finally:  # also when carrying out broke: the result is what fleet reads
        if not emit(result, plan, relay, line=args.result_line) and code == 0:
            code = 1  # a finished run whose result is nowhere to be read has not done its job
    return code


def unsafe_paths(plan):
    """Why the plan would put a file outside its run's directory, or None. fleet checked the
    names it made the plan of; the node checks again, as it may run as root, and these are the
    paths it writes (the reports, and the result beside them)."""
    problem = safenames.component_problem(plan.host, "the plan's host name")
    if problem or not plan.output:
        return problem
    run_dir = os.path.normpath(plan.report_dir)
    problem = safenames.component_problem(os.path.basename(plan.report_dir.rstrip("/")),
                                          "the plan's run id")
    out_dir = os.path.normpath(os.path.dirname(plan.output))
    if not problem and out_dir != run_dir and not out_dir.startswith(run_dir + os.sep):
        problem = "the plan's output %r is not inside its run directory %s" % (plan.output,
                                                                               plan.report_dir)
    return problem


def ranks_problem(plan):
    """Why the plan's count of a launcher's ranks cannot be used, or None: it says how many missing
    entries the result names, and is checked on the node by the rule fleet counted it by."""
    if plan.ranks is None:
        return None
    if not isinstance(plan.ranks, int):
        return "the plan's rank count %.40r is not a whole number" % (plan.ranks,)
    return safenames.count_problem(plan.ranks, "the plan's rank count", planner.MAX_RANKS)


def carry_out(plan, result, relay, stops, holder):
    """Locks, owned state, the last-moment check, the profiler and its
    reports; the node put back."""
    locks, changes, code = [], holds.NodeChanges(holder), 1
    try:
        if os.geteuid() == 0 and os.path.isdir(owned.STATE_DIR):
            repaired = owned.repair()
            if repaired["restored"] or repaired["dcgm_resumed"]:
                result["notes"].append("put back what an earlier run left: %s" % repaired)
        held = holds.lock_gpus(plan, locks)
        if held:
            return refuse(result, held)
        plan = changes.make(plan, result)
        if plan.recheck:
            tenants = recheck(plan)
            if tenants:
                return refuse(result, *["tenant appeared since the probe: " + t for t in tenants])
        result["notes"].extend("narrowed %s to 0700" % d for d in report_dirs(plan))
        if stops:  # cancelled, or a time limit near, before anything ran: start nothing
            result["status"] = AgentStatus.STOPPED
            result["reasons"].append("told to stop (signal %d) before "
                                     "the profiler started" % stops[0])
            return code
        given_back = lambda: holds.give_back(changes, locks, result)  # noqa: E731
        CLOCK.mark("checked")  # locks, owned state and the last look done: the profiler starts
        return settle(plan, result, profile(plan, result, relay, stops, given_back),
                      relay.errors.disk_full)
    except (owned.OwnedError, OSError) as e:
        result["status"] = AgentStatus.ERROR
        result["reasons"].append(str(e))
        return code
    finally:
        changes.put_back(result)
        for lock in locks:
            lock.release()


def profile(plan, result, relay, stops, given_back=lambda: None):
    """Runs the profiler, watched, in the run's private TMPDIR; its reports found, finished and
    summarized into the result (``given_back``: called once a yield ended the collection and the
    workload went on). What became of the profiler (profiler.Ran)."""
    tmp = private_tmp(plan)
    strays = reports.stray_qdstrms() if plan.tool == "nsys" else set()
    watch = watching.for_plan(plan)
    try:
        ran = profiler.run_profiler(plan, relay, lambda: any(s != profiler.LEAVE for s in stops),
                                    watch, given_back, lambda: profiler.LEAVE in stops)
    except BaseException:
        if watch is not None:
            watch.finish()
        raise
    CLOCK.mark("profiler_ended")
    record_run(plan, result, ran, watch, relay)
    exit_status, full = ran.exit_status, relay.errors.disk_full
    # left: SIGKILLed, not yet gone
    killed = ran.left or (exit_status is not None and exit_status < 0)
    result["reports"] = reports.collect(plan, relay.tail, result["notes"], strays, killed=killed,
                                        finish=not full,
                                        disk_full=full, unfinished=result["unfinished"])
    CLOCK.mark("collected")  # finished where nsys left its data, and hashed
    result["profiler_errors"] = workload.not_handled(result["profiler_errors"], result["reports"],
                                                     result["notes"])
    try:
        # what nsys left there was finished above: only a folder with nothing left goes
        os.rmdir(tmp)
    except OSError:
        pass
    if full:  # nsys export and stats write beside the report, on the full disk
        result["notes"].append("no summaries were made: the disk is full")
    elif plan.tool == "nsys" and plan.nsys:
        result["summaries"] = reports.summarize(plan.nsys, result["reports"], result["notes"])
        result["notes"].extend(workload.lost_to_signal(result["workload"], result["summaries"]))
    elif plan.tool == "ncu" and plan.ncu:
        result["summaries"] = reports.ncu_metrics(plan.ncu, result["reports"], result["notes"])
    CLOCK.mark("summarized")  # the exports and summaries made and hashed
    return ran


def settle(plan, result, ran, disk_full=None):
    """The run's status once the profiler has run: "ok" is earned here, with a report; never by
    a profiler that said the disk is full (``disk_full``: its line), whose report is cut, nor by
    one that outlived SIGKILL (``ran.left``), whose session was cut."""
    exit_status = ran.exit_status
    no_report = "the profiler exited %s and left no report under %s" % (exit_status, plan.output)
    if ran.left and not disk_full:
        result["status"] = AgentStatus.PROFILER_ERROR
        result["reasons"].append(
            "the profiler was killed (SIGKILL) and had not ended %gs later (stuck in the kernel): "
            "its session was cut, and whatever report it left is not whole" % profiler.KILLED_WAIT)
        return 1
    if disk_full:
        result["status"] = AgentStatus.PROFILER_ERROR
        result["reasons"].append(
            "the profiler said the disk is full (%s): no whole report can be written there, and "
            "fleet stopped it; free space where the run's folder %s is, or give the node a report "
            "folder with room (report_dir in the inventory: the profiler's temporary folder, "
            "TMPDIR, is the run's own in there)"
            % (disk_full, plan.report_dir))
        return 1
    if (result.get("newcomer") or {}).get("action"):
        result["status"] = AgentStatus.YIELDED
        if not result["reports"]:
            result["reasons"].append(no_report)
        return 0
    none_taken, taken = window.captured(plan.capture, result["reports"])
    if not result["reports"]:
        result["status"] = AgentStatus.NO_REPORT
        result["reasons"].append(none_taken or no_report)
        return 1
    result["notes"].extend(taken)
    if (overwritten := unnamed_ranks(plan, result["reports"]) or rank_reports(plan, result)):
        result["status"] = AgentStatus.PROFILER_ERROR
        result["reasons"].append(overwritten)
        return 1
    result["status"] = AgentStatus.OK
    return 0


def rank_reports(plan, result):
    """The ranks 0..N-1 the launcher was counted to start (``plan.ranks``) that left no report, into
    the result's ``missing_ranks`` (each becomes a ``missing`` entry of its own: the run is not
    complete); why not where a report is of a rank past N, or None. A rank past the count means
    the count is not the launcher's (a wrapper adding its own -np, an option fleet does not read),
    so which ranks are missing cannot be told: that is the profiler's setup failing, as for ranks
    whose reports are not each a rank's (unnamed_ranks), never an ok run."""
    if plan.ranks is None:
        return None
    found = {}
    for rep in result["reports"]:
        rank = rundir.RunDir.report_rank(rep["path"])
        if rank is not None:
            found[rank] = rep["path"]
    past = sorted(rank for rank in found if rank >= plan.ranks)
    if past:
        return ("a report of rank %d (%s), past the %d ranks the launcher's command line says it "
                "starts: the launcher started others than fleet counted, so which ranks left no "
                "report cannot be told"
                % (past[0], found[past[0]], plan.ranks))
    result["missing_ranks"] = [rank for rank in range(plan.ranks) if rank not in found]
    return None


def unnamed_ranks(plan, reports):
    """Why a launcher's ranks' reports are not each a rank's, or None: a launcher that does not set
    the variable each rank's report is named by (MPICH's mpirun for OMPI_COMM_WORLD_RANK) has nsys
    name every rank's report alike, each written over the last."""
    launcher = getattr(plan.command, "launcher", ())
    if not launcher:
        return None
    unnamed = rundir.RunDir.output_as(plan.output, "")
    if not any(os.path.splitext(rep["path"])[0] == unnamed for rep in reports):
        return None
    return ("the ranks' reports are named by %s, which the launcher did not set in its ranks: "
            "every rank wrote %s, each over the last (Open MPI's mpirun "
            "sets it; MPICH's does not)" % (
                rundir.PLACEHOLDER.search(plan.output).group(0), unnamed))


def record_run(plan, result, ran, watch, relay):
    """What the run, its watch and the profiler's output say, into the result."""
    if watch is not None:
        # The counters were free once nsys's session stopped collecting (the workload went
        # on), else once it exited.
        released = ran.released_at if ran.released_at is not None else ran.exited_at
        seen = watch.finish(released, profiler.yield_action(plan.tool, ran))
        result.update(newcomer=seen["newcomer"], conditions=seen["conditions"])
        result["notes"].extend(seen["notes"])
    result["exit_status"], result["stopped"] = ran.exit_status, ran.why_stopped is not None
    result["profiler_errors"] = relay.errors.close()
    result["workload"] = workload.outcome(plan.tool, ran.exit_status, result["profiler_errors"])
    after = ran.window.outcome() if ran.window is not None else None
    # nsys exited at the window's end: the workload's own end is the window's to say
    if after is not None:
        record, notes = after
        result["workload"] = record if record is not None else result["workload"]
        result["notes"].extend(notes)
    if ran.why_stopped:
        result["notes"].append("the workload was stopped " + ran.why_stopped)
    result["notes"].extend(ran.notes)
    if ran.left:
        result["notes"].append("the profiler had not ended %gs after SIGKILL (stuck in the "
                               "kernel): fleet stopped waiting on it" % profiler.KILLED_WAIT)
    if ran.lingering:
        result["notes"].append("the profiler exited while processes it started still hold its "
                               "output open; they were left running")


def refuse(result, *reasons):
    result["status"] = AgentStatus.REFUSED
    result["reasons"].extend(reasons)
    return REFUSED_EXIT


def frame(result):
    """The result as the one wire frames it, on stdout and in the result file alike."""
    return wire.frame("profile", result)


def private_tmp(plan):
    """The profiler's TMPDIR: a folder of the run's own, 0700 (nsys 2025.3 collects into
    $TMPDIR/nsys-report-XXXX.qdstrm, mode 0664 under any umask, as seen on an H200 test machine:
    in /tmp other users could read the run, the workload's command line in it, while it ran)."""
    tmp = rundir.RunDir(os.path.dirname(plan.output)).tmp(plan.host)
    files.private_dir(tmp, root=os.path.dirname(plan.report_dir))
    os.environ["TMPDIR"] = tmp  # the profiler inherits it; reports.stray_qdstrms looks there too
    return tmp


def report_dirs(plan):
    """The run's report directories, the user's own and private, checked right before use."""
    return files.private_dir(os.path.dirname(plan.output), root=os.path.dirname(plan.report_dir))


def result_path(plan):
    """Beside the host's reports: the run's folder on a lab server, a rank's
    node's folder on Slurm."""
    return rundir.RunDir(os.path.dirname(plan.output)).result(plan.host)


def emit(result, plan, relay, line=True):
    """The result beside the reports, and (for fleet reading our output) as the last line.
    False when it could not be left where fleet reads it."""
    CLOCK.mark("answered")
    written = True
    try:
        report_dirs(plan)
        files.write_private(result_path(plan), frame(result))
    except (OSError, TypeError, ValueError) as e:
        written = False
        result["notes"].append("could not write the result to %s: %s" % (result_path(plan), e))
        if result["status"] == AgentStatus.OK:
            result["status"] = AgentStatus.ERROR
            result["reasons"].append("the result could not be written beside the reports: %s" % e)
        if not line:  # on Slurm the file is the only channel: say it in the job's log at least
            sys.stderr.write("fleet: %s: %s\n" % (plan.host, result["reasons"][-1]))
    if line:
        lead = "" if relay.ends_line else "\n"
        relay.write(sys.stdout.buffer, (lead + frame(result)).encode(), ours=True)
        return not relay.dead or written
    return written
