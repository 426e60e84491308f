"""A Ray run's end on the node where its workers' reports are: the wait for their nsys, then each
finished report's export and summaries. Run by the Slurm job once the Ray program has ended
(fleet/slurm/launchers.py), and on the head by ``fleet ray submit`` once ``ray job submit`` has
returned (fleet/ray/submit.py): the job's end, or a gather at once, would otherwise lose a report
an nsys was still writing.

- **The wait.** Ray leaves its workers' nsys running as the program exits (each reparented to
  init, in a process group of its own) while each writes its report after its worker ended:
  seconds, tens of seconds for a large trace. This user's nsys whose ``-o`` is the run's output
  are waited for, bounded (NSYS_WAIT, ``FLEET_RAY_NSYS_WAIT``, less near the job's time limit,
  ``FLEET_JOB_END``): a worker Ray left alive keeps its nsys running for ever. One still running
  then is marked ``worker-HOST-PID.unfinished``, for fleet to say so, never counted complete.
- **The summaries.** A Ray worker has no agent of its own, so nothing made its summaries, and
  ``reports stats``, ``compare``, ``ranks`` and nightly had nothing to read of a Ray run. Each
  finished ``worker-HOST-PID.nsys-rep`` is exported and summarized as a rank's report is
  (:func:`reports.summarize`), beside it, and listed and brought home with it.

Runs ON THE NODE (standard library, Python 3.8), as the user. The folder is the one fleet's Ray
hook made: it must be this user's and closed to others, and each report a regular file of the
user's, else it is left alone and said.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import stat
import sys
import time
from dataclasses import dataclass
from typing import Optional

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_procs as procs
    import fleet_agent_reports as reports
    import fleet_rundir as rundir
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import procs, reports
    from .. import rundir

RunDir = rundir.RunDir
NSYS_WAIT = 60.0                   # seconds the workers' nsys are waited for, in all
# the job's environment may say another bound, in seconds (a larger trace)
WAIT_ENV = "FLEET_RAY_NSYS_WAIT"
# seconds kept before the job's time limit (FLEET_JOB_END) to say what is unfinished
JOB_END_MARGIN = 5.0
WAIT_EVERY = 0.2                   # seconds between looks at /proc
# seconds before the job's time limit below which no export is begun
SUMMARIES_NEED = 60
# the exit status when something was not done (each said on stderr)
NOT_ALL = 3


def _said(line):
    print("fleet: " + line, file=sys.stderr, flush=True)


def _argv(pid):
    return (procs.read("/proc/%d/cmdline" % pid) or "").split("\0")


def nsys_of_this_run(output):
    """This user's ``nsys profile ... -o OUTPUT`` processes, by pid: the nsys Ray started for this
    run's workers (Ray passes the block's ``o`` as ``-o VALUE``; the run folder in it is this run's
    alone). An nsys that ended and awaits its reaping has no command line, and is not counted."""
    found, me = {}, os.geteuid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat("/proc/" + name).st_uid != me:
                continue
        except OSError:
            continue
        argv = _argv(int(name))
        if "profile" in argv and any(a == "-o" and b == output for a, b in zip(argv, argv[1:])):
            found[int(name)] = argv
    return found


def _bound(bound):
    """``bound``, or the job's environment's, and never past the job's time limit less a margin."""
    said, end = _whole(os.environ.get(WAIT_ENV)), _whole(os.environ.get("FLEET_JOB_END"))
    bound = said if said is not None else bound
    return min(bound, end - time.time() - JOB_END_MARGIN) if end is not None else bound


def _whole(text):
    """A whole number of seconds the environment says, or None ("²" is a digit to str.isdigit)."""
    return int(text) if text and text.isascii() and text.isdigit() else None


def wait_for_nsys(output, bound=NSYS_WAIT):
    """Wait, up to ``bound`` seconds (see :func:`_bound`), until no nsys of this run's workers
    runs; each still running then is marked unfinished beside its report. Their pids."""
    bound = _bound(bound)
    deadline = time.monotonic() + bound
    running = nsys_of_this_run(output)
    if running:
        _said("the Ray program has ended; waiting up to %d s for the nsys of %d Ray workers to "
              "write their reports" % (max(0, bound), len(running)))
    while running and time.monotonic() < deadline:
        time.sleep(WAIT_EVERY)
        running = nsys_of_this_run(output)
    for pid in sorted(running):
        try:
            base = os.path.basename(_unfinished(os.path.dirname(output), pid))
        # a link or a folder the job put in the mark's place: said, the others marked
        except OSError as e:
            base = "of nsys pid %d (not marked: %s)" % (pid, e.strerror)
        _said("after %d s the nsys of Ray worker %s (pid %d) still runs: its report is missing or "
              "unfinished"
              % (max(0, bound), base, pid))
    return sorted(running)


