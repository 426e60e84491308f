"""The kernel, CUDA API and NVTX summaries of an nsys report, made from its SQLite export.

Runs ON THE NODE (standard library, Python 3.8), for :mod:`reports`. ``nsys stats`` would export
the report to SQLite again and read it once per summary; fleet exports it once (the export comes
home anyway, for the cross-rank analysis) and computes the summaries here, written as
``nsys stats --format csv`` writes them (nsys 2025.3, tests/fixtures/nsys-2025.3-h200): the same
columns, rows in the same order, numbers rounded as nsys's own report queries round them
(:func:`tenths`), and an empty file where the report has nothing of that kind.
tests/test_summaries.py compares them with what ``nsys stats`` wrote on an H200 test machine.
"""

from __future__ import annotations

import array
import bisect
import csv
import decimal
import io
import itertools
import math
import operator
import os
import sqlite3
import threading
import time

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_files as files
    import fleet_agent_sqlitefile as sqlitefile
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import files, sqlitefile

TIMES = "Time (%),Total Time (ns),{count},Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns)"
HEADERS = {
    "cuda_gpu_kern_sum": TIMES.format(count="Instances") + ",Name",
    "cuda_api_sum": TIMES.format(count="Num Calls") + ",Name",
    "nvtx_sum": TIMES.format(count="Instances") + ",Style,Range",
}
# The table each summary needs: a report without it (CUDA or NVTX not traced)
# has nothing of that kind.
TABLES = {"cuda_gpu_kern_sum": "CUPTI_ACTIVITY_KIND_KERNEL",
          "cuda_api_sum": "CUPTI_ACTIVITY_KIND_RUNTIME", "nvtx_sum": "NVTX_EVENTS"}

# A row's duration, NULL where its start or end is not a whole number (SQLite would take 'soon' as
# 0 and make a duration of it): the export is the job's to write, and such a row fails the summary.
WHOLE_DURATION = ("CASE WHEN typeof({start}) = 'integer' AND typeof({end}) = 'integer' THEN {end} "
                  "- {start} END AS dur")
# Each summary's rows as (grp, style, dur), from the rows of its table in {span} (its rowids between
# :lo and :hi, see SPAN): one summary row per (grp, style).
SOURCES = {
    # A kernel by its demangled name (a StringIds id), as nsys stats names it by default.
    "cuda_gpu_kern_sum": "SELECT demangledName AS grp, NULL AS style, "
                         + WHOLE_DURATION.format(start="start", end="end")
                         + " FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE {span}",
    # An API call by its name (a StringIds id).
    "cuda_api_sum": "SELECT nameId AS grp, NULL AS style, "
    + WHOLE_DURATION.format(start="start", end="end")
                    + " FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE {span}",
    # A push/pop (59, 70) or start/end (60, 71) range as DOMAIN:TEXT (":step" in the default
    # domain), its text inline or registered (textId); one never ended lasts
    # until the last event (:last).
    "nvtx_sum": "WITH domains AS (SELECT domainId AS id, globalTid AS tid, text AS name, "
                "min(start) FROM NVTX_EVENTS WHERE eventType = 75 GROUP BY 1, 2) "
                "SELECT coalesce(d.name, '') || ':' || coalesce(s.value, e.text) AS grp, "
                "CASE WHEN e.eventType IN (59, 70) THEN 'PushPop' ELSE 'StartEnd' END AS style, "
                + WHOLE_DURATION.format(start="e.start", end="coalesce(e.end, :last)") +
                " FROM NVTX_EVENTS AS e LEFT JOIN domains AS d ON e.domainId = d.id "
                "AND (e.globalTid & 0x0000FFFFFF000000) = (d.tid & 0x0000FFFFFF000000) "
                "LEFT JOIN StringIds AS s ON s.id = e.textId "
                "WHERE e.eventType IN (59, 60, 70, 71) AND {span}",
}
LAST_EVENT = "SELECT max(max(start), max(coalesce(end, start))) FROM NVTX_EVENTS"
# Where a span's rows are: between two rowids, or (a table without rowids) the whole table.
SPAN = {"cuda_gpu_kern_sum": "rowid", "cuda_api_sum": "rowid", "nvtx_sum": "e.rowid"}
WHOLE = None
# Each distinct duration of a group once, with how often it occurs, in order: one sort in SQLite (a
# run of small kernels has millions of rows, and far fewer distinct durations), the rest exact.
DISTINCT = ("SELECT grp, style, dur, count(*) FROM ({source}) GROUP BY grp, style, "
            "dur ORDER BY grp, style, dur")
