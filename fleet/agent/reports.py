"""A profiled run's reports on the node: found, finished, hashed and summarized.

Runs ON THE NODE (standard library, Python 3.8), for :mod:`run`. nsys 2025.3
collects into ``$TMPDIR/nsys-report-XXXX.qdstrm`` and writes the named report at
the end; what it leaves when it is killed, or when its importer cannot run, is
finished here with the installation's ``QdstrmImporter``. Next to each report go
its SQLite export and the CSV summaries fleet keeps (made from that export by
:mod:`summaries` as ``nsys stats`` writes them; ``ncu --import``), hashed like it.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import os
import re
import signal
import stat
import subprocess
import threading
import time

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_files as files
    import fleet_agent_node as node
    import fleet_rundir as rundir
    import fleet_agent_summaries as summaries
    import fleet_agent_workload as workload
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import files, node, summaries, workload
    from .. import rundir

SUMMARIES = rundir.RunDir.NSYS_SUMMARIES  # nsys stats reports kept beside each report
# Each report is exported to NAME.sqlite once; the summaries are made from that export, which is
# kept too, as a report of its own kind, for the cross-rank analysis at home (fleet.analysis.ranks).
EXPORT = "sqlite"
EXPORTS_AT_ONCE = 4  # nsys exports of one run's reports at a time: each is mostly one busy thread
STATS_TIMEOUT = 600.0  # nsys export of a large report takes minutes; one that hangs is given up
# seconds a killed nsys's helpers may go on writing its data before fleet takes it
LINGER_WAIT = 120.0
FULL_LINGER_WAIT = 5.0  # the same on a full disk, where they can write nothing more
# what a profiler says when the disk filled
DISK_FULL = tuple(words.encode() for words in workload.DISK_FULL_WORDS)
# bytes: a report's folder with less free when it is taken is full, the report cut
FULL_MARGIN = workload.FULL_MARGIN
# QdstrmImporter on a large collection takes minutes; one that hangs is stopped
IMPORT_TIMEOUT = 600.0
# nsys 2025.3 generating a report: "Generating '/tmp/nsys-report-90af.qdstrm'", then its progress,
# "\r[1/1] [0%   ] vm-1694.nsys-rep" (the report's base name), as seen on an H200 test machine.
GENERATING = (re.compile(rb"Generating '([^'\n]+\.qdstrm)'\s*\[\d+/\d+\] "
                         rb"\[[^\]\n]*\] ([^/\s]+\.nsys-rep)"))


def importer_for(nsys):
    """The QdstrmImporter that finishes a .qdstrm: the one of the same nsys installation,
    else (nsys reached through a wrapper script, as module systems do) the newest installed."""
    here = os.path.dirname(os.path.realpath(nsys)) if nsys else "/nonexistent"
    for pattern in ("QdstrmImporter", "../*/QdstrmImporter", "../../*/QdstrmImporter"):
        hits = sorted(glob.glob(os.path.join(here, pattern)))
        if hits:
            return os.path.normpath(hits[0])
    return installed_importer()


def installed_importer():
    """The newest QdstrmImporter of the Nsight installations under /opt/nvidia, or None."""
    installed = glob.glob("/opt/nvidia/nsight-systems/*/host-linux-x64/QdstrmImporter") + \
        glob.glob("/opt/nvidia/nsight-compute/*/host/*/QdstrmImporter")
    return sorted(installed, key=node._version_key)[-1] if installed else None


def hashed(path):
    """A file the run wrote, as fleet lists it: path, size and sha256, read without following a
    link and made private (:func:`files.open_report`)."""
    h = hashlib.sha256()
    with files.open_report(path) as f:
        size = os.fstat(f.fileno()).st_size
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"path": path, "size": size, "sha256": h.hexdigest()}


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


def collect(plan, tail, notes, strays_before=frozenset(), killed=False, finish=True, disk_full=None,
            unfinished=None):
    """Every report this run produced, finished and hashed. An empty report file is not a report
    (an importer killed while writing it leaves one): it is named in a note and not listed, and
    where its data is left as NAME.qdstrm that is finished instead, unless not to ``finish`` (the
    disk is full: the importer could not write the report there either). ``disk_full``: the
    profiler's own line saying so (the Relay's finding): every report of the run is then cut.
    ``unfinished``: a list that gains a line for each NAME.qdstrm left without its report (the
    result's ``unfinished``, which the controller classifies by)."""
    ext = ".nsys-rep" if plan.tool == "nsys" else ".ncu-rep"
    stem = rundir.RunDir.output_glob(plan.output)  # a pid's, or each rank's of a launcher
    found, finished = [], set()
    if plan.tool == "nsys":
        # only a killed nsys leaves its data in TMPDIR, where other runs' data may be too
        if killed:
            wait_for_writers(sorted(stray_qdstrms() - set(strays_before)) + glob.glob(stem + ".*"),
                             notes, LINGER_WAIT if finish else FULL_LINGER_WAIT)
            adopt_strays(plan, tail, notes, strays_before)
        found_elsewhere(plan, tail, notes, ext)  # nsys exits 0 then: whatever its exit status
        finished = finish_leftovers(plan, stem, tail, notes, killed, finish,
                                    unfinished if unfinished is not None else [])
    for path in report_files(stem, ext):
        try:
            entry = hashed(path)
        except OSError as e:
            notes.append("%s not taken: %s" % (path, e))
            continue
        if entry["size"] == 0:
            notes.append("%s is empty, not a report: the profiler was "
                         "stopped while writing it" % path)
            continue
        # nsys's own disk-full line is the Relay's to find (anchored, the disk seen full): in the
        # tail it may be the workload's words, which share nsys's pipes
        cut = "the profiler said: %s" % disk_full[-200:] if disk_full else \
            cut_short(path, b"" if plan.tool == "nsys" else tail)
        if cut:
            entry["truncated"] = cut
            notes.append("%s is truncated: %s" % (path, cut))
        found.append(dict(entry, finished_from_qdstrm=path in finished))
    return found


def finish_leftovers(plan, stem, tail, notes, killed, finish, unfinished):
    """nsys's data left at the run's own output name (NAME.qdstrm), this run's whatever nsys's exit
    status: each finished into its report (an empty report file in its way removed first), unless
    not to ``finish`` (the disk is full); the leftovers finished. Each left without its report
    adds its line to ``unfinished`` as well as to ``notes``."""
    finished = set()
    for leftover in sorted(glob.glob(stem + ".qdstrm")):
        report = leftover[: -len(".qdstrm")] + ".nsys-rep"
        if os.path.exists(report) and os.path.getsize(report) > 0:
            continue
        if not finish:
            said = ("nsys's data %s is left unfinished: the disk is full, no report "
                    "can be made there" % leftover)
            notes.append(said)
            unfinished.append(said)
            continue
        if os.path.exists(report):
            notes.append("%s is empty, not a report: its data %s is finished instead" % (report,
                                                                                         leftover))
            os.unlink(report)
        elif not killed:
            notes.append(left_unfinished(leftover, tail))
        done, said = importing(importer_for(plan.nsys), leftover)
        notes.append(said)
        if done is None:
            unfinished.append(said)
        finished.add(done)
    return finished


def report_files(stem, ext):
    """The reports at the run's output name: NAME.EXT, and each window's NAME.K.EXT (nsys's capture
    range repeated: fleet.wrapping.windows), where NAME has no placeholder for K to fall in (a Slurm
    rank's)."""
    return sorted(set(glob.glob(stem + ext)) | set(glob.glob(stem + ".[0-9]*" + ext)))


def cut_short(path, tail):
    """Why the report may be cut short though it is there and not empty, or None: its folder is full
    (the disk filled while it was written: what was written then is all there is), or the
    profiler's own error lines say the disk was full."""
    try:
        st = os.statvfs(os.path.dirname(path) or ".")
    except OSError:
        st = None
    if st is not None and st.f_bavail * st.f_frsize < FULL_MARGIN:
        return ("its folder %s had %d bytes free when it was taken: the disk filled while it was "
                "written" % (os.path.dirname(path), st.f_bavail * st.f_frsize))
    said = [line for line in tail.splitlines() if any(words in line for words in DISK_FULL)]
    if said:
        return "the profiler said: %s" % said[-1].strip().decode(errors="replace")[-200:]
    return None


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


def left_unfinished(leftover, tail):
    """What to say of a .qdstrm nsys left at the output name though it was not killed: nsys 2025.3
    does so, and exits 0, when its importer cannot run (seen on an H200 test machine: libdw.so.1
    missing), after saying so at its start."""
    said = [line.strip().decode(errors="replace") for line in tail.splitlines()
            if b"importer" in line.lower()]
    return "nsys left its data unfinished at %s%s" % (leftover, "; it said: "
                                                      + " ".join(said[-2:]) if said else "")


def summarize(nsys, reports, notes):
    """Each report's SQLite export (``nsys export``, once), hashed like the reports, and the
    summaries fleet keeps made from it (:mod:`summaries`) as CSV files beside the report. Each is
    an extra: one that could not be made is named in a note, and never costs the report. The
    reports of one run (a launcher's ranks on one node) are exported EXPORTS_AT_ONCE at a time;
    their entries and notes come back in the reports' order."""
    done = [None] * len(reports)

    def one(i):
        try:
            done[i] = summarize_one(nsys, reports[i])
        # in a thread: an extra that failed is a note, never a traceback or the report's loss
        except Exception as e:
            done[i] = ([],
                       ["the export and summaries of %s could not be made: "
                        "%s" % (reports[i]["path"], e)])
    for first in range(0, len(reports), EXPORTS_AT_ONCE):
        summaries.in_threads(one, range(first, min(first + EXPORTS_AT_ONCE, len(reports))))
    out = []
    for entries, said in done:
        out.extend(entries)
        notes.extend(said)
    return out


def summarize_one(nsys, rep):
    """(the export and summary entries of one report, the notes of their making)."""
    out, notes = [], []
    base = rep["path"][: -len(".nsys-rep")]
    export = export_of(nsys, rep["path"], base + ".sqlite", notes)
    if export is None:
        return out, notes
    # The export (hundreds of MB) is hashed while the summaries are made from it: both only read it.
    hashing = Hashing(export)
    failed = summaries.write(export, SUMMARIES, lambda name: "%s_%s.csv" % (base, name))
    exported = hashing.result(notes)
    for name in SUMMARIES:
        path = "%s_%s.csv" % (base, name)
        if name in failed:
            notes.append("the %s summary of %s could not be made from its export: %s"
                         % (name, rep["path"], failed[name]))
            continue
        try:
            out.append(dict(hashed(path), report=rep["path"], summary=name))
        except OSError as e:
            notes.append("%s not taken: %s" % (path, e))
    if exported is not None:
        out.append(dict(exported, report=rep["path"], summary=EXPORT, kind="export"))
    return out, notes


class Hashing:
    """:func:`hashed` of a file, in a thread of its own (hashlib works without the interpreter's
    lock)."""

    def __init__(self, path):
        self.path, self.entry, self.error = path, None, None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self):
        try:
            self.entry = hashed(self.path)
        except OSError as e:
            self.error = e

    def result(self, notes):
        """The entry, or None and a note when the file could not be read."""
        self.thread.join()
        if self.error is not None:
            notes.append("%s not taken: %s" % (self.path, self.error))
        return self.entry


