"""Run the profiler to its end on the node: relay its output, stop it only as it can finish its
report, and yield to a newcomer on a counter-using run's GPUs.

Runs ON THE NODE (standard library, Python 3.8), for :mod:`run`. The stop signals, and when each
is sent, are :mod:`stops`'. What the profiler wrote is copied to the agent's own output, a record
separator escaped, so that no output of the workload can pass for the agent's answer.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_nsyssession as nsyssession
    import fleet_agent_procs as procs
    import fleet_agent_ranksstop as ranksstop
    import fleet_agent_timelimit as timelimit
    import fleet_agent_window as window
    import fleet_agent_wire as wire
    import fleet_agent_workload as workload
    from fleet_agent_stops import YIELD_KILL_AFTER, Stops, rank_profilers
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import nsyssession, procs, ranksstop, timelimit, window, wire, workload
    from .stops import YIELD_KILL_AFTER, Stops, rank_profilers

# fleet's Ctrl-C, "leave the workload running": the collection ends alone (fleet.cli.interrupt)
LEAVE = signal.SIGUSR1
# a profiler not gone this long after SIGKILL (stuck in the kernel) is left: no more waiting
KILLED_WAIT = 30.0
PIPE_GRACE = 3.0   # seconds the profiler's output is still read after it exited
# What yielding does, by profiler (as measured on an H200 test machine,
# tests/fixtures/tools-2025.3-h200, ncu-sigint-by-agent): SIGINT to ncu's group ends it within 0.25
# s with its report kept, and shuts the workload down, whose process holds ncu's injection, so it
# cannot go on unprofiled.
YIELD_ACTION = {
    "ncu": "ncu stopped with SIGINT (as Ctrl-C), its report kept with the kernels profiled until "
           "then; the workload was stopped with it: it carries ncu's injection and cannot go on "
           "unprofiled",
    "nsys": "nsys stopped with SIGTERM, which ends the workload and writes the report: its GPU "
            "metrics sampling cannot be stopped alone",
    "nsys-session": "nsys stopped collecting through its session (nsys stop): the GPU metrics "
                    "released, the report written with the kernels until then, and the workload "
                    "went on unprofiled",
}


class Relay:
    """Copies the profiler's output to ours; keeps a tail to read nsys's own messages. The
    workload's stdout is where fleet reads our result from: a record separator in it is
    escaped, so no output of the workload can pass for a result (or hide ours)."""

    def __init__(self, tool=""):
        self.dead = False
        self.tail = b""
        self.ends_line = True  # whether what went to our stdout ends with a newline
        # the profiler's own error lines, wherever in its output
        self.errors = workload.ErrorLines(tool)

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
    it was not), whether helpers it started still held its output, and whether it outlived
    SIGKILL (``left``: fleet stopped waiting on it)."""
    # released_at: when nsys stop ended the collection
    exit_status = exited_at = why_stopped = released_at = None
    window = None  # window.Window: what became of the workload after a window
    lingering = yielded = killed = left = False
    notes = ()


def run_profiler(plan, relay, stop_requested, watch=None, released=lambda: None,
                 leave_requested=lambda: False):
    """Runs the profiler to its end, relaying its output. ``watch`` (started here, once the
    profiler runs) names a newcomer, to whom a counter-using run yields: stopped at once
    (``released``: called once nsys's session stopped collecting, the workload going on).
    ``leave_requested``: Ctrl-C's "leave the workload running" (LEAVE): the run ends without it."""
    env = dict(os.environ, **plan.env)
    ranks_stop = ranksstop.RanksStop(plan, env)
    win = window.Window(plan)
    win.begin()
    proc = subprocess.Popen(win.timed(list(ranks_stop.argv())), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    started = time.monotonic()
    if watch is not None:
        watch.begin(proc.pid, started)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, sys.stdout.buffer)
    sel.register(proc.stderr, selectors.EVENT_READ, sys.stderr.buffer)
    by_nsys = plan.stopped_by_nsys()
    ran, stops = Ran(), Stops(plan.tool, procs.Started(proc.pid),
                              lambda: rank_profilers(plan, proc), ranks_stop.mark,
                              nsyssession.SessionStop.of(plan, env), released)
    # A workload can print nsys's disk-full line too: it is nsys's only where the disk really is
    # full.
    relay.errors.confirm = lambda: workload.disk_is_full(env.get("TMPDIR"),
                                                         os.path.dirname(plan.output))
    duration_up = False
    open_streams = 2
    while _running(proc, ran, win, open_streams):
        now = time.monotonic()
        if _exited_or_left(ran, proc, stops, win, released, now):
            break
        leaving = (_may_leave(proc, stops, win, relay, now) if leave_requested()
                   else win.windows_written(plan, proc))
        if leaving:
            win.let_go(proc, [key.fileobj for key in sel.get_map().values()],
                       nsys_runs=leaving != "window", detached=leaving == "detach")
            open_streams = 0  # the workload's output is the drainer's now
            break
        timed_out, duration_up = timelimit.time_up(plan, now - started, by_nsys
                                                   and stops.released is None)
        # each rank's nsys stops its rank now, or soon (its --duration counts from its own start)
        if duration_up:
            ranks_stop.mark()
        # Once nsys is stopping the workload itself (its --duration is up) a stop request
        # (Slurm's trap) would only reach it while it writes the report: let it finish.
        told = stop_requested() and not duration_up
        if proc.poll() is None:
            _stop_if_due(plan, proc, stops, relay, watch, now, told, timed_out)
        elif told and win.follows:  # the window is over, the workload goes on: a stop is for it
            win.stop()
        open_streams = _relay_some(sel, relay, open_streams)
    _after_profiler(ran, proc, stops, win, relay, released, stop_requested)
    duration_up = timelimit.duration_was_up(plan, ran, started, duration_up, by_nsys
                                            and stops.released is None)
    ran.exit_status, ran.why_stopped = proc.returncode, _why_stopped(plan, proc, stops, win,
                                                                     duration_up, ranks_stop)
    # a profiler left running holds its output itself
    ran.lingering = open_streams > 0 and not ran.left
    return ran


