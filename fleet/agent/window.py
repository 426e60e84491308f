"""A window of a long job: nsys collects DURATION seconds after START (``--delay``, ``--duration``,
``--kill none``), writes its report and exits, and the workload goes on (tests/fixtures/
nsys-sessions-h100, delay-duration: nsys exited at 13.3 s of a 20 s workload, which ran to its end).

Runs ON THE NODE (standard library, Python 3.8), for :mod:`profiler`. The agent makes itself the
subreaper of what it starts, so the workload nsys leaves behind becomes the agent's own child:

* without ``--detach`` the agent goes on relaying its output and waits for its end, whose exit
  status it then knows (a stop asked of fleet, Ctrl-C, goes to it: SIGTERM to its process group);
* with ``--detach`` the workload's output goes to a file of the run's from its start
  (fleet.plan.detached), and the agent leaves it running once the window's report is written: the
  result names its pids and that file.
"""

from __future__ import annotations

import ctypes
import glob
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_procs as procs
    import fleet_rundir as rundir
    import fleet_agent_workload as workload
    import fleet_wrapping_windows as windows
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import procs, workload
    from .. import rundir
    from ..wrapping import windows

# The workload's output once the agent has gone (Ctrl-C's "leave it running"), copied by a process
# of its own from the pipes the agent read into the run's file: argv[1] the file's fd, the rest the
# pipes'. It reads to the end whatever happens to the file (a full disk: the rest goes nowhere), so
# that the workload never meets a pipe without a reader.
DRAIN = """import os, select, sys
out = int(sys.argv[1])
fds = [int(a) for a in sys.argv[2:]]
while fds:
    for fd in select.select(fds, [], [])[0]:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        if not data:
            fds.remove(fd)
        while data:
            try:
                data = data[os.write(out, data):]
            except OSError:
                out, data = os.open(os.devnull, os.O_WRONLY), b""
"""
PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphaned descendants are reparented to this process
# seconds after the SIGTERM of a stop a workload left by the window still alive gets SIGKILL
KILL_AFTER = 30.0


