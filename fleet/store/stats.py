"""``fleet reports stats``: one run's top kernels, CUDA API calls and NVTX ranges, read from the
summaries its nodes wrote and the store keeps (the CSV files of ``nsys stats`` and
``ncu --import --page raw --csv``), one column per host or rank.

The column names are those nsys 2025.3 and ncu 2025.3 write (tests/fixtures/nsys-2025.3-h200,
tests/fixtures/ncu-raw-h200.csv). A summary may be empty (nsys writes a 0-byte file where a
workload had nothing of its kind, e.g. no NVTX range), may not have come home, or may not be
what fleet expects: each is said in the column's note, and never stops the others being shown.

What is not shown is said too: the hosts or ranks a run has that left nothing to read (refused,
failed, unreachable, missing), with their status and the manifest's reason. A run that left
nothing at all is :class:`NoReports`, whose exit status says so. Kernel names are shown short
(:mod:`fleet.kernelnames`); the full ones stay in ``--json``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from .. import exitcodes, kernelnames
from ..errors import FleetError
from ..hostlist import fold
from . import _inside
from .manifest import HostEntry, RunManifest
from .summary_csv import NCU_NAME, ncu_rows, nsys_rows

# One section of the output per summary: (summary, section, what its rows are, name column, count
# column).
NSYS_SECTIONS = (("cuda_gpu_kern_sum", "kernels", "GPU kernels", "Name", "Instances"),
                 ("cuda_api_sum", "api_calls", "CUDA API calls", "Name", "Num Calls"),
                 ("nvtx_sum", "nvtx_ranges", "NVTX ranges", "Range", "Instances"))
# ncu's raw page: a header row, a units row, one row per profiled kernel launch.
NCU_SECTION = ("ncu_raw", "kernels", "GPU kernels", NCU_NAME, None)


class StatsError(FleetError, LookupError):
    """A run or a host/rank of it that cannot be shown; the message is the one line to print."""
    exit_status = exitcodes.USAGE


class NoReports(StatsError):
    """A run (or the host/rank asked for) that left nothing to read: the line says each host's
    status and why, from the manifest."""
    exit_status = exitcodes.NO_REPORTS


@dataclass
class Column:
    """One host, rank or Ray worker of the run, as a column of the tables."""
    label: str                    # "h02", "rank 3", "worker-node1-123"
    host: str
    rank: int | None
    worker: str | None
    status: str = "ok"            # the host's status in the manifest (its tables are what it kept)
    why: str | None = None        # and the manifest's reason, where it is not ok


@dataclass
class Absent:
    """A host, rank or worker of the run that is not in the tables, and why (the manifest's
    words)."""
    label: str
    host: str
    rank: int | None
    worker: str | None
    status: str
    why: str | None


def absent(h: HostEntry, why: str | None = None) -> Absent:
    return Absent(_label(h), h.host, h.rank, h.worker, h.status,
                  why or h.missing_why or ("no report came home" if h.status == "ok" else None))


def said(entries: list) -> str:
    """``h[03-04] refused (tenant: ...); rank 2 missing (killed)``: one clause for each status
    and reason, its hosts or ranks folded (of Absent entries, or Columns)."""
    groups: dict[tuple[str, str | None], list[str]] = {}
    for e in entries:
        groups.setdefault((e.status, e.why), []).append(e.label)
    return "; ".join(f"{fold(labels)} {status}" + (f" ({why})" if why else "")
                     for (status, why), labels in groups.items())


def nothing_to(manifest: RunManifest, purpose: str, entries: list[Absent]) -> NoReports:
    """The one line for a run that left nothing to ``purpose`` (show, compare)."""
    why = said(entries) if entries else "it has no hosts or ranks"
    if manifest.error:
        why += f"; {manifest.error}"
    tool = manifest.asked.tool or "nsys"
    return (NoReports(f"run {manifest.run_id} ({tool}, {manifest.status}) has no "
                      f"reports to {purpose}: {why}"))


@dataclass
class Section:
    key: str                      # kernels | api_calls | nvtx_ranges (the --json key)
    title: str
    # name -> label -> (total ns, count); rows the top N by their total over the columns
    totals: dict[str, dict[str, tuple[float, int]]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)   # label -> why this column has no rows
    # labels whose summary was read (maybe empty)
    read: set[str] = field(default_factory=set)
    short: dict[str, str] = field(default_factory=dict)   # kernels: full name -> the name shown

    def shown(self, name: str, full: bool = False) -> str:
        return name if full else self.short.get(name, name)

    def top(self, n: int) -> list[tuple[str, dict[str, tuple[float, int]]]]:
        return sorted(self.totals.items(), key=lambda kv: (-sum(t for t, _ in kv[1].values()),
                                                           kv[0]))[:n]


@dataclass
class RunStats:
    run_id: str
    tool: str
    status: str
    columns: list[Column]
    sections: list[Section]
    left_out: list[Absent] = field(default_factory=list)  # the run's hosts not in the tables

    def section(self, key: str) -> Section:
        return next(s for s in self.sections if s.key == key)

    def to_json(self, top: int) -> dict:
        def row(s: Section, name: str, by: dict) -> dict:
            return {"name": name, **({"short_name": s.short[name]} if name in s.short else {}),
                    "total_ns": sum(t for t, _ in by.values()),
                    "by": {label: {"total_ns": t, "count": n} for label, (t, n) in by.items()}}

        return {"run_id": self.run_id, "tool": self.tool, "status": self.status, "top": top,
                "columns": [vars(c) for c in self.columns],
                "left_out": [vars(a) for a in self.left_out],
                **{s.key: {"rows": [row(s, name, by) for name, by in s.top(top)], "notes": s.notes}
                   for s in self.sections}}


def _label(h: HostEntry) -> str:
    return f"rank {h.rank}" if h.rank is not None else (h.worker or h.host)


def _named(manifest: RunManifest, which: str | None) -> list[HostEntry]:
    return [h for h in manifest.hosts if which is None or (which.isdigit() and h.rank == int(which))
            or which in (h.host, h.worker) or h.actor_matches(which)]


def choose_columns(manifest: RunManifest, which: str | None,
                   purpose: str = "show") -> list[HostEntry]:
    """The run's hosts (ranks, workers) that left results, or those ``which`` names: a rank
    number, a host (for Slurm, the node: all its ranks), or a Ray worker. None of them with
    results is :class:`NoReports`, saying what each was."""
    named = _named(manifest, which)
    hosts = [h for h in named if h.reports]
    if which is not None and not named:
        with_reports = [h for h in manifest.hosts if h.reports]
        known = sorted({_label(h) for h in with_reports} | {h.host for h in with_reports})
        raise StatsError(f"run {manifest.run_id} has no host or rank {which!r} with reports"
                         + (f"; it has: {', '.join(known)}" if known
                            else "; no host of it left any"))
    if not hosts:
        raise nothing_to(manifest, purpose, [absent(h) for h in named])
    return hosts


def run_stats(store: Path, manifest: RunManifest, which: str | None = None,
              purpose: str = "show") -> RunStats:
    """The run's tables, one column per host or rank that left reports; NoReports when none did,
    or when not one of its summaries could be read."""
    tool = manifest.asked.tool or "nsys"
    specs = (NCU_SECTION,) if tool == "ncu" else NSYS_SECTIONS
    hosts = choose_columns(manifest, which, purpose)
    sections = [Section(key, title) for _, key, title, _, _ in specs]
    _read_columns(store, hosts, specs, sections)
    # reports, but not one summary to read: say each host's first note
    if not any(s.read for s in sections):
        raise nothing_to(manifest, purpose, [absent(h, next(s.notes[_label(h)] for s in sections))
                                             for h in hosts])
    columns = [Column(_label(h), h.host, h.rank, h.worker, h.status, h.missing_why) for h in hosts]
    left_out = [absent(h) for h in _named(manifest, which) if not h.reports]
    found = RunStats(manifest.run_id, tool, manifest.status, columns, sections, left_out)
    found.section("kernels").short = kernelnames.short_names(found.section("kernels").totals)
    return found


def _read_columns(store: Path, hosts: list[HostEntry], specs, sections: list[Section]) -> None:
    """Each host's summaries into the sections' totals, or a note of why they are not there."""
    for h in hosts:
        label = _label(h)
        stored = {r.summary: r for r in h.reports if r.status == "summary" and r.summary}
        for (summary, _, title, name_col, count_col), section in zip(specs, sections):
            rep = stored.get(summary)
            if rep is None:
                section.notes[label] = f"no {summary} summary was made"
            elif not rep.verified:
                section.notes[label] = (f"its {summary} summary is not in the store "
                                        f"({rep.error or 'not brought home'})")
            # the manifest names a file, the store decides
            elif not _inside(store, Path(rep.stored)):
                section.notes[label] = f"its {summary} summary is named outside the store: not read"
            else:
                try:
                    rows = (ncu_rows(Path(rep.stored)) if summary == "ncu_raw"
                            else nsys_rows(Path(rep.stored), name_col, count_col))
                except (OSError, ValueError, csv.Error) as e:
                    section.notes[label] = f"{Path(rep.stored).name} cannot be read: {e}"
                    continue
                section.read.add(label)
                if not rows:
                    section.notes[label] = f"no {title}"
                for name, (total, count) in rows.items():
                    section.totals.setdefault(name, {})[label] = (total, count)