# That sort is most of a summary's time (3.4 s for the API calls of 30 s of small kernels, seen on
# an H200 test machine), and SQLite sorts in one thread: a large table is cut into spans of rowids,
# each sorted and read whole in a thread of its own (SQLite works without the interpreter's lock; a
# span only sorted there, then read in one thread, left half of SQLite's work and a merge of every
# row in Python in that one thread: 2.2 and 1.9 s for 2.5 million API calls on a 2-core VM). A
# group's runs from several spans are never merged row by row: their sums and the median come from
# their counts (:class:`Group`). Below SPAN_ROWS rows a table is one span; no summary takes more
# than MAX_SPANS; no more sorts run at once than the CPUs we may use.
SPAN_ROWS = 200000
MAX_SPANS = 8
# The time all of one export's summaries may take together (30 s of small kernels: 3.4 s, above);
# past it, each summary not yet made is a note, never a job held until its time limit.
READ_S = 600.0


def open_export(path, until):
    """The export, read only, as hostile input (:mod:`sqlitefile`): fleet never changes what nsys
    wrote, and on Slurm the workload could have put another file in its place. Every query of it
    is interrupted at ``until`` (``time.monotonic()``)."""
    db = sqlitefile.untrusted(sqlite3.connect(sqlitefile.uri(path), uri=True))
    sqlitefile.deadline(db, until)
    return db


def summary_tables(summary):
    """The tables a summary reads: its own, and StringIds for the names."""
    return (TABLES[summary], "StringIds")


class Run:
    """One group's distinct durations in one span, in order, with how often each occurs and how many
    occur up to it (as arrays of 64-bit integers where they fit: a few bytes each, summed in C)."""

    def __init__(self, rows):
        self.durations = _array([r[2] for r in rows])
        self.counts = _array([r[3] for r in rows])
        self.upto = _array(itertools.accumulate(self.counts))

    def at_most(self, d):
        """How many of this span's durations are ``d`` or shorter."""
        i = bisect.bisect_right(self.durations, d)
        return self.upto[i - 1] if i else 0


def _array(values):
    values = list(values)
    try:
        return array.array("q", values)
    # a duration past 64 bits, or not a whole number: kept as it is
    except (TypeError, OverflowError):
        return values