def _exited_or_left(ran, proc, stops, win, released, now):
    """Notes the profiler's exit once seen (a window's workload then goes on); True where it
    outlived SIGKILL for KILLED_WAIT seconds (stuck in the kernel): it is left, no more waited
    on."""
    if ran.exited_at is None and proc.poll() is not None:
        # read after the poll, not ``now``: a profiler that ended between the two is not dated
        # before its end
        # helpers of a killed profiler may hold its pipes open: drain, then go
        ran.exited_at = time.monotonic()
        win.profiler_exited(proc.pid, released, stops.session_pids())
    ran.left = (ran.exited_at is None and stops.killed_at is not None and now
                - stops.killed_at >= KILLED_WAIT)
    return ran.left


def _may_leave(proc, stops, win, relay, now):
    """Whether the agent may go now, at Ctrl-C's "leave the workload running", and why:
    "collection", nsys's collection ended through its session, its report written (nsys runs on with
    the workload); "window", nsys gone after a window, the workload followed; else None. A run whose
    collection cannot be ended alone is stopped instead (Stops.leave)."""
    if proc.poll() is None:
        return "collection" if stops.leave(proc, now, relay) else None
    return "window" if win.follows else None


def _running(proc, ran, win, open_streams):
    """Whether the loop goes on: the profiler runs, or its output is still open (drained for
    PIPE_GRACE seconds after it exited, or while a window's workload it left runs on)."""
    if proc.poll() is None:
        return True
    return bool(open_streams) and (ran.exited_at is None or win.waiting()
                                   or time.monotonic() - ran.exited_at < PIPE_GRACE)


def _after_profiler(ran, proc, stops, win, relay, released, stop_requested):
    """Once the profiler's loop is over: what it started gone where it said its disk was full, a
    session stop still under way seen to its end, a window's workload waited for; into ``ran``."""
    if stops.full is not None:  # a profiler that obeyed (or died) leaves what it started: gone too
        stops.started.kill(reaped=not ran.left)
    # it exited as its output ended, between two looks
    if ran.exited_at is None and win.running_on is None:
        ran.exited_at = time.monotonic()
        win.profiler_exited(proc.pid, released, stops.session_pids())
    stops.finish_session(relay)
    win.reap(stop_requested)
    ran.window = win
    ran.yielded, ran.killed, ran.released_at, ran.notes = (stops.yielded is not None, stops.killed,
                                                           stops.released, tuple(stops.notes))


def _stop_if_due(plan, proc, stops, relay, watch, now, told, timed_out):
    """While the profiler runs: stopped where its disk is full, a newcomer came (a yield), fleet
    was told to stop, or the time is up; the processes it started looked at."""
    stops.started.look(now)
    if relay.errors.disk_full:
        stops.disk_full(proc, now)
    elif watch is not None and watch.arrived.is_set() and stops.yielding():
        stops.yield_to_newcomer(proc, now, relay)
    elif told or timed_out:
        stops.request(proc, now, "at its time limit of %gs, with a signal" % plan.timeout
                      if timed_out
                      else "when told to stop")


def _relay_some(sel, relay, open_streams):
    """Relays what the profiler wrote in the next 0.1 s; how many of its streams are still open."""
    for key, _ in sel.select(timeout=0.1) if open_streams else []:
        data = os.read(key.fileobj.fileno(), 65536)
        if not data:
            sel.unregister(key.fileobj)
            open_streams -= 1
        else:
            relay.write(key.data, data)
    if not open_streams:
        time.sleep(0.05)
    return open_streams


def _why_stopped(plan, proc, stops, win, duration_up, ranks_stop):
    """Why the run was stopped, or None: fleet's stop of the profiler, nsys's own --duration, or
    fleet's stop of the workload it stayed with after a window."""
    return stops.why or timelimit.by_duration(plan, proc, duration_up,
                                              ranks_stop) or win.why_stopped()


def yield_action(tool, ran):
    """What yielding did, in words, for the result (None when the run did not yield)."""
    if not ran.yielded:
        return None
    action = YIELD_ACTION.get("nsys-session" if ran.released_at is not None else tool,
                              "%s stopped" % tool)
    if ran.killed:
        action += "; it had not stopped %gs later and was killed (SIGKILL)" % YIELD_KILL_AFTER
    return action