class Window:
    """What became of the workload after a window (``plan.window``, a planparts.WindowPart: start,
    duration, detach, output); for a run without one (None), every method does nothing."""

    def __init__(self, plan):
        self.spec = plan.window
        where = getattr(plan, "report_dir", ""), getattr(plan, "host", "")
        self.output = rundir.RunDir(where[0]).workload_out(where[1]) if all(where) else None
        # left running at Ctrl-C's "leave it running": its pids and output (let_go)
        self.running_on = None
        self.let_go_said = self.capture_output = None
        self.left = []          # the workload's processes nsys left behind (pids)
        self.status = None      # the first one's exit status, waited for (os.waitpid's)
        self.adopted = self.exited = self.killed = False
        self.stopped_at = None  # when a stop asked of fleet went to the workload
        self.pending = []       # the left processes not yet ended (without --detach)

    def timed(self, argv):
        """The profiler's words with a Slurm rank's --delay counted again now, just before nsys
        starts (the plan counted it before the rank's checks): to the moment every rank's window
        starts (``at``), to the nearest second; a rank past it starts at once and no longer claims
        it."""
        if not self.spec or self.spec.at is None or "--delay=%s" % self.spec.start not in argv:
            return argv
        away = self.spec.at - time.time()
        if away < -1:
            self.spec = replace(self.spec, at=None)
        delay = "--delay=%d" % max(0, int(round(away)))
        return [delay if word == "--delay=%s" % self.spec.start else word for word in argv]

    def begin(self):
        """Before the profiler starts: the agent adopts what nsys will leave."""
        if self.spec:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                self.adopted = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
            except (OSError, AttributeError):
                self.adopted = False

    @property
    def follows(self):
        """Whether the agent stays with the workload to its end after the window (no --detach)."""
        return bool(self.spec) and not self.spec.detach and self.running_on is None

    def profiler_exited(self, profiler_pid, released, others=frozenset()):
        """nsys has exited, its window over: the processes it left, now the agent's children (not
        ``others``, the agent's own: a session stop); the node given back now (``released``: the
        GPU locks, DCGM, the owned sysctls), not at the workload's end."""
        if self.spec and not self.exited:
            self.exited = True
            self.left = sorted(procs.children(os.getpid()) - {profiler_pid} - set(others))
            self.pending = list(self.left) if self.follows else []
            released()

    def waiting(self):
        """Whether the agent still waits, relaying its output, for a workload the window left: until
        each left process has ended (reaped here as it ends), however long its helpers hold the
        output open after it."""
        for pid in list(self.pending):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not the agent's (it could not adopt): its end is not known
                self.pending.remove(pid)
                continue
            if done:
                self.pending.remove(pid)
                self.status = status if self.status is None and pid == self.left[0] else self.status
        return bool(self.pending)

    def stop(self):
        """A stop asked of fleet once nsys has gone: SIGTERM to each left process's group, and
        SIGKILL KILL_AFTER seconds later to one that has not ended by then."""
        now = time.monotonic()
        if self.stopped_at is None or now - self.stopped_at >= KILL_AFTER and not self.killed:
            self.killed = self.stopped_at is not None
            self.stopped_at = self.stopped_at or now
            for pid in self.pending:  # those reaped are gone: their pids may be another's now
                try:
                    os.killpg(os.getpgid(pid), signal.SIGKILL if self.killed else signal.SIGTERM)
                except OSError:
                    pass

    def reap(self, stop_requested):
        """Once the workload's output has ended: the left processes waited for (a stop asked of
        fleet meanwhile goes to them, SIGKILL 30 s after its SIGTERM), the first one's exit status
        kept."""
        while self.waiting():
            if stop_requested() or self.stopped_at is not None:
                self.stop()
            time.sleep(0.1)

    def let_go(self, profiler, streams, nsys_runs, detached=False):
        """Ctrl-C's "leave the workload running", once nsys's collection has ended (its session
        stopped; ``profiler`` runs on with the workload: ``nsys_runs``) or nsys has gone after a
        window; or ``detached``, --detach once every window the workload opens has its report. The
        output from now on (``streams``, the pipes the agent read) goes to the run's file by a
        drainer of its own (nsys's alone with --detach, whose workload writes its file from its
        start: it goes nowhere), and the agent leaves it all running."""
        left = [profiler.pid] if nsys_runs else list(self.left)
        output, why = self._drain(streams, to_file=not detached)
        output = self.capture_output if detached else output
        self.running_on, self.pending = running_record(left, output), []
        how = ("--detach: nsys wrote the report of every window asked" if detached else
               "Ctrl-C: nsys stopped collecting (nsys stop of its session) and wrote its report"
               if nsys_runs
               else "Ctrl-C: nsys had written the window's report")
        self.let_go_said = "%s, and the workload runs on: pid %s%s, its output %s" % (
            how, ", ".join(map(str, left)), " (nsys, the workload below it)" if nsys_runs else "",
            "in %s" % output if output else "dropped (%s)" % why)

    def windows_written(self, plan, profiler):
        """"detach" where the run has --detach with windows the workload opens and every window
        asked has its report, whole: as many non-empty reports at the run's output name as windows
        asked, and no data of nsys's left in the run's private TMPDIR to make one from (nsys writes
        each window's report as it ends: docs/examples/h200-acceptance/6679068/1-windows); else
        None."""
        spec = getattr(plan, "capture", None)
        if not (spec and spec.detach) or profiler.poll() is not None:
            return None
        stem = rundir.RunDir.output_glob(plan.output)
        written = [p
                   for p in set(glob.glob(stem
                                          + ".nsys-rep")) | set(glob.glob(stem
                                                                          + ".[0-9]*.nsys-rep"))
                   if os.path.getsize(p) > 0]
        tmp = os.environ.get("TMPDIR")
        pending = glob.glob(os.path.join(tmp, "nsys-report-*.qdstrm")) if tmp else []
        if len(written) < spec.repeat or pending:
            return None
        self.capture_output = spec.output
        return "detach"

    def _drain(self, streams, to_file=True):
        """(the file the drainer writes, or None; why not). Made anew in the run's folder, never
        through a link; a file there already (--detach's) is not written over."""
        try:
            if not to_file:
                raise OSError("--detach: the workload writes its own file")
            out = os.open(self.output,
                          os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND, 0o600)
            output, why = self.output, None
        except (OSError, TypeError) as e:
            out, output, why = os.open(os.devnull, os.O_WRONLY), None, "%s: %s" % (self.output, e)
        fds = [s.fileno() for s in streams]
        try:
            subprocess.Popen([sys.executable or "python3", "-I", "-c", DRAIN, str(out)]
                             + [str(fd) for fd in fds],
                             pass_fds=[out] + fds, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        # its pipes then close with the agent: the workload may end at its next write
        except OSError as e:
            output, why = None, "the drainer could not start: %s; it may end at its next write" % e
        os.close(out)
        for stream in streams:
            stream.close()
        return output, why

    def outcome(self):
        """(the workload record, or None where nsys's exit status says it; notes) for the result, or
        None for a run without a window, nor left running at Ctrl-C."""
        if self.running_on is not None:
            return {"exit_status": None, "signal": None,
                    "running": self.running_on}, [self.let_go_said]
        if not self.spec:
            return None
        said = ("nsys collected %ss after %ss (--window) and wrote its report; the workload "
                "went on" % (self.spec.duration, self.spec.start))
        # a Slurm rank's: counted to one moment for every rank
        if self.spec.at is not None:
            said = ("nsys collected %ss from %s (--window, the moment every rank's window starts) "
                    "and wrote its report; the workload went on" % (
                        self.spec.duration,
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.spec.at))))
        if not self.adopted:
            return (None,
                    ["the workload's end after the window is not known: the agent could not adopt "
                     "it (prctl)"])
        if not self.left:  # nsys passed its exit status on, as for any run
            return None, ["the workload ended within the window (--window %s:%s)" % (
                self.spec.start, self.spec.duration)]
        if not self.follows:
            running = running_record(self.left, self.spec.output)
            return ({"exit_status": None, "signal": None, "running": running},
                    [said + " and still runs (--detach): pid %s, its output in %s" % (
                        ", ".join(map(str, self.left)), running["output"])])
        if self.status is None:
            return {"exit_status": None, "signal": None}, [said
                                                           + "; its end was not seen (it was not "
                                                             "adopted)"]
        record = _status(self.status)
        # Ctrl-C, fleet cancel, a Slurm job's time limit: fleet's stop, not its own end
        if self.stopped_at is not None:
            return record, [said
                            + " and was stopped when fleet was told to stop (%s)" % _said(record)]
        return record, [said + " and ended by itself (%s)" % _said(record)]

    def why_stopped(self):
        """Why fleet stopped the workload it stayed with after the window, or None."""
        if self.stopped_at is None:
            return None
        return "after its window, when told to stop (SIGTERM to its process group%s)" % (
            ", SIGKILL %gs later" % KILL_AFTER if self.killed else "")