def export_of(nsys, report, path, notes):
    """The path of ``report``'s SQLite export (made anew: one left by an earlier run of the same
    name is not this report's); None, and a note, when nsys made none."""
    try:
        done = subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
                               "--output", path,
                               report], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=STATS_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        notes.append("nsys export failed on %s: %s" % (report, e))
        return None
    if done.returncode != 0 or not os.path.exists(path):
        said = done.stdout.decode(errors="replace").strip()[-300:]
        notes.append("nsys export wrote no SQLite export of %s (exit %d)%s" % (report,
                                                                               done.returncode,
                                                                           ": " + said if said
                                                                               else ""))
        return None
    return path


def ncu_metrics(ncu, reports, notes):
    """Every metric of each ncu report, per kernel (``ncu --import --page raw --csv``), beside
    it."""
    out = []
    for rep in reports:
        path = rep["path"][: -len(".ncu-rep")] + "_ncu_raw.csv"
        try:
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                                   0o600), "wb") as f:
                done = subprocess.run([ncu, "--import", rep["path"], "--page", "raw", "--csv"],
                                      stdout=f, stderr=subprocess.PIPE, timeout=STATS_TIMEOUT)
            entry = hashed(path)
        except (OSError, subprocess.TimeoutExpired) as e:
            notes.append("ncu --import failed on %s: %s" % (rep["path"], e))
            continue
        if done.returncode != 0:
            notes.append("ncu --import failed on %s: %s" % (rep["path"],
                                                            done.stderr.decode(
                                                                errors="replace")[-300:]))
            continue
        out.append(dict(entry, report=rep["path"], summary="ncu_raw"))
    return out


