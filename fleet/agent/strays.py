"""What nsys left away from the run's own report names, found and taken beside the reports:
its data in TMPDIR when it was killed, its report in /tmp when the name was taken, and the
processes it left still writing them.

Runs ON THE NODE (standard library, Python 3.8), for :mod:`reports`, whose ``collect`` takes
them. nsys 2025.3 collects into ``$TMPDIR/nsys-report-XXXX.qdstrm`` and writes the named report
at the end; a killed nsys leaves that data there, and helpers that outlive it go on writing.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import stat
import time

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_rundir as rundir
except ImportError:  # as part of the installed package (tests, the local machine)
    from .. import rundir

# seconds a killed nsys's helpers may go on writing its data before fleet takes it
LINGER_WAIT = 120.0
FULL_LINGER_WAIT = 5.0  # the same on a full disk, where they can write nothing more
# nsys 2025.3 generating a report: "Generating '/tmp/nsys-report-90af.qdstrm'", then its progress,
# "\r[1/1] [0%   ] vm-1694.nsys-rep" (the report's base name), as seen on an H200 test machine.
GENERATING = (re.compile(rb"Generating '([^'\n]+\.qdstrm)'\s*\[\d+/\d+\] "
                         rb"\[[^\]\n]*\] ([^/\s]+\.nsys-rep)"))


def stray_qdstrms():
    """nsys 2025.3 collects into $TMPDIR/nsys-report-XXXX.qdstrm and writes the named report
    at the end (seen on an H200 test machine): a killed nsys leaves its data there."""
    dirs = {os.environ.get("TMPDIR") or "/tmp", "/tmp"}
    return {p for d in dirs for p in glob.glob(os.path.join(d, "nsys-report-*.qdstrm"))}


def holders(paths):
    """The pids of the processes we can see that have any of ``paths`` open."""
    wanted, found = set(paths), set()
    for fd_dir in glob.glob("/proc/[0-9]*/fd"):
        try:
            if any(os.readlink(os.path.join(fd_dir, fd)) in wanted for fd in os.listdir(fd_dir)):
                found.add(int(fd_dir.split("/")[2]))
        except (OSError, ValueError):
            continue
    return found


def in_use(path):
    """Whether any process we can see has the file open (another nsys still collecting into it)."""
    return bool(holders([path]))


def wait_for_writers(paths, notes, limit=LINGER_WAIT):
    """A killed nsys leaves helpers that outlive it (seen on an H200 test machine: its importer,
    started apart from nsys's own process tree, goes on writing the report): the run's new data
    and reports are taken once nobody writes them any more, or after ``limit`` seconds."""
    started = time.monotonic()
    busy = holders(paths)
    while busy and time.monotonic() - started < limit:
        time.sleep(0.5)
        busy = holders(paths)
    waited = time.monotonic() - started
    if waited >= 1:
        notes.append("waited %.0f s for processes the profiler left (%s) to finish writing%s" % (
            waited, ", ".join(map(str, sorted(busy))) or "gone now", "; they still are" if busy
            else ""))


def adopt_strays(plan, tail, notes, strays_before):
    """The data a killed nsys left in TMPDIR, moved beside the reports: as NAME.qdstrm when nsys
    said it was generating NAME from it (then killed while it did), else as
    NAME-unfinishedN.qdstrm."""
    generating = dict(GENERATING.findall(tail))
    pattern = rundir.RunDir.output_glob(plan.output) + ".nsys-rep"
    for i, stray in enumerate(sorted(stray_qdstrms() - set(strays_before))):
        try:
            if os.stat(stray).st_uid != os.geteuid() or in_use(stray):
                continue  # someone else's run, or a concurrent run still collecting
            target = rundir.RunDir.output_as(plan.output, "unfinished%d" % i) + ".qdstrm"
            name = generating.get(stray.encode(), b"").decode(errors="replace")
            base = os.path.join(os.path.dirname(plan.output), name)[: -len(".nsys-rep")]
            if name and fnmatch.fnmatchcase(base + ".nsys-rep",
                                            pattern) and not os.path.exists(base + ".qdstrm"):
                target = base + ".qdstrm"
            os.replace(stray, target)
            notes.append("nsys ended before writing its report; its data %s was "
                         "moved to %s" % (stray, target))
        except OSError:
            continue


def found_elsewhere(plan, tail, notes, ext):
    """A taken name makes nsys write to /tmp/nsys-report-*.nsys-rep and still exit 0 (nsys 2025.3:
    "Failed to create '/tmp/r1.qdstrm': File exists." and its data in /tmp/nsys-report-e0dd.*;
    also seen as "Generated: /tmp/nsys-report-d073.nsys-rep"). The file named in its output is
    moved beside the reports only if it is a regular file of ours: /tmp is everyone's, and a link
    or a file another user planted under that name is never followed nor taken."""
    for i, elsewhere in enumerate(re.findall(rb"(/tmp/nsys-report-[0-9a-f]+\.nsys-rep)", tail)):
        path = elsewhere.decode()
        target = rundir.RunDir.output_as(plan.output, "moved%d" % i) + ext
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            notes.append("nsys named %s as its report, which is not a regular "
                         "file of ours: left there" % path)
            continue
        if target == plan.output + ext or os.path.lexists(target):
            notes.append("nsys wrote %s because the name was taken; left there "
                         "(%s exists)" % (path, target))
            continue
        try:
            os.replace(path, target)  # /tmp is sticky: a file of ours there is renamed only by us
        except OSError as e:
            notes.append("nsys wrote %s because the name was taken; it could "
                         "not be moved: %s" % (path, e))
            continue
        notes.append("nsys wrote %s because the name was taken; moved to %s" % (path, target))
