"""``fleet reports compare``: two runs of one tool, kernel by kernel, from the summaries in the
store (:mod:`stats` reads them), with what each run's totals leave out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import kernelnames
from .manifest import RunManifest
from .stats import RunStats, StatsError, _label, absent, nothing_to, run_stats, said


@dataclass
class Comparison:
    """``reports compare``: each kernel's total time (over the hosts or ranks) in run A and run
    B, those that changed most first; and what each run's totals leave out."""
    a: RunStats
    b: RunStats
    rows: list[dict]

    def header(self) -> list[str]:
        """Which run is A and which is B, as the columns name them."""
        return [f"{letter}: run {s.run_id} ({s.tool}, {s.status}, {len(s.columns)} host(s) or "
                "rank(s))"
                for letter, s in (("A", self.a), ("B", self.b))]

    def notes(self) -> list[str]:
        """What makes the totals not alike: hosts a run left out, or a
        different number of columns."""
        out = [f"run {s.run_id}: not in its totals: {said(s.left_out)}" for s in (self.a, self.b)
               if s.left_out]
        if len(self.a.columns) != len(self.b.columns):
            out.append(f"run {self.a.run_id} sums {len(self.a.columns)} host(s) or rank(s), "
                       f"run {self.b.run_id} {len(self.b.columns)}")
        return out


def compare_runs(store: Path, a: RunManifest, b: RunManifest) -> Comparison:
    """Runs of one tool only (nsys traces kernels as they run; ncu replays each one with clocks
    locked and caches flushed: their times are not alike), each with kernel summaries to read."""
    tools = [m.asked.tool or "nsys" for m in (a, b)]
    if tools[0] != tools[1]:
        raise StatsError(f"run {a.run_id} is an {tools[0]} run and run {b.run_id} an {tools[1]} "
                         "run: they measure kernels differently (nsys as they run, ncu replayed "
                         f"with clocks locked), so fleet compares runs of one tool")
    found = []
    for m in (a, b):
        s = run_stats(store, m, purpose="compare")
        if not s.section("kernels").read:
            raise nothing_to(m, "compare", [absent(h, s.section("kernels").notes.get(_label(h)))
                                            for h in m.hosts if h.reports] + s.left_out)
        found.append(s)
    totals: dict[str, list[float]] = {}
    for i, s in enumerate(found):
        for name, by in s.section("kernels").totals.items():
            totals.setdefault(name, [0.0, 0.0])[i] += sum(t for t, _ in by.values())
    short = kernelnames.short_names(totals)
    rows = [{"kernel": name, "short_name": short[name], "a_ns": ta, "b_ns": tb, "change_ns": tb
             - ta, "change": (tb - ta) / ta if ta else None} for name, (ta, tb) in totals.items()]
    return Comparison(found[0], found[1],
                      sorted(rows, key=lambda r: (-abs(r["change_ns"]), r["kernel"])))