def finish_qdstrm(importer, leftover, notes, timeout=IMPORT_TIMEOUT, own_group=True):
    """The finished report's path, or None; a note says which (:func:`importing`)."""
    report, said = importing(importer, leftover, timeout, own_group)
    notes.append(said)
    return report


def importing(importer, leftover, timeout=IMPORT_TIMEOUT, own_group=True):
    """(the finished report's path or None, the line that says so). The importer runs in a process
    group of its own (``own_group``; else in the caller's, which the caller kills), killed whole at
    ``timeout``."""
    if importer is None:
        return None, "unfinished report %s: no QdstrmImporter found" % leftover
    try:
        proc = subprocess.Popen([importer, "-i", leftover], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=own_group)
    except OSError as e:
        return None, "QdstrmImporter %s cannot run: %s" % (importer, e)
    try:
        said, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL) if own_group else proc.kill()
        proc.communicate()
        return None, "QdstrmImporter did not finish %s within %d s: stopped" % (leftover, timeout)
    report = leftover[: -len(".qdstrm")] + ".nsys-rep"
    if proc.returncode == 0 and os.path.exists(report):
        return report, "finished %s with %s" % (report, importer)
    return None, "QdstrmImporter could not finish %s (exit %s): %s" % (
        leftover, proc.returncode, said.decode(errors="replace").strip()[-300:])