def running_record(pids, output):
    """What the result says of a workload left running: its pids, each one's start time (clock ticks
    since boot, None for one gone already) and the boot's id, which tell it from a later process
    given the same pid (fleet jobs, fleet cancel), the file its output goes to, and its session
    (nsys's, the workload below it in it), by which fleet top tells its GPU processes."""
    lineages = [procs.lineage(pid) or (None, None, None) for pid in pids]
    boot = (procs.read("/proc/sys/kernel/random/boot_id") or "").strip() or None
    # fleet top finds its processes by it
    session = next((sid for _, sid, _ in lineages if sid is not None), None)
    return {"pids": list(pids), "started": [began for _, _, began in lineages], "boot": boot,
            "output": output, "session": session}


def captured(spec, reports):
    """What the windows the workload opens (``plan.capture``, a planparts.CapturePart: range, nvtx,
    repeat; None: none) gave, by the reports nsys wrote (each window its own, NAME.1 to NAME.N with
    --repeat): (why no window was taken, or None; notes for the result)."""
    if not spec:
        return None, []
    opened, asked = windows.opened_by(spec), spec.repeat
    taken = len([r for r in reports if r["path"].endswith(".nsys-rep")])
    if not taken:
        return ("no window was taken: the workload never opened one (%s) while nsys ran, and nsys "
                "collects nothing outside it" % opened), []
    after = "the workload runs on (--detach)" if spec.detach and taken >= asked else \
        "the workload went on to its end"
    said = "nsys collected %d window%s (%s), and %s" % (taken, "s" if taken > 1 else "", opened,
                                                        after)
    if taken < asked:
        said += "; %d of the %d asked (--repeat %d): the workload opened it %d times" % (
            taken, asked, asked, taken)
    return None, [said]


def _status(status):
    if os.WIFSIGNALED(status):
        return {"exit_status": None, "signal": workload.signal_name(os.WTERMSIG(status))}
    return {"exit_status": os.WEXITSTATUS(status), "signal": None}


def _said(record):
    return ("killed by %s" % record["signal"] if record["signal"]
            else "exit status %d" % record["exit_status"])
