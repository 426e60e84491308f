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
from typing import Any

from ..agent.messages import Conditions, Sample, SampledProcess
from ..errors import FleetError
from ..policy.readers import str_of
from .export import Process
from .inputs import RankInput, same_uuid

RECORD_BYTES = 256 << 20  # a day of 64 hosts at 1 Hz is a few GB: past this, the record is refused
NS = 1_000_000_000


class RecordError(FleetError, ValueError):
    """The record cannot be read; the message is one line."""


@dataclass(frozen=True)
class RecordProcess:
    """A process the look saw on a GPU: its pid, its user where the line says one, and whether
    the look called it another's (``foreign: true``; anything else is not)."""
    pid: int
    user: str | None = None
    foreign: bool = False

    @classmethod
    def read(cls, doc: Any) -> "RecordProcess | None":
        """The process a line lists; None for what is not one with a pid."""
        if not (isinstance(doc, dict) and isinstance(doc.get("pid"), int)):
            return None
        return cls(doc["pid"], str_of(doc.get("user")), doc.get("foreign") is True)


@dataclass(frozen=True)
class RecordSample:
    host: str
    time: float                    # the node's clock, seconds since the epoch
    index: int
    uuid: str | None
    conditions: Conditions
    processes: tuple[RecordProcess, ...]

    @classmethod
    def read(cls, host: str, when: float, gpu: Any) -> "RecordSample | None":
        """One GPU of the line ``host`` wrote at ``when``; None for one not of top's shape (its
        processes that are not, left out)."""
        if not (isinstance(gpu, dict) and isinstance(gpu.get("index"), int)
                and isinstance(gpu.get("conditions"), dict)
                and isinstance(gpu.get("processes"), list)):
            return None
        seen = (RecordProcess.read(q) for q in gpu["processes"])
        return cls(host, when, gpu["index"], str_of(gpu.get("uuid")),
                   Conditions.read(gpu["conditions"]), tuple(q for q in seen if q is not None))

    def as_watched(self) -> Sample:
        """The sample as fleet's watch records a run's conditions (agent/watch.py)."""
        processes = tuple(SampledProcess(q.pid, q.user, own=not q.foreign)
                          for q in self.processes)
        return Sample(self.index, processes, self.time, self.conditions)


@dataclass
class Record:
    path: str
    samples: list[RecordSample] = field(default_factory=list)
    skipped: int = 0


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value) if math.isfinite(value) else None
    except OverflowError:  # an integer past a double
        return None


def _gpu_samples(line: dict) -> list[RecordSample] | None:
    """A line's GPUs as samples, the line's reader; [] for a line that holds none (a host's error,
    no GPU); None for a line not of top's shape."""
    host, when, gpus = line.get("host"), _number(line.get("time")), line.get("gpus")
    if line.get("error") is not None or gpus == []:
        return []
    if not (isinstance(host, str) and when is not None and isinstance(gpus, list)):
        return None
    found = [RecordSample.read(host, when, g) for g in gpus]
    return None if any(s is None for s in found) else found


def read(path: str) -> Record:
    """Every sample of the record at ``path``."""
    try:
        with open(path, "rb") as f:
            data = f.read(RECORD_BYTES + 1)
    except OSError as e:
        raise RecordError(f"--record {path}: {e.strerror}") from None
    if len(data) > RECORD_BYTES:
        raise RecordError(f"--record {path}: more than {RECORD_BYTES >> 20} MiB: "
                          "keep the look's record of the run alone")
    record = Record(path)
    for raw in data.splitlines():
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError):
            line = None
        found = _gpu_samples(line) if isinstance(line, dict) else None
        record.samples += found or []
        record.skipped += found is None and bool(raw.strip())
    return record


def span_s(p: Process) -> tuple[float, float] | None:
    """The node times (seconds) the process was traced doing anything, or None
    without its session's start."""
    events = [(s, e) for s, e, _ in p.kernels] + [(s, e) for s, e, _, _ in p.ranges] + \
             [(s, e) for s, e, _, _ in p.calls]
    if p.epoch_ns is None or not events:
        return None
    return (p.epoch_ns + min(s for s, _ in events)) / NS, (p.epoch_ns
                                                           + max(e for _, e in events)) / NS


def _same_gpu(sample: RecordSample, r: RankInput) -> bool:
    if r.node.gpu_index is not None:
        return sample.index == r.node.gpu_index
    uuid = r.process.gpus[0].uuid if r.process.gpus else None
    return same_uuid(sample.uuid, uuid)


def _rank_samples(record: Record, r: RankInput) -> list[RecordSample]:
    """The record's samples of the rank's host and GPU taken while it was traced
    (none without its span)."""
    span = span_s(r.process)
    return [s for s in record.samples if span and s.host == r.host and span[0] <= s.time <= span[1]
            and _same_gpu(s, r)]


def _add_tenants(r: RankInput, mine: list[RecordSample], owner: str) -> None:
    """The other users' processes the rank's samples show, added once each to its node's tenants."""
    for q in (q for s in mine for q in s.processes):
        who = f"pid {q.pid} ({q.user or 'unknown user'})"
        if q.foreign and q.user != owner and q.pid != r.process.pid and who not in r.node.tenants:
            r.node.tenants.append(who)


def fold(record: Record, ranks: list[RankInput], owner: str) -> str:
    """Each rank's samples of the record, where fleet recorded none on its node, and the other
    users' processes they show as its tenants; what was matched, as a note. ``owner``: the run's
    user. Whether a process is another's the look said from where it ran (an admin's look calls
    every user's process foreign): the run's own user's, and the rank's own
    pid, are never tenants."""
    matched = 0
    for r in ranks:
        mine = _rank_samples(record, r)
        if not mine or r.node.samples:  # fleet's own watch of the GPU, where it ran, is the record
            continue
        r.node.samples += [s.as_watched() for s in mine]
        _add_tenants(r, mine, owner)
        matched += 1
    skipped = (f"; {record.skipped} line(s) not of fleet top's shape skipped" if record.skipped
               else "")
    return (f"the node's record {Path(record.path).name}: {len(record.samples)} GPU sample(s), "
            f"matched to {matched} of {len(ranks)} rank(s) by host, GPU and time{skipped}")
