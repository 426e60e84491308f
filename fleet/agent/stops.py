"""The stop signals fleet sends a profiler on the node, and to whom: only as it can finish its
report, yielding to a newcomer sooner, sooner still where it said the disk is full.

Runs ON THE NODE (standard library, Python 3.8), for :mod:`profiler`, whose loop asks for each
stop. fleet stops a profiler only with SIGTERM (nsys; under a launcher, each rank's nsys) or
SIGINT (ncu's process group), repeated, and SIGKILL only for one wedged for minutes (its .qdstrm
is finished after); yielding escalates sooner, since each second the counters stay programmed is
one the newcomer pays for.
"""

from __future__ import annotations

import os
import signal
import time

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_procs as procs
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import procs

STOP_GRACE = 30.0  # seconds between repeated stop signals
# a profiler still alive this long after the first stop is wedged: SIGKILL, finish its .qdstrm
KILL_AFTER = 600.0
# nsys that said the disk is full cannot finish a report there: nsys 2025.3 then never exited, the
# workload ended (tests/fixtures/launchers-h200/3-disk-full.txt; waited on for 40 s, once 200 s). It
# is stopped at once, SIGTERM (its own stop), and killed with the workload it started this many
# seconds later.
DISK_FULL_KILL_AFTER = 5.0
# a profiler still programming counters this long after yielding to a newcomer: SIGKILL
YIELD_KILL_AFTER = 10.0


