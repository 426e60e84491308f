"""Carry out one node's profiling plan, and leave the node as it was.

Runs ON THE NODE (standard library, Python 3.8), started by fleet with the
plan from ``fleet/plan.py``. In order: put back what dead runs left changed;
take the GPU counter locks; set owned sysctls; pause DCGM; look at the GPUs
once more, right before a counter-using profiler starts; run the profiler,
relaying its output, with the run's GPUs watched throughout (:mod:`watch`: a
counter-using profiler yields to a newcomer, stopped at once); stop it only
with SIGTERM/SIGINT so its report is
finished (a --timeout on nsys is nsys's own --duration, which keeps the kernels);
find, finish and hash its reports (:mod:`reports`); put everything back.

The result is one JSON document, a "profile" answer of the one wire (:mod:`wire`):
the last line on stdout for fleet over SSH, and the ``HOST.result.json`` file
beside the reports that a Slurm run's gather reads with the same framing. If fleet went away meanwhile (its connection closed),
the run goes on, the node is still put back, and the file is still written; a
result that cannot be written is an error the run reports.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_files as files
    import fleet_agent_gpus as nvml_gpus
    import fleet_agent_locks as gpu_locks
    import fleet_agent_node as node
    import fleet_agent_owned as owned
    import fleet_agent_reports as reports
    import fleet_agent_watch as watching
    import fleet_agent_wire as wire
    import fleet_agent_workload as workload
    import fleet_plan as planner
    import fleet_policy as policy
    import fleet_safenames as safenames
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import files, node, owned, reports, wire, workload
    from . import watch as watching
    from . import locks as gpu_locks
    from . import gpus as nvml_gpus
    from .. import plan as planner
    from .. import policy, safenames

REFUSED_EXIT = 5
STOP_GRACE = 30.0  # seconds between repeated stop signals
KILL_AFTER = 600.0  # a profiler still alive this long after the first stop is wedged: SIGKILL, finish its .qdstrm
PIPE_GRACE = 3.0   # seconds the profiler's output is still read after it exited
NSYS_BACKSTOP = 300.0  # nsys stopping the workload itself (--duration) then writes its report: stop it only this late
YIELD_KILL_AFTER = 10.0  # a profiler still programming counters this long after yielding to a newcomer: SIGKILL
# What yielding does, by profiler (as measured on an H200 test machine, tests/fixtures/tools-2025.3-h200,
# ncu-sigint-by-agent): SIGINT to ncu's group ends it within 0.25 s with its report kept, and shuts the
# workload down, whose process holds ncu's injection, so it cannot go on unprofiled.
YIELD_ACTION = {
    "ncu": "ncu stopped with SIGINT (as Ctrl-C), its report kept with the kernels profiled until then; the "
           "workload was stopped with it: it carries ncu's injection and cannot go on unprofiled",
    "nsys": "nsys stopped with SIGTERM, which ends the workload and writes the report: its GPU metrics sampling "
            "cannot be stopped alone",
}


class Relay:
    """Copies the profiler's output to ours; keeps a tail to read nsys's own messages. The
    workload's stdout is where fleet reads our result from: a record separator in it is
    escaped, so no output of the workload can pass for a result (or hide ours)."""

    def __init__(self, tool=""):
        self.dead = False
        self.tail = b""
        self.ends_line = True  # whether what went to our stdout ends with a newline
        self.errors = workload.ErrorLines(tool)  # the profiler's own error lines, wherever in its output

    def write(self, stream, data, ours=False):
        self.tail = (self.tail + data)[-65536:]
        if not ours:
            self.errors.feed(id(stream), data)
        if stream is sys.stdout.buffer and data:
            if not ours:
                data = data.replace(wire.MARK[:1].encode(), b"\\x1e")
            self.ends_line = data.endswith(b"\n")
        if self.dead:
            return
        try:
            stream.write(data)
            stream.flush()
        except (BrokenPipeError, OSError, ValueError):
            self.dead = True  # fleet is gone; the run is not


class Ran:
    """What became of the profiler: its exit status, when it exited, why fleet stopped it (None:
    it was not), and whether helpers it started still held its output."""
    exit_status = exited_at = why_stopped = None
    lingering = yielded = killed = False


def run_profiler(plan, relay, stop_requested, watch=None):
    """Runs the profiler to its end, relaying its output. ``watch`` (started here, once the
    profiler runs) names a newcomer, to whom a counter-using run yields: stopped at once."""
    env = dict(os.environ, **plan.env)
    proc = subprocess.Popen(list(plan.command.argv()), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    started = time.monotonic()
    if watch is not None:
        watch.begin(proc.pid, started)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, sys.stdout.buffer)
    sel.register(proc.stderr, selectors.EVENT_READ, sys.stderr.buffer)
    by_nsys = plan.stopped_by_nsys()
    deadline = started + plan.timeout + (NSYS_BACKSTOP if by_nsys else 0) if plan.timeout else None
    ran, stops = Ran(), Stops(plan.tool)
    duration_up = False
    open_streams = 2
    while open_streams and (ran.exited_at is None or time.monotonic() - ran.exited_at < PIPE_GRACE) or proc.poll() is None:
        now = time.monotonic()
        if ran.exited_at is None and proc.poll() is not None:
            ran.exited_at = now  # helpers of a killed profiler may hold its pipes open: drain a little, then go
        timed_out = deadline is not None and now >= deadline
        duration_up = by_nsys and now - started >= plan.timeout
        # Once nsys is stopping the workload itself (its --duration is up) a stop request
        # (Slurm's trap) would only reach it while it writes the report: let it finish.
        told = stop_requested() and not duration_up
        if proc.poll() is None:
            if watch is not None and watch.arrived.is_set():
                stops.yield_to_newcomer(proc, now)
            elif told or timed_out:
                stops.request(proc, now, "at its time limit of %gs, with a signal" % plan.timeout if timed_out
                              else "when told to stop")
        for key, _ in sel.select(timeout=0.1) if open_streams else []:
            data = os.read(key.fileobj.fileno(), 65536)
            if not data:
                sel.unregister(key.fileobj)
                open_streams -= 1
            else:
                relay.write(key.data, data)
        if not open_streams:
            time.sleep(0.05)
    if ran.exited_at is None:  # it exited as its output ended, between two looks
        ran.exited_at = time.monotonic()
    ran.exit_status, ran.why_stopped, ran.lingering = proc.returncode, stops.why, open_streams > 0
    ran.yielded, ran.killed = stops.yielded is not None, stops.killed
    if ran.why_stopped is None and duration_up and proc.returncode == 128 + signal.SIGTERM:
        # nsys --duration's --kill sigterm, not an end of the workload's own
        ran.why_stopped = "at its time limit of %gs, by nsys (--duration), its kernels until then kept" % plan.timeout
    return ran


class Stops:
    """The stop signals fleet sends a profiler: repeated every STOP_GRACE seconds, SIGKILL only
    for one wedged KILL_AFTER seconds; yielding to a newcomer comes first and escalates sooner,
    since each second the counters stay programmed is one the newcomer pays for."""

    def __init__(self, tool):
        self.tool, self.why = tool, None
        self.first = self.last = self.yielded = None
        self.killed = False

    def request(self, proc, now, why):
        if self.last is not None and now - self.last < STOP_GRACE:
            return
        if self.first is None:
            self.first, self.why = now, why
        stop(proc, self.tool, kill=now - self.first >= KILL_AFTER)
        self.last = now

    def yield_to_newcomer(self, proc, now):
        if self.yielded is None:
            self.yielded = self.first = self.last = now
            self.why = "to yield the GPU to a newcomer"
            stop(proc, self.tool)
        elif now - self.yielded >= YIELD_KILL_AFTER and now - self.last >= 1.0:
            stop(proc, self.tool, kill=True)
            self.last, self.killed = now, True


def stop(proc, tool, kill=False):
    """nsys: SIGTERM to nsys alone, which stops the application and writes the report.
    ncu: SIGINT to its process group, as Ctrl-C in a terminal would. Only a profiler
    that ignored that for KILL_AFTER seconds gets SIGKILL (its .qdstrm is finished after)."""
    try:
        if kill:
            os.killpg(proc.pid, signal.SIGKILL)
        elif tool == "nsys":
            os.kill(proc.pid, signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass


def yield_action(tool, ran):
    """What yielding did, in words, for the result (None when the run did not yield)."""
    if not ran.yielded:
        return None
    action = YIELD_ACTION.get(tool, "%s stopped" % tool)
    if ran.killed:
        action += "; it had not stopped %gs later and was killed (SIGKILL)" % YIELD_KILL_AFTER
    return action


def recheck(plan):
    """Tenants on the plan's GPUs now, by the same rule the plan was made with."""
    procs = node.processes()
    nvml, gpus = nvml_gpus.gpus(procs, os.getuid())
    if not nvml.get("available"):
        return ["NVML is not available any more: %s" % nvml.get("error")]
    state = {"gpus": gpus, "mps": node.daemons(procs)[0]}
    request = policy.Request(gpus=tuple(plan.recheck["gpus"]), allow_own=plan.recheck["allow_own"])
    return [str(t) for t in policy.tenants(state, request)]


