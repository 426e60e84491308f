"""Which rank was slow, and why: the cross-rank analysis of one run's exports. Pure: it is given
each rank's traced process (:mod:`.export`) and what fleet saw on its node (:class:`NodeRecord`).

No clock is trusted across ranks. All ranks leave a blocking collective together, so the rank
that waited the *shortest* arrived last: it is that collective's straggler, and every other rank
lost its wait minus the straggler's (rank-seconds lost). Collectives are matched by their order
on each rank. Only durations measured on one rank's own clock are compared (docs/ranks.md).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..errors import FleetError

from .inputs import NodeRecord, RankInput, Source, busy, gpu_of
from .verdict import verdicts

__all__ = ["NodeRecord", "RankInput", "Source", "RankStats", "Analysis", "NoCollectives", "analyze",
           "gpu_of"]


@dataclass
class RankStats:
    label: str
    rank: int | None
    host: str
    pid: int
    gpu: dict
    kernel_s: float
    kernels: int
    collective_s: float
    idle_s: float              # the GPU idle between the rank's first and last kernel
    largest_gap_s: float
    steps: int
    step_median_s: float | None
    lost_s: float = 0.0        # its waits beyond each collective's straggler's
    last: int = 0              # how many collectives it arrived last at

    def to_json(self, collectives: int) -> dict:
        return dict(vars(self), last_share=self.last / collectives if collectives else None)


def rank_stats(r: RankInput, syncs: list[tuple[int, int]], step_range: str | None,
               gpu: dict) -> RankStats:
    ks = sorted((s, e) for s, e, _ in r.process.kernels)
    span = (ks[0][0], max(e for _, e in ks)) if ks else (0, 0)
    gaps, reach = [0], span[0]
    for s, e in ks:
        gaps.append(max(0, s - reach))
        reach = max(reach, e)
    steps = [(e - s) / 1e9 for s, e in r.process.range_times(step_range)] if step_range else []
    return RankStats(r.label, r.rank, r.host, r.process.pid, gpu, sum(e - s for s, e in ks) / 1e9,
                     len(ks),
                     sum(e - s for s, e in syncs) / 1e9,
                     (span[1] - span[0] - busy(ks, *span)) / 1e9,
                     max(gaps) / 1e9, len(steps), statistics.median(steps) if steps else None)


@dataclass
class Analysis:
    source: str
    collectives: int
    ranks: list[RankStats]
    per_collective: list[dict]           # {"straggler": label, "waits_s": {label: s}}
    verdicts: list[dict]
    notes: list[str]
    missing: list[dict]
    timeline: dict                       # label -> {"offset_ns", "syncs", "steps"} for the picture

    @property
    def lost_s(self) -> float:
        return sum(r.lost_s for r in self.ranks)

    def to_json(self) -> dict:
        return {"source": self.source, "collectives": self.collectives, "lost_s": self.lost_s,
                "straggler": self.verdicts[0]["rank"] if self.verdicts else None,
                "ranks": [r.to_json(self.collectives) for r in self.ranks],
                "verdicts": self.verdicts,
                "per_collective": self.per_collective, "notes": self.notes, "missing": self.missing}


class NoCollectives(FleetError, LookupError):
    """No collective in the exports: the message says what to name."""


def _two_or_more(present: list[RankInput], source: Source) -> None:
    """Refuse fewer than two ranks with a collective, saying how to name the sync
    where none was named."""
    if len(present) < 2:
        raise NoCollectives(f"no {source.describe()} on two ranks or more"
                            + ("" if source.sync_range or source.sync_call else
                               ": name the workload's sync with --sync-range NAME (an NVTX range) "
                               "or --sync-call NAME (a blocking call, e.g. pthread_cond_wait)"))


def _compared(present: list[RankInput], syncs: dict, notes: list[str]) -> int:
    """How many collectives are compared: the fewest any rank reached (a note where they differ)."""
    n = min(len(syncs[r.label]) for r in present)
    if any(len(syncs[r.label]) != n for r in present):
        counts = ", ".join(f"{r.label} {len(syncs[r.label])}" for r in present)
        notes.append("the ranks reached different numbers of collectives "
                     f"({counts}): the first {n} compared")
    return n


def _per_collective(matched: dict, stats: dict, n: int) -> list[dict]:
    """Each collective's straggler (the shortest wait) and waits; counts it last
    and the others' losses."""
    per = []
    for i in range(n):
        waits = {label: (e - s) for label, (s, e) in ((lb, matched[lb][i]) for lb in matched)}
        last = min(waits, key=lambda lb: (waits[lb], lb))
        stats[last].last += 1
        for label, w in waits.items():
            stats[label].lost_s += (w - waits[last]) / 1e9
        per.append({"straggler": last, "waits_s": {lb: w / 1e9 for lb, w in waits.items()}})
    return per


def analyze(inputs: list[RankInput], source: Source, step_range: str | None = "step",
            missing: list[dict] = ()) -> Analysis:
    """The analysis of the ranks given; ``missing``: {"label", "why"} of
    ranks that left no export."""
    syncs = {r.label: source.collectives(r.process) for r in inputs}
    present = [r for r in inputs if syncs[r.label]]
    notes = [f"{r.label}: no {source.describe()} in its trace; left out" for r in inputs
             if not syncs[r.label]]
    _two_or_more(present, source)
    n = _compared(present, syncs, notes)
    matched = {r.label: syncs[r.label][:n] for r in present}
    gpus = {r.label: gpu_of(r) for r in present}
    stats = {r.label: rank_stats(r, matched[r.label], step_range, gpus[r.label]) for r in present}
    per = _per_collective(matched, stats, n)
    found = verdicts(present, matched, stats, gpus, source, n, list(missing), per)
    return Analysis(source.describe(), n, list(stats.values()), per, found, notes, list(missing),
                    timeline(present, matched, step_range))


def timeline(present: list[RankInput], matched: dict, step_range: str | None) -> dict:
    """Each rank's syncs and steps for the picture, shifted onto the first rank's clock by the
    median difference of the collectives' ends (all ranks leave together): for drawing only."""
    ref = matched[present[0].label]
    out = {}
    for r in present:
        mine = matched[r.label]
        offset = int(statistics.median(re - me for (_, re), (_, me) in zip(ref, mine)))
        steps = r.process.range_times(step_range) if step_range else []
        out[r.label] = {"offset_ns": offset, "syncs": mine, "steps": steps}
    return out