def whose_nsys(path):
    """The pid of the nsys a worker's whose file names (fleet's Ray hook writes it in the job's
    folder, so the job's to write): None where the file or the pid is not there or not a pid."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    pid = doc.get("nsys_pid") if isinstance(doc, dict) else None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


def _unfinished(folder, nsys_pid):
    """Mark the worker of the nsys ``nsys_pid`` unfinished: named as its report is (from the whose
    file that names this nsys, else from its worker still running), else by the nsys's own pid."""
    worker, here = None, RunDir.ray_worker(socket.gethostname(), "")
    # this node's workers only: another node's nsys may have the same pid
    for name in os.listdir(folder):
        if name.startswith(here) and name.endswith(RunDir.WHOSE):
            if whose_nsys(os.path.join(folder, name)) == nsys_pid:
                worker = name[:-len(RunDir.WHOSE)]
    if worker is None:
        child = next((p for p in sorted(procs.children(nsys_pid))
                      if any(w.endswith("default_worker.py") for w in _argv(p))), None)
        worker = RunDir.ray_worker(socket.gethostname(), child if child else "nsys%d" % nsys_pid)
    path = os.path.join(folder, worker + RunDir.UNFINISHED)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"nsys_pid": nsys_pid}, f)
    return path[:-len(RunDir.UNFINISHED)]


def _private_folder(folder):
    """Why ``folder`` is not this user's own closed folder, or None."""
    try:
        st = os.lstat(folder)
    except OSError as e:
        return "%s cannot be read (%s)" % (folder, e.strerror)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return "%s is not this user's own closed folder (uid %d, mode %o)" % (folder, st.st_uid,
                                                                              st.st_mode & 0o7777)
    return None


def finished_reports(folder):
    """The worker reports in ``folder`` to summarize: regular files of this user's, not marked
    unfinished, in name order; each other one said."""
    found = []
    for path in sorted(glob.glob(os.path.join(glob.escape(folder), RunDir.RAY_WORKER + "*"
                                              + RunDir.NSYS_REPORT))):
        if os.path.lexists(RunDir.ray_base(path) + RunDir.UNFINISHED):
            continue
        try:
            st = os.lstat(path)
        except OSError:  # gone since it was listed
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            _said("%s is not a report of this user's alone: not summarized" % path)
            continue
        found.append({"path": path})
    return found


def summarize(folder, nsys):
    """The export and summaries of each finished report in ``folder``, made with ``nsys``; what
    was not made is said, and a file of its name left behind (a partial export nsys gave up on,
    one of an earlier try) is removed, so that what fleet lists beside a report is what was made
    of it now. Whether everything was made."""
    workers = finished_reports(folder)
    notes = []
    made = {entry["path"] for entry in reports.summarize(nsys, workers, notes)}
    for rep in workers:
        for path in RunDir.ray_extras(RunDir.ray_base(rep["path"])):
            if path not in made and os.path.lexists(path):
                os.unlink(path)
    for note in notes:
        _said(note)
    _said("the export and summaries of %d Ray worker report(s) made (%d files)" % (len(workers),
                                                                                   len(made)))
    return not notes


@dataclass(frozen=True)
class RayEndArgs:
    """The Ray run's end's arguments, read once: where the workers' reports are (``output``, the
    ``_nsight`` block's ``o``) and the nsys to summarize them with; a value that is not a string
    reads as absent."""
    output: str = ""
    nsys: Optional[str] = None

    @classmethod
    def read(cls, args):
        output, nsys = args.get("output"), args.get("nsys")
        return cls(output if isinstance(output, str) else "",
                   nsys if isinstance(nsys, str) and nsys else None)


def main(args):
    """The end of the Ray run whose workers' reports are ``args["output"]`` (the ``_nsight``
    block's ``o``, ``~/`` this user's home): the wait, then the summaries with ``args["nsys"]``,
    else the nsys on PATH (the one Ray started the workers under). 0 when all was done, else
    NOT_ALL, each thing not done said on stderr; the reports are kept either way."""
    asked = RayEndArgs.read(args)
    output = os.path.expanduser(asked.output)
    folder = os.path.dirname(output)
    why = _private_folder(folder)
    if why:
        _said("the Ray workers' reports are neither waited for nor summarized: " + why)
        return NOT_ALL
    unfinished = wait_for_nsys(output)
    nsys = asked.nsys or shutil.which("nsys")
    end = _whole(os.environ.get("FLEET_JOB_END"))
    if end is not None and end - time.time() < SUMMARIES_NEED:
        _said("the job's time limit is less than %d s away: the Ray workers' reports are kept "
              "without their export and summaries" % SUMMARIES_NEED)
        return NOT_ALL
    if not nsys:
        _said("no nsys on PATH here: the Ray workers' reports are kept "
              "without their export and summaries")
        return NOT_ALL
    return 0 if summarize(folder, nsys) and not unfinished else NOT_ALL