class Stops:
    """The stop signals fleet sends a profiler: repeated every STOP_GRACE seconds, SIGKILL only
    for one wedged KILL_AFTER seconds; yielding to a newcomer comes first and escalates sooner,
    since each second the counters stay programmed is one the newcomer pays for; a profiler that
    said the disk is full sooner still. SIGKILL reaches the processes it started too."""

    def __init__(self, tool, started, ranks=lambda: [], before_stop=lambda: None, session=None,
                 released=lambda: None):
        self.tool, self.why, self.started, self.ranks, self.before_stop = (tool, None, started,
                                                                           ranks, before_stop)
        self.first = self.last = self.yielded = self.full = self.killed_at = None
        self.killed = False
        # nsys's session: a yield stops collecting
        self.session, self.released, self.notes = session, None, []
        self.leaving = None  # when Ctrl-C asked to leave the workload running
        self.on_released = released

    def request(self, proc, now, why):
        if self.last is not None and now - self.last < STOP_GRACE:
            return
        if self.first is None:
            self.first, self.why = now, why
        self._send(proc, now, kill=now - self.first >= KILL_AFTER)

    def yield_to_newcomer(self, proc, now, relay):
        """Through nsys's session where it has one (the workload goes on), else by a signal; a
        session stop that fails or takes too long falls back to the signal."""
        if self.yielded is None:
            self.yielded = now
            if self.session is not None:
                self.session.start(now)
                return
            self._yield_by_signal(proc, now)
        elif self.session is not None:
            stopped = self.session.poll(now, relay)
            ended = self.session.collection_ended
            self._released_now(now, bool(stopped))  # the GPU is the newcomer's again
            if stopped is False and ended is None:
                self.notes.append("nsys stop --session did not stop the collection (%s): fleet "
                                  "sent SIGTERM instead, which ends the "
                                  "workload" % self.session.failure)
                self.session, self.yielded, self.released = None, now, None
                self._yield_by_signal(proc, now)
            elif stopped is False:
                self.notes.append("nsys stop --session ended the collection but said no report was "
                                  "written (%s)"
                                  % self.session.failure)
        elif now - self.yielded >= YIELD_KILL_AFTER and now - self.last >= 1.0:
            self._send(proc, now, kill=True)
            self.killed = True

    def leave(self, proc, now, relay):
        """Ctrl-C's "leave the workload running": nsys's collection stopped through its session
        (as a yield's), True once its report is written. Without a session (ncu, a launcher's ranks,
        a container), or where the session stop failed, the profiler is stopped instead, as Ctrl-C's
        other choice: False then, until it has ended."""
        # a yield already stops it: done with it
        if self.session is not None and self.yielded is not None:
            return not self.yielding()
        if self.session is not None and self.leaving is None:
            self.leaving = now
            self.session.start(now)
            return False
        if self.session is not None:
            stopped = self.session.poll(now, relay)
            if stopped is None or stopped:
                self._released_now(now, bool(stopped))
                return bool(stopped)
            self.notes.append("Ctrl-C asked to leave the workload running, but nsys stop --session "
                              "did not stop the collection (%s): fleet sent SIGTERM instead, which "
                              "ends the workload"
                              % self.session.failure)
            self.session = None
        elif self.leaving is None:
            self.notes.append("Ctrl-C asked to leave the workload running, but %s's collection "
                              "cannot be ended alone (no nsys session here): it was stopped, "
                              "with the workload" % self.tool)
        self.leaving = self.leaving or now
        self.request(proc, now, "when told to stop")
        return False

    def _released_now(self, now, stopped):
        """The GPU given back once the collection is seen over (nsys's session state, or its stop's
        end)."""
        ended = self.session.collection_ended
        if self.released is None and (stopped or ended is not None):
            self.released = ended if ended is not None else now
            self.on_released()

    def session_pids(self):
        """The pid of a session stop under way (a child of the agent, never the workload)."""
        proc = self.session.proc if self.session is not None else None
        return {proc.pid} if proc is not None else set()

    def finish_session(self, relay):
        """A session stop still under way when nsys exited (its window over, say): seen to its end,
        within its own bound, its output relayed and the GPU given back."""
        while self.session is not None and self.yielded is not None and not self.session.done:
            now = time.monotonic()
            if self.session.poll(now, relay) is None:
                time.sleep(0.1)
        ended = self.session.collection_ended if self.session is not None else None
        if self.session is not None and self.yielded is not None and self.released is None:
            self.released = ended if ended is not None else time.monotonic()
            self.on_released()

    def yielding(self):
        """Whether a yield is still under way: not yet given back, or its session stop not yet
        ended."""
        return self.released is None or (self.session is not None and not self.session.done)

    def _yield_by_signal(self, proc, now):
        self.first = now
        self.why = "to yield the GPU to a newcomer"
        self._send(proc, now)

    def disk_full(self, proc, now):
        if self.full is None:
            self.full = now
            self.first = self.first or now
            self.why = ("after the profiler said the disk is full, where it cannot finish its "
                        "report: SIGTERM, then SIGKILL %gs later with the processes it "
                        "started" % DISK_FULL_KILL_AFTER)
            self._send(proc, now)
        elif now - self.full >= DISK_FULL_KILL_AFTER and now - self.last >= 1.0:
            self._send(proc, now, kill=True)

    def _send(self, proc, now, kill=False):
        if kill:
            self.killed_at = self.killed_at or now
            self.started.kill()
        else:
            self.before_stop()
            stop(proc, self.tool, self.ranks)
        self.last = now


def stop(proc, tool, ranks=lambda: []):
    """nsys: SIGTERM to nsys alone, which stops the application and writes the report (under a
    launcher, to each rank's nsys: ``ranks``). ncu: SIGINT to its process group, as Ctrl-C in a
    terminal would. Only a profiler that ignored that for KILL_AFTER seconds gets SIGKILL
    (:meth:`procs.Started.kill`; its .qdstrm is finished after)."""
    for pid in (ranks() if tool == "nsys" else []) or [proc.pid]:
        try:
            if tool == "nsys":
                os.kill(pid, signal.SIGTERM)
            else:
                os.killpg(pid, signal.SIGINT)
        # gone (ProcessLookupError), or a rank's pid reused by another user's process since
        except OSError:
            pass


def rank_profilers(plan, proc):
    """The profilers a launcher started for its ranks (``mpirun OPTS nsys profile --output=...``),
    found by their own words below it: a stop goes to each, never to the launcher, since Open MPI's
    mpirun passes a SIGTERM on and SIGKILLs its ranks a second later (odls_base_sigkill_timeout,
    seen with 4.1: a rank's SIGTERM trap never finished), before nsys has written the report."""
    if not plan.command.launcher:
        return []
    return procs.started_below(proc.pid, (*plan.command.profiler[1:], *plan.command.fleet_flags))