class Group:
    """One summary row in the making: a group's runs, one from each span it has rows in."""

    def __init__(self, grp, style, runs):
        self.grp, self.style, self.runs = grp, style, runs

    def nth(self, k):
        """The k-th shortest duration, from 1: a span alone reads it off its counts; several spans,
        the shortest duration with k or more at most as long, found by halving: among whole numbers
        between the shortest and the longest (it is one of the durations: the count changes only at
        them), else among the durations themselves."""
        if len(self.runs) == 1:
            run = self.runs[0]
            return run.durations[bisect.bisect_left(run.upto, k)]
        whole = all(isinstance(r.durations, array.array) for r in self.runs)
        values = None if whole else sorted(set(itertools.chain.from_iterable(r.durations
                                                                             for r in self.runs)))
        lo, hi = (min(r.durations[0] for r in self.runs),
                  max(r.durations[-1] for r in self.runs)) if whole \
            else (0, len(values) - 1)
        while lo < hi:
            mid = (lo + hi) // 2
            if sum(r.at_most(mid if whole else values[mid]) for r in self.runs) >= k:
                hi = mid
            else:
                lo = mid + 1
        return lo if whole else values[lo]

    def stats(self):
        """(total, count, mean, median, min, max, sample standard deviation), the sums exact."""
        n = sum(r.upto[-1] for r in self.runs)
        total = sum(sum(map(operator.mul, r.durations, r.counts)) for r in self.runs)
        squares = sum(sum(map(operator.mul, map(operator.mul, r.durations, r.durations), r.counts))
                      for r in self.runs)
        # the middle one, or the middle two's mean
        median = (self.nth((n + 1) // 2) + self.nth((n + 2) // 2)) / 2
        stdev = math.sqrt((n * squares - total * total) / (n * (n - 1))) if n > 1 else 0.0
        low, high = min(r.durations[0] for r in self.runs), max(r.durations[-1] for r in self.runs)
        return total, n, total / n, median, low, high, stdev


def spans(db, table, threads):
    """The rowid spans (lo, hi) of ``table`` to sort apart, at most ``threads`` of them; [WHOLE]
    for a table without rowids."""
    try:
        lo, hi = db.execute('SELECT min(rowid), max(rowid) FROM "%s"' % table).fetchone()
    except sqlite3.OperationalError:  # WITHOUT ROWID
        return [WHOLE]
    if lo is None:
        return []
    n = max(1, min(threads, MAX_SPANS, (hi - lo + 1) // SPAN_ROWS))
    step = -(-(hi - lo + 1) // n)
    return [(a, min(a + step - 1, hi)) for a in range(lo, hi + 1, step)]


def sqlite_order(key):
    """A (grp, style) group's place as SQLite orders it: NULL, numbers, text, then blobs."""
    return tuple((0, 0) if v is None else (1, v) if isinstance(v, (int, float)) else (2, v)
                 if isinstance(v, str)
                 else (3, v) for v in key)


class SortedSpan:
    """One span's distinct durations by group, sorted and read by SQLite in the thread that makes it
    (all of SQLite's work on the span, which runs without the interpreter's lock), kept as a
    :class:`Run` for each group."""

    def __init__(self, export, summary, span, last, until):
        self.runs, self.error = {}, None
        self.args = (export, summary, span, last, until)

    def sort(self):
        export, summary, span, last, until = self.args
        where = "1" if span is WHOLE else "%s BETWEEN :lo AND :hi" % SPAN[summary]
        lo, hi = span if span is not WHOLE else (None, None)
        try:
            with SLOTS:
                db = open_export(export, until)
                try:
                    cursor = db.execute(DISTINCT.format(source=SOURCES[summary].format(span=where)),
                                        {"lo": lo, "hi": hi, "last": last})
                    for key, rows in itertools.groupby(cursor, key=operator.itemgetter(0, 1)):
                        rows = list(rows)
                        # NULL sorts first: a row whose start or end is no integer
                        if rows[0][2] is None:
                            raise ValueError("%s: a start or end that is not "
                                             "an integer" % TABLES[summary])
                        self.runs[key] = Run(rows)
                finally:
                    db.close()
        except Exception as e:  # a thread's error is the summary's, never a traceback of its own
            self.error = e


def groups(export, db, summary, threads, until):
    """The summary's groups in SQLite's order of them, each with its runs of distinct durations;
    the threads' queries interrupted at ``until`` as ``db``'s are."""
    last = db.execute(LAST_EVENT).fetchone()[0] if summary == "nvtx_sum" else None
    parts = [SortedSpan(export, summary, span, last, until) for span in spans(db, TABLES[summary],
                                                                              threads)]
    workers = [threading.Thread(target=p.sort) for p in parts[1:]]
    for w in workers:
        w.start()
    if parts:
        parts[0].sort()
    for w in workers:
        w.join()
    for p in parts:
        if p.error is not None:
            raise p.error
    keys = sorted(set().union(*(p.runs for p in parts)), key=sqlite_order)
    return [Group(grp, style, [p.runs[(grp, style)] for p in parts if (grp, style) in p.runs])
            for grp, style in keys]


def names(db, summary, grps):
    """What each group is called in the summary: kernels by their demangled name, API calls by
    theirs without a six-character version suffix (cudaMalloc_v3020 is cudaMalloc,
    cuGetProcAddress_v2 and cudaOccupancyAvailableDynamicSMemPerBlock_v10200 stay whole, as nsys
    2025.3 writes them), NVTX ranges by their DOMAIN:TEXT."""
    if summary == "nvtx_sum":
        return {g: g for g in grps}
    ids = [g for g in grps if g is not None]
    found = {}
    for i in range(0, len(ids), 500):  # SQLite's limit on the number of parameters, kept well under
        chunk = ids[i:i + 500]
        found.update(db.execute("SELECT id, value FROM StringIds WHERE id IN (%s)" % ",".join(
            "?" * len(chunk)), chunk))
    if summary == "cuda_api_sum":
        found = {k: v[:-6] if v[-6:-4] == "_v" else v for k, v in found.items()}
    return found


def tenths(x):
    """``x`` rounded to one decimal as nsys's report queries round it, with SQLite's ``round(x, 1)``
    since SQLite 3.43: from the exact value of the double, a half away from zero. 256095 / 300 is
    853.6 (the double is just under 853.65; SQLite 3.40 said 853.7, nsys 2025.3 on an H200 853.6),
    and an exact half, as 0.25, goes to 0.3 (SQLite's printf rounds its digits half up; Python's
    round says 0.2). The node's own SQLite may be older: it is not asked."""
    if x is None:
        return None
    with decimal.localcontext() as context:
        context.prec = 40
        return float(decimal.Decimal(x).quantize(decimal.Decimal("0.1"),
                                                 rounding=decimal.ROUND_HALF_UP))


def rows_of(export, db, summary, threads, until):
    """The summary's rows as nsys stats writes them, in its order: total time down, then count up,
    then name; an empty list where the export has nothing of this kind. A table it reads that is
    no stored table (a view, a virtual table...) raises :class:`sqlitefile.Refused`."""
    found = sqlitefile.plain_tables(db, summary_tables(summary))
    if TABLES[summary] not in found:
        return []
    if "StringIds" not in found:
        raise sqlitefile.Refused("no StringIds table: not an nsys export")
    grps = groups(export, db, summary, threads, until)
    called = names(db, summary, [g.grp for g in grps])
    stats = [g.stats() for g in grps]
    everything = sum(s[0] for s in stats)
    out = []
    for g, (total, n, mean, median, low, high, stdev) in zip(grps, stats):
        share = total * 100.0 / everything if everything else None
        rounded = [tenths(x) for x in (share, mean, median, stdev)]
        out.append([rounded[0], total, n, rounded[1], rounded[2], low, high, rounded[3]] +
                   ([g.style] if summary == "nvtx_sum" else []) + [called.get(g.grp)])
    out.sort(key=lambda r: (-r[1], r[2], r[-1] or ""))
    return out


def csv_text(summary, rows):
    """The CSV nsys stats writes: its header and rows, or nothing at all for no rows."""
    if not rows:
        return ""
    text = io.StringIO()
    text.write(HEADERS[summary] + "\n")
    csv.writer(text, lineterminator="\n").writerows(rows)
    return text.getvalue()


def write(export, summaries, path_of):
    """Each of ``summaries`` of the SQLite file ``export``, written (privately, whole) to
    ``path_of(summary)``, each in a thread of its own, its large tables sorted in up to as many
    more as the node has CPUs for us (:data:`SPAN_ROWS`, :data:`MAX_SPANS`: the NVTX table is
    mostly small, so the kernels and API calls each get them all). Returns {summary: the error
    that kept it from being made}."""
    failed = {}
    try:
        # a named pipe would hold every summary's open for ever
        sqlitefile.check_regular_file(export)
    except sqlitefile.Refused as e:
        return dict((name, e) for name in summaries)
    threads = cpus()
    until = time.monotonic() + READ_S

    def one(name):
        try:
            db = open_export(export, until)
            try:
                text = csv_text(name, rows_of(export, db, name, threads, until))
            finally:
                db.close()
            files.write_private(path_of(name), text)
        except Exception as e:  # a summary that cannot be made is a note, never the report's loss
            failed[name] = TimeoutError("read for longer than %d s: stopped" % READ_S) \
                if sqlitefile.interrupted(e) else e
    in_threads(one, summaries)
    return failed


def in_threads(work, items):
    """``work(item)`` for each of ``items``, each in a thread of its own: all started, then all
    waited for. The one way the node's extras (exports, summaries) run side by side."""
    workers = [threading.Thread(target=work, args=(item,)) for item in items]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def cpus():
    """The CPUs this process may use: its affinity (a Slurm job's), less a cgroup v2 quota
    (``cpu.max``, as ``docker --cpus`` sets it), at least one."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(1, n)


# The one semaphore of all the sorts this process runs at once (several reports' summaries, each in
# spans): as many as it may use CPUs.
SLOTS = threading.BoundedSemaphore(cpus())