def main(args, stops=None):
    """``stops`` collects stop signals already caught by a caller (a Slurm task, while planning)."""
    plan = args["plan"] if isinstance(args["plan"], planner.Plan) else planner.Plan.from_json(args["plan"])
    holder = owned.me()
    # "ok" is earned at the end of carry_out, never assumed: whatever stops it early says so.
    result = {"status": "error", "host": plan.host, "node": os.uname()[1], "reasons": [], "notes": [],
              "reports": [], "given_up": list(plan.given_up), "changed": {}, "exit_status": None}
    result.update(args.get("context") or {})
    # Whose the report is (a Slurm task says more: its job, step, rank, launcher): the user, to tell
    # the workload's own processes on the GPU from those of others (fleet.completeness).
    result["whose"] = dict({"host": plan.host, "user": node.user_name(os.getuid())}, **(result.get("whose") or {}))
    stops = [] if stops is None else stops
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: stops.append(s))
    relay, code = Relay(plan.tool), 1
    problem = unsafe_paths(plan)
    if problem:  # nothing is written: not the reports, not the result file beside them
        result["reasons"].append(problem)
        if args.get("result_line", True):
            relay.write(sys.stdout.buffer, frame(result).encode(), ours=True)
        else:
            sys.stderr.write("fleet: %s\n" % problem)
        return code
    try:
        code = carry_out(plan, result, relay, stops, holder)
    except Exception as e:  # a fault of the agent's own: reported as one, with the node put back
        result["status"], code = "error", 1
        result["reasons"].append("the agent failed: %s: %s" % (type(e).__name__, e))
    finally:  # also when carrying out broke: the result is what fleet reads
        if not emit(result, plan, relay, line=args.get("result_line", True)) and code == 0:
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
    problem = safenames.component_problem(os.path.basename(plan.report_dir.rstrip("/")), "the plan's run id")
    out_dir = os.path.normpath(os.path.dirname(plan.output))
    if not problem and out_dir != run_dir and not out_dir.startswith(run_dir + os.sep):
        problem = "the plan's output %r is not inside its run directory %s" % (plan.output, plan.report_dir)
    return problem


