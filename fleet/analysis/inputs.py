"""What the cross-rank analysis is given, rank by rank, and the measures both its statistics
(:mod:`.ranks`) and its verdicts (:mod:`.verdict`) take of it: the collectives each rank
reached, the window of work before each, and the rank's GPU. Pure.
"""

from __future__ import annotations

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
    # messages.Sample: the watch's of that GPU
    samples: list = field(default_factory=list)


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
            mine = [(s, e) for s, e, name, tid in p.calls if name == self.sync_call
                    and tid == p.pid]
            return sorted(mine or [(s, e) for s, e, name, _ in p.calls if name == self.sync_call])
        return [(s, e) for s, e, name in p.kernels if name.startswith(NCCL_KERNELS)]


def same_uuid(a: str | None, b: str | None) -> bool:
    """NVML names a GPU ``GPU-c6f60d55-...``; nsys's TARGET_INFO_GPU,
    ``c6f60d55-...`` (H200, nsys 2025.3)."""
    bare = lambda u: str(u).lower().removeprefix("gpu-")  # noqa: E731
    return bool(a and b) and bare(a) == bare(b)


def busy(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
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
        out.append(Window(s - before, len(inside), sum(ke - ks for ks, ke in inside),
                          busy(inside, before, s)))
        before = e
    return out


def gpu_of(r: RankInput) -> dict:
    """The rank's GPU: NVML's index where it is known (:func:`load.node_record`), and the export's
    UUID, model and bus id."""
    g = r.process.gpus[0] if r.process.gpus else Gpu(None, None, None, None)
    return {"index": r.node.gpu_index, "uuid": g.uuid, "name": g.name, "bus": g.bus}
