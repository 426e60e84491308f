"""What a profiled run's exit and output say of the workload, and of the profiler itself.

Runs ON THE NODE (standard library, Python 3.8). As recorded on an H200 test machine
(tests/fixtures/tools-2025.3-h200/): nsys exits with the workload's status, as a shell gives it
(3; 139 for SIGSEGV) and prints nothing of it; ncu exits with it too, and says it in
``==ERROR== The application returned an error code (N).``, where a workload killed by a
signal gives the signal's number (SIGSEGV: 11), so under ncu a signal cannot be told from an
exit status. The profiler's own error lines are kept as they come, a bounded few.
"""

from __future__ import annotations

import errno
import os
import re
import signal

FULL_MARGIN = 1 << 20  # bytes: a folder with less free is full (a report taken from one is cut)
MAX_ERRORS = 20
MAX_LINE = 300
NCU_APP_CODE = re.compile(r"==ERROR== The application returned an error code \((-?\d+)\)")
# What a profiler says when the disk filled under it: the C library's words (ENOSPC), and nsys
# 2025.3's (tests/fixtures/launchers-h200/3-disk-full.txt): writing a process's termination status
# into its TMPDIR it threw WriteStreamException, said "[QuadDCommon::tag_message*] = Is the disk
# full? Total size: 67108864 bytes, Used size: 67108864 bytes, Free size to caller: 0 bytes", and
# then never exited.
DISK_FULL_WORDS = (os.strerror(errno.ENOSPC), "Is the disk full?")
NSYS_DISK_FULL = r"\[QuadDCommon::tag_message\*\] = " + re.escape(DISK_FULL_WORDS[1])
DISK_FULL_LINE = {"nsys": re.compile("^" + NSYS_DISK_FULL)}
# Lines the profilers print of their own failures: ncu's ==ERROR== lines; nsys's, as seen
# (tests/fixtures): "Failed to create '...': File exists.", "Importer error status: ...",
# its disk-full line, and the usual "Error:"/"ERROR"/"FATAL" beginnings.
ERROR_LINE = {"ncu": re.compile(r"^==ERROR== "),
              "nsys": re.compile(r"^(Error|ERROR|FATAL|Fatal error|Failed to |Importer error "
                                 r"status|%s)"
                                 % NSYS_DISK_FULL)}


def disk_is_full(*folders):
    """Whether one of the folders (the profiler's TMPDIR, the report folder) has less than
    FULL_MARGIN bytes free now."""
    for folder in folders:
        try:
            st = os.statvfs(folder or ".")
        except OSError:
            continue
        if st.f_bavail * st.f_frsize < FULL_MARGIN:
            return True
    return False


def signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return "signal %d" % number


def outcome(tool, exit_status, errors):
    """``{"exit_status", "signal"}`` of the workload, from the profiler's exit status and, for
    ncu, its line naming the application's code. None fields: not known (a profiler killed by
    a signal itself says nothing of the workload)."""
    if exit_status is None or exit_status < 0:
        return {"exit_status": None, "signal": None}
    if tool == "ncu":
        codes = [int(m.group(1)) for m in (NCU_APP_CODE.search(e) for e in errors) if m]
        return {"exit_status": codes[-1] if codes else exit_status, "signal": None}
    if exit_status > 128 and exit_status - 128 < signal.NSIG:  # as a shell gives it
        return {"exit_status": None, "signal": signal_name(exit_status - 128)}
    return {"exit_status": exit_status, "signal": None}


class ErrorLines:
    """The profiler's own error lines, as its output streams by (lines cut across reads are
    joined first), bounded in count and length. The disk-full line is the profiler's only while
    ``confirm`` (the profiler's folders really full, :func:`disk_is_full`) says so as it comes: the
    workload writes to the same pipes, and what it prints is its own."""

    def __init__(self, tool):
        self.pattern = ERROR_LINE.get(tool)
        self.full_pattern = DISK_FULL_LINE.get(tool)
        self.lines, self.left_out = [], 0
        self.disk_full = None  # the profiler's own line saying the disk is full, once it said so
        self.confirm = lambda: True
        self._partial = {}

    def feed(self, stream, data):
        if self.pattern is None:
            return
        text = self._partial.pop(stream, "") + data.decode("utf-8", "replace")
        *whole, rest = re.split(r"\r?\n|\r", text)
        if len(rest) < 4096:
            self._partial[stream] = rest
        for line in whole:
            self._take(line)

    def close(self):
        for rest in self._partial.values():
            self._take(rest)
        self._partial = {}
        return self.lines + (["(%d more error lines left out)" % self.left_out] if self.left_out
                             else [])

    def _take(self, line):
        # ncu prints ==PROF== progress and ==ERROR== on one line when they meet mid-line
        at = line.find("==ERROR== ")
        line = line[at:] if at > 0 and self.pattern.pattern.startswith("^==ERROR") else line
        if not self.pattern.search(line):
            return
        if (self.disk_full is None and self.full_pattern is not None
                and self.full_pattern.search(line) and self.confirm()):
            self.disk_full = line.strip()[:MAX_LINE]
        if len(self.lines) < MAX_ERRORS:
            self.lines.append(line.strip()[:MAX_LINE])
        else:
            self.left_out += 1


def lost_to_signal(outcome, summaries):
    """Why an nsys report of a workload killed by a signal has no kernels: nsys keeps CUDA
    activity only of a workload that ends or that its --duration stops (on an H200 test machine
    a SIGSEGV after 2,000 kernels left an empty kernel summary,
    tests/fixtures/tools-2025.3-h200)."""
    empty = [s for s in summaries if s.get("summary") == "cuda_gpu_kern_sum" and not s.get("size")]
    if not outcome.get("signal") or not empty:
        return []
    return ["the kernel summary is empty although the workload ran: it was killed by %s, and the "
            "CUDA activity nsys had not yet saved died with the process" % outcome["signal"]]


# nsys's error lines about what fleet finishes itself (tests/fixtures/tools-2025.3-h200): its
# importer failing (the report is finished from its .qdstrm), and a taken output name (the report it
# wrote elsewhere is moved beside the others).
HANDLED = ((re.compile(r"^Importer error status"), lambda reps: any(r.get("finished_from_qdstrm")
                                                                    for r in reps)),
           (re.compile(r"^Failed to create '.*': File exists"), lambda reps: bool(reps)))


def not_handled(errors, reports, notes):
    """The profiler's error lines less those about what fleet then did itself, which become
    notes."""
    left = []
    for line in errors:
        if any(rule.match(line) and done(reports) for rule, done in HANDLED):
            notes.append("the profiler said %r; fleet finished the report itself" % line)
        else:
            left.append(line)
    return left