def carry_out(plan, result, relay, stops, holder):
    """Locks, owned state, the last-moment check, the profiler and its reports; the node put back."""
    locks, changed_state, code = [], False, 1
    try:
        if os.geteuid() == 0 and os.path.isdir(owned.STATE_DIR):
            repaired = owned.repair()
            if repaired["restored"] or repaired["dcgm_resumed"]:
                result["notes"].append("put back what an earlier run left: %s" % repaired)
        for uuid in plan.gpu_locks:
            lock = gpu_locks.GPULock(uuid)
            if not lock.acquire(plan.lock_wait):
                h = lock.holder() or {}
                code = refuse(result, "GPU %s is being profiled by pid %s (user %s: %s)" % (
                    uuid, h.get("pid", "?"), h.get("user") or "?", h.get("command") or "?"))
                return code
            locks.append(lock)
        if plan.sysctls:
            try:
                changed_state = True
                result["changed"] = owned.privileged("acquire_sysctls", wanted=plan.sysctls,
                                                     owned=plan.owned_sysctls, holder=holder)
            except (owned.OwnedError, OSError) as e:
                # Root never answered: nothing was changed, so there is nothing to put back.
                changed_state = not isinstance(e, owned.NoRoot)
                # Trace without CPU sampling rather than not at all.
                plan = plan.without_sampling("could not set %s (%s)" % (", ".join(plan.sysctls), e))
                result["given_up"] = list(plan.given_up)
        if plan.pause_dcgm:
            changed_state = True
            owned.privileged("pause_dcgm", holder=holder)
            result["changed"]["dcgm"] = "profiling paused"
        if plan.recheck:
            tenants = recheck(plan)
            if tenants:
                code = refuse(result, *["tenant appeared since the probe: " + t for t in tenants])
                return code
        result["notes"].extend("narrowed %s to 0700" % d for d in report_dirs(plan))
        if stops:  # cancelled, or a time limit near, before anything ran: start nothing
            result["status"] = "stopped"
            result["reasons"].append("told to stop (signal %d) before the profiler started" % stops[0])
            return code
        tmp = private_tmp(plan)
        strays = reports.stray_qdstrms() if plan.tool == "nsys" else set()
        watch = watching.for_plan(plan)
        try:
            ran = run_profiler(plan, relay, lambda: bool(stops), watch)
        except BaseException:
            if watch is not None:
                watch.finish()
            raise
        record_run(plan, result, ran, watch, relay)
        exit_status = ran.exit_status
        result["reports"] = reports.collect(plan, relay.tail, result["notes"], strays,
                                    killed=exit_status is not None and exit_status < 0)
        result["profiler_errors"] = workload.not_handled(result["profiler_errors"], result["reports"],
                                                         result["notes"])
        try:
            os.rmdir(tmp)  # what nsys left there was finished above: only a folder with nothing left goes
        except OSError:
            pass
        if plan.tool == "nsys" and plan.nsys:
            result["summaries"] = reports.summarize(plan.nsys, result["reports"], result["notes"])
            result["notes"].extend(workload.lost_to_signal(result["workload"], result["summaries"]))
        elif plan.tool == "ncu" and plan.ncu:
            result["summaries"] = reports.ncu_metrics(plan.ncu, result["reports"], result["notes"])
        if (result.get("newcomer") or {}).get("action"):
            result["status"], code = "yielded", 0
            if not result["reports"]:
                result["reasons"].append("the profiler exited %s and left no report under %s" % (exit_status, plan.output))
            return code
        if not result["reports"]:
            result["status"] = "no-report"
            result["reasons"].append("the profiler exited %s and left no report under %s" % (exit_status, plan.output))
            return code
        result["status"], code = "ok", 0
        return code
    except (owned.OwnedError, OSError) as e:
        result["status"] = "error"
        result["reasons"].append(str(e))
        return code
    finally:
        if changed_state:
            try:
                result["restored"] = owned.privileged("release", holder=holder)
            except Exception as e:  # reported; the next run or `fleet repair` puts it back
                result["notes"].append("could not put back node state now (%s); `fleet repair` will" % e)
        for lock in locks:
            lock.release()


