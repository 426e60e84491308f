"""``fleet top --record FILE`` read as "the node's record" of a run, for ``reports ranks --record``:
the clocks, throttle reasons and processes the look sampled on each host's GPUs, matched to each
rank by its host, its GPU and the time it ran, beside what fleet's own watch recorded in the run.

A run profiled without fleet's watch of the GPU (a rank from before it, an nsys started by hand
and gathered, a job fleet only gathered) has no conditions of its own; a look kept running beside
it has them. A rank's samples are those of its host and GPU (NVML's index where the run knows it,
else the GPU's UUID from the export) whose node time falls within the rank's traced span: the
export's session start plus its first and last event. Both clocks are the node's.

The record is a file: read bounded (RECORD_BYTES), each line held to the shape ``fleet top``
writes, a line that is not is skipped and counted. The export's times only choose among the
user's own samples.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FleetError
from .export import Process
from .inputs import RankInput, same_uuid

RECORD_BYTES = 256 << 20  # a day of 64 hosts at 1 Hz is a few GB: past this, the record is refused
NS = 1_000_000_000


class RecordError(FleetError, ValueError):
    """The record cannot be read; the message is one line."""


@dataclass
class RecordSample:
    host: str
    time: float                    # the node's clock, seconds since the epoch
    index: int
    uuid: str | None
    conditions: dict
    processes: list[dict]

    def as_watched(self) -> dict:
        """The sample in the shape fleet's watch records a run's conditions (agent/watch.py)."""
        return {"t": self.time, "gpu": self.index, **self.conditions, "from": "record",
                "processes": [{"pid": p.get("pid"), "user": p.get("user"), "own": p.get("foreign") is False}
                              for p in self.processes if isinstance(p, dict)]}


@dataclass
class Record:
    path: str
    samples: list[RecordSample] = field(default_factory=list)
    skipped: int = 0


def _gpu_samples(line: dict) -> list[RecordSample]:
    """A line's GPUs as samples; [] where the line is not of top's shape."""
    host, when, gpus = line.get("host"), line.get("time"), line.get("gpus")
    if not (isinstance(host, str) and isinstance(when, (int, float)) and not isinstance(when, bool)
            and math.isfinite(when) and isinstance(gpus, list)):
        return []
    found = []
    for g in gpus:
        if not (isinstance(g, dict) and isinstance(g.get("index"), int) and isinstance(g.get("conditions"), dict)
                and isinstance(g.get("processes"), list)):
            return []
        uuid = g.get("uuid") if isinstance(g.get("uuid"), str) else None
        found.append(RecordSample(host, float(when), g["index"], uuid, g["conditions"], g["processes"]))
    return found


def read(path: str) -> Record:
    """Every sample of the record at ``path``."""
    try:
        with open(path, "rb") as f:
            data = f.read(RECORD_BYTES + 1)
    except OSError as e:
        raise RecordError(f"--record {path}: {e.strerror}") from None
    if len(data) > RECORD_BYTES:
        raise RecordError(f"--record {path}: more than {RECORD_BYTES >> 20} MiB: keep the look's record of the run alone")
    record = Record(path)
    for raw in data.splitlines():
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError):
            line = None
        found = _gpu_samples(line) if isinstance(line, dict) else []
        record.samples += found
        record.skipped += not found and bool(raw.strip())
    return record


def span_s(p: Process) -> tuple[float, float] | None:
    """The node times (seconds) the process was traced doing anything, or None without its session's start."""
    events = [(s, e) for s, e, _ in p.kernels] + [(s, e) for s, e, _, _ in p.ranges] + \
             [(s, e) for s, e, _, _ in p.calls]
    if p.epoch_ns is None or not events:
        return None
    return (p.epoch_ns + min(s for s, _ in events)) / NS, (p.epoch_ns + max(e for _, e in events)) / NS


def _same_gpu(sample: RecordSample, r: RankInput) -> bool:
    if r.node.gpu_index is not None:
        return sample.index == r.node.gpu_index
    uuid = r.process.gpus[0].uuid if r.process.gpus else None
    return same_uuid(sample.uuid, uuid)


def fold(record: Record, ranks: list[RankInput]) -> str:
    """Each rank's samples of the record added to what fleet recorded on its node, and the
    tenants they show to its tenants; what was matched, as a note."""
    matched = 0
    for r in ranks:
        span = span_s(r.process)
        mine = [s for s in record.samples if span and s.host == r.host and span[0] <= s.time <= span[1]
                and _same_gpu(s, r)]
        r.node.samples += [s.as_watched() for s in mine]
        for s in mine:
            for q in s.processes:
                if isinstance(q, dict) and q.get("foreign") is True:
                    who = f"pid {q.get('pid')} ({q.get('user') or 'unknown user'})"
                    r.node.tenants += [] if who in r.node.tenants else [who]
        matched += bool(mine)
    skipped = f"; {record.skipped} line(s) not of fleet top's shape skipped" if record.skipped else ""
    return (f"the node's record {Path(record.path).name}: {len(record.samples)} GPU sample(s), matched to "
            f"{matched} of {len(ranks)} rank(s) by host, GPU and time{skipped}")
