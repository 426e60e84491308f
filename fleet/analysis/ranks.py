"""Which rank was slow, and why: the cross-rank analysis of one run's exports. Pure: it is given
each rank's traced process (:mod:`.export`) and what fleet saw on its node (:class:`NodeRecord`).

No clock is trusted across ranks. All ranks leave a blocking collective together, so the rank
that waited the *shortest* arrived last: it is that collective's straggler, and every other rank
lost its wait minus the straggler's (rank-seconds lost). Collectives are matched by their order
on each rank. Only durations measured on one rank's own clock are compared (docs/ranks.md).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .export import Gpu, Process

NCCL_KERNELS = ("ncclKernel", "ncclDevKernel")
MORE = 1.2                 # "more": at least this many times the other ranks' median
VERDICT_SHARE = 0.25       # a rank last in at least this share of the collectives gets a verdict


@dataclass
class NodeRecord:
    """What fleet recorded on the rank's node: tenants and the job's processes on its GPUs
    (manifest: processes_seen, tenants_seen; the result's ``conditions``), by GPU index."""
    gpu_index: int | None = None
    tenants: list[str] = field(default_factory=list)          # words, one a tenant
    samples: list[dict] = field(default_factory=list)         # conditions' samples of that GPU


@dataclass
class RankInput:
    label: str                                                # "rank 1"
    rank: int | None
    host: str
    process: Process
    node: NodeRecord = field(default_factory=NodeRecord)


@dataclass
class Source:
    """Where the collectives come from: an NVTX range, blocking calls, or NCCL kernels."""
    sync_range: str | None = None
    sync_call: str | None = None

    def describe(self) -> str:
        if self.sync_range:
            return f"NVTX range {self.sync_range!r}"
        return f"blocking calls {self.sync_call}" if self.sync_call else "NCCL kernels"

    def collectives(self, p: Process) -> list[tuple[int, int]]:
        if self.sync_range:
            return p.range_times(self.sync_range)
        if self.sync_call:
            mine = [(s, e) for s, e, name, tid in p.calls if name == self.sync_call and tid == p.pid]
            return sorted(mine or [(s, e) for s, e, name, _ in p.calls if name == self.sync_call])
        return [(s, e) for s, e, name in p.kernels if name.startswith(NCCL_KERNELS)]


def _busy(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Nanoseconds of [lo, hi) covered by the union of ``intervals`` (sorted by start)."""
    total, reach = 0, lo
    for s, e in intervals:
        s, e = max(s, reach), min(e, hi)
        if e > s:
            total += e - s
            reach = e
    return total


@dataclass
class Window:
    """A rank's time before one collective: since the previous one ended, on its own clock."""
    length: int
    kernels: int
    kernel_ns: int
    busy_ns: int


def windows(p: Process, syncs: list[tuple[int, int]], source: Source) -> list[Window]:
    work = [(s, e) for s, e, name in p.kernels if source.sync_range or source.sync_call
            or not name.startswith(NCCL_KERNELS)]
    first = min([s for s, _ in work] + [s for s, _ in syncs] or [0])
    out, before = [], first
    for s, e in syncs:
        inside = [(ks, ke) for ks, ke in work if before <= ks < s]
        out.append(Window(s - before, len(inside), sum(ke - ks for ks, ke in inside), _busy(inside, before, s)))
        before = e
    return out


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


def rank_stats(r: RankInput, syncs: list[tuple[int, int]], step_range: str | None, gpu: dict) -> RankStats:
    ks = sorted((s, e) for s, e, _ in r.process.kernels)
    span = (ks[0][0], max(e for _, e in ks)) if ks else (0, 0)
    gaps, reach = [0], span[0]
    for s, e in ks:
        gaps.append(max(0, s - reach))
        reach = max(reach, e)
    steps = [(e - s) / 1e9 for s, e in r.process.range_times(step_range)] if step_range else []
    return RankStats(r.label, r.rank, r.host, r.process.pid, gpu, sum(e - s for s, e in ks) / 1e9, len(ks),
                     sum(e - s for s, e in syncs) / 1e9, (span[1] - span[0] - _busy(ks, *span)) / 1e9,
                     max(gaps) / 1e9, len(steps), statistics.median(steps) if steps else None)


def gpu_of(r: RankInput) -> dict:
    """The rank's GPU: NVML's index where it is known (:func:`load.node_record`), and the export's
    UUID, model and bus id."""
    g = r.process.gpus[0] if r.process.gpus else Gpu(None, None, None, None)
    return {"index": r.node.gpu_index, "uuid": g.uuid, "name": g.name, "bus": g.bus}


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
                "ranks": [r.to_json(self.collectives) for r in self.ranks], "verdicts": self.verdicts,
                "per_collective": self.per_collective, "notes": self.notes, "missing": self.missing}


class NoCollectives(LookupError):
    """No collective in the exports: the message says what to name."""


def analyze(inputs: list[RankInput], source: Source, step_range: str | None = "step",
            missing: list[dict] = ()) -> Analysis:
    """The analysis of the ranks given; ``missing``: {"label", "why"} of ranks that left no export."""
    syncs = {r.label: source.collectives(r.process) for r in inputs}
    present = [r for r in inputs if syncs[r.label]]
    notes = [f"{r.label}: no {source.describe()} in its trace; left out" for r in inputs if not syncs[r.label]]
    if len(present) < 2:
        raise NoCollectives(f"no {source.describe()} on two ranks or more"
                            + ("" if source.sync_range or source.sync_call else
                               ": name the workload's sync with --sync-range NAME (an NVTX range) or "
                               "--sync-call NAME (a blocking call, e.g. pthread_cond_wait)"))
    n = min(len(syncs[r.label]) for r in present)
    if any(len(syncs[r.label]) != n for r in present):
        counts = ", ".join(f"{r.label} {len(syncs[r.label])}" for r in present)
        notes.append(f"the ranks reached different numbers of collectives ({counts}): the first {n} compared")
    matched = {r.label: syncs[r.label][:n] for r in present}
    nodes = {r.label: r for r in present}
    gpus = {r.label: gpu_of(r) for r in present}
    stats = {r.label: rank_stats(r, matched[r.label], step_range, gpus[r.label]) for r in present}
    per = []
    for i in range(n):
        waits = {label: (e - s) for label, (s, e) in ((lb, matched[lb][i]) for lb in matched)}
        last = min(waits, key=lambda lb: (waits[lb], lb))
        stats[last].last += 1
        for label, w in waits.items():
            stats[label].lost_s += (w - waits[last]) / 1e9
        per.append({"straggler": last, "waits_s": {lb: w / 1e9 for lb, w in waits.items()}})
    from .verdict import verdicts

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