def record_run(plan, result, ran, watch, relay):
    """What the run, its watch and the profiler's output say, into the result."""
    if watch is not None:
        seen = watch.finish(ran.exited_at, yield_action(plan.tool, ran))
        result.update(newcomer=seen["newcomer"], conditions=seen["conditions"])
        result["notes"].extend(seen["notes"])
    result["exit_status"], result["stopped"] = ran.exit_status, ran.why_stopped is not None
    result["profiler_errors"] = relay.errors.close()
    result["workload"] = workload.outcome(plan.tool, ran.exit_status, result["profiler_errors"])
    if ran.why_stopped:
        result["notes"].append("the workload was stopped " + ran.why_stopped)
    if ran.lingering:
        result["notes"].append("the profiler exited while processes it started still hold its output open; "
                               "they were left running")


def refuse(result, *reasons):
    result["status"] = "refused"
    result["reasons"].extend(reasons)
    return REFUSED_EXIT


def frame(result):
    """The result as the one wire frames it, on stdout and in the result file alike."""
    return wire.frame("profile", result)


def private_tmp(plan):
    """The profiler's TMPDIR: a folder of the run's own, 0700 (nsys 2025.3 collects into
    $TMPDIR/nsys-report-XXXX.qdstrm, mode 0664 under any umask, as seen on an H200 test machine:
    in /tmp other users could read the run, the workload's command line in it, while it ran)."""
    tmp = os.path.join(os.path.dirname(plan.output), ".tmp-%s" % plan.host)
    files.private_dir(tmp, root=os.path.dirname(plan.report_dir))
    os.environ["TMPDIR"] = tmp  # the profiler inherits it; reports.stray_qdstrms looks there too
    return tmp


def report_dirs(plan):
    """The run's report directories, the user's own and private, checked right before use."""
    return files.private_dir(os.path.dirname(plan.output), root=os.path.dirname(plan.report_dir))


def result_path(plan):
    return os.path.join(os.path.dirname(plan.output), "%s.result.json" % plan.host)


def emit(result, plan, relay, line=True):
    """The result beside the reports, and (for fleet reading our output) as the last line.
    False when it could not be left where fleet reads it."""
    written = True
    try:
        report_dirs(plan)
        files.write_private(result_path(plan), frame(result))
    except (OSError, TypeError, ValueError) as e:
        written = False
        result["notes"].append("could not write the result to %s: %s" % (result_path(plan), e))
        if result["status"] == "ok":
            result["status"] = "error"
            result["reasons"].append("the result could not be written beside the reports: %s" % e)
        if not line:  # on Slurm the file is the only channel: say it in the job's log at least
            sys.stderr.write("fleet: %s: %s\n" % (plan.host, result["reasons"][-1]))
    if line:
        lead = "" if relay.ends_line else "\n"
        relay.write(sys.stdout.buffer, (lead + frame(result)).encode(), ours=True)
        return not relay.dead or written
    return written
