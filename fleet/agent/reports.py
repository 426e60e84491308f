"""A profiled run's reports on the node: found, hashed and summarized.

Runs ON THE NODE (standard library, Python 3.8), for :mod:`run`. What nsys left away from the
report's name is taken first (:mod:`strays`), and what it left unfinished at the name is finished
with the installation's ``QdstrmImporter`` (:mod:`qdstrm`). Next to each report go its SQLite
export and the CSV summaries fleet keeps (made from that export by :mod:`summaries` as ``nsys
stats`` writes them; ``ncu --import``), hashed like it.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_files as files
    import fleet_agent_node as node
    import fleet_rundir as rundir
    import fleet_agent_summaries as summaries
    import fleet_agent_workload as workload
    from fleet_agent_qdstrm import finish_leftovers
    from fleet_agent_strays import (FULL_LINGER_WAIT, LINGER_WAIT, adopt_strays, found_elsewhere,
                                    stray_qdstrms, wait_for_writers)
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import files, node, summaries, workload
    from .. import rundir
    from .qdstrm import finish_leftovers
    from .strays import (FULL_LINGER_WAIT, LINGER_WAIT, adopt_strays, found_elsewhere,
                         stray_qdstrms, wait_for_writers)

SUMMARIES = rundir.RunDir.NSYS_SUMMARIES  # nsys stats reports kept beside each report
# Each report is exported to NAME.sqlite once; the summaries are made from that export, which is
# kept too, as a report of its own kind, for the cross-rank analysis at home (fleet.analysis.ranks).
EXPORT = "sqlite"
EXPORTS_AT_ONCE = 4  # nsys exports of one run's reports at a time: each is mostly one busy thread
STATS_TIMEOUT = 600.0  # nsys export of a large report takes minutes; one that hangs is given up
# Each summary reads two tables of the export. Made from the whole export they came after it (on an
# H100 test machine, 10 s of small kernels: 5.3 s for the whole export, then 1.2 s for the
# summaries); each made from an export of its own tables, in threads beside the whole export, they
# are made while it is written (the API calls' and kernels' tables alone: 4.3 s together, any
# table's export 0.5 s at least). That is three more nsys exports at once for each report, mostly
# one busy thread each: done where the node has SIDE_EXPORT_CPUS CPUs for each report exported at
# once, else the summaries are made from the whole export, as before.
SIDE_EXPORT_CPUS = 4
# A small report's summaries take little after its export (a few ms for /bin/true's): below this
# size, three more exports would load the report again for nothing.
SIDE_EXPORT_BYTES = 4 << 20
# The tables the summaries read are most of an export (110 of 115 MB for that report of 38 MB), so
# for a while the report's folder holds the export twice: only where it has room for that, eight
# times the report free (an export was three times its report there), and never in memory (tmpfs).
SIDE_EXPORT_ROOM = 8
# what a profiler says when the disk filled
DISK_FULL = tuple(words.encode() for words in workload.DISK_FULL_WORDS)
# bytes: a report's folder with less free when it is taken is full, the report cut
FULL_MARGIN = workload.FULL_MARGIN


def hashed(path):
    """A file the run wrote, as fleet lists it: path, size and sha256, read without following a
    link and made private (:func:`files.open_report`)."""
    h = hashlib.sha256()
    with files.open_report(path) as f:
        size = os.fstat(f.fileno()).st_size
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return {"path": path, "size": size, "sha256": h.hexdigest()}


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


def summarize(nsys, reports, notes):
    """Each report's SQLite export (``nsys export``, once), hashed like the reports, and the
    summaries fleet keeps made from it (:mod:`summaries`) as CSV files beside the report. Each is
    an extra: one that could not be made is named in a note, and never costs the report. The
    reports of one run (a launcher's ranks on one node) are exported EXPORTS_AT_ONCE at a time;
    their entries and notes come back in the reports' order."""
    done = [None] * len(reports)
    at_once = min(len(reports), EXPORTS_AT_ONCE)
    beside = summaries.cpus() >= SIDE_EXPORT_CPUS * at_once

    def one(i):
        try:
            done[i] = summarize_one(nsys, reports[i],
                                    beside and worth_beside(reports[i]["path"]))
        # in a thread: an extra that failed is a note, never a traceback or the report's loss
        except Exception as e:
            done[i] = ([],
                       ["the export and summaries of %s could not be made: "
                        "%s" % (reports[i]["path"], e)])
    for first in range(0, len(reports), at_once or 1):
        summaries.in_threads(one, range(first, min(first + at_once, len(reports))))
    out = []
    for entries, said in done:
        out.extend(entries)
        notes.extend(said)
    return out


def worth_beside(report):
    """Whether the report is large enough for its summaries to be made beside its export, and its
    folder has room for a second export, on a disk."""
    folder = os.path.dirname(report)
    try:
        size, room = os.stat(report).st_size, os.statvfs(folder)
    except OSError:  # gone: its export will say so
        return False
    free = room.f_bavail * room.f_frsize
    return (size >= SIDE_EXPORT_BYTES and free >= SIDE_EXPORT_ROOM * size
            and node.mount_type(os.path.realpath(folder)) not in node.MEMORY_FS)


def summarize_one(nsys, rep, beside=False):
    """(the export and summary entries of one report, the notes of their making). ``beside``: each
    summary is made from an export of its own tables, beside the whole export
    (:func:`summaries_beside`); one that is not is made from the whole export, as it is written."""
    out, notes = [], []
    base = rep["path"][: -len(".nsys-rep")]
    whole = Export(nsys, rep["path"], base + ".sqlite")
    try:
        made = summaries_beside(nsys, rep["path"], base) if beside else {}
    finally:
        export = whole.finished(notes)
    # the summaries not made beside it, to be made from the whole export
    left = tuple(name for name in SUMMARIES if made.get(name, True) is not None)
    failed, exported = {}, None
    if export is not None:
        # The export (hundreds of MB) is hashed while the summaries left are made from it: both
        # only read it.
        hashing = Hashing(export)
        failed = summaries.write(export, left, lambda n: "%s_%s.csv" % (base, n)) if left else {}
        exported = hashing.result(notes)
    for name in SUMMARIES:
        path = "%s_%s.csv" % (base, name)
        if export is None and name in left:  # neither made beside it nor from it: its note says
            continue
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


def summaries_beside(nsys, report, base):
    """Each summary made from an export of only the tables it reads (``nsys export --tables``),
    each in a thread of its own while the whole export is written, into a private folder beside
    the report that is removed after: {summary: None where it was made, else why not}."""
    made = {}
    try:
        folder = tempfile.mkdtemp(prefix=".fleet-summaries-", dir=os.path.dirname(report))
    except OSError:  # no room for it (a quota): every summary from the whole export
        return made
    try:
        def one(name):
            part = Export(nsys, report, os.path.join(folder, name + ".sqlite"),
                          tables=summaries.summary_tables(name))
            said = []
            path = part.finished(said)
            if path is None:
                made[name] = said[0]
                return
            failed = summaries.write(path, (name,), lambda n: "%s_%s.csv" % (base, n))
            made[name] = failed.get(name)
        summaries.in_threads(one, SUMMARIES)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return made


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


class Export:
    """``report``'s SQLite export to ``path``, started at once (made anew: one left by an earlier
    run of the same name is not this report's), of only ``tables`` where given (nsys's patterns,
    each matching whole names, without regard to case)."""

    def __init__(self, nsys, report, path, tables=()):
        self.report, self.path = report, path
        self.until = time.monotonic() + STATS_TIMEOUT  # from its start, however late it is asked
        argv = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true"]
        argv += ["--tables=" + ",".join(tables)] if tables else []
        try:
            self.proc = subprocess.Popen(argv + ["--output", path, report],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT)
        except OSError as e:
            self.proc, self.error = None, e

    def finished(self, notes):
        """The export's path once nsys has ended; None, and a note, when it made none."""
        if self.proc is None:
            notes.append("nsys export failed on %s: %s" % (self.report, self.error))
            return None
        try:
            out, _ = self.proc.communicate(timeout=max(0.0, self.until - time.monotonic()))
        except subprocess.TimeoutExpired as e:
            self.proc.kill()
            self.proc.communicate()
            notes.append("nsys export failed on %s: %s" % (self.report, e))
            return None
        if self.proc.returncode != 0 or not os.path.exists(self.path):
            said = out.decode(errors="replace").strip()[-300:]
            notes.append("nsys export wrote no SQLite export of %s (exit %d)%s"
                         % (self.report, self.proc.returncode, ": " + said if said else ""))
            return None
        return self.path


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
