"""The parts of a plan that guard and shape the run on the node, besides its command: the last look
at its GPUs before a counter-using profiler starts (:class:`RecheckPart`), the run watch
(:class:`WatchPart`), a time window (:class:`WindowPart`) and the windows the workload opens
(:class:`CapturePart`).

Each is read once from the plan's JSON by its ``from_json``: the node trusts what it is sent no
further than its shape, so a part that is not of its shape reads as absent (None, as a plan without
it) and a field not of its type as its default. ``to_json`` writes each as plans always held it,
and an absent part as ``{}``. Pure and Python 3.8: shipped with the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

try:  # as shipped with the plan, modules travel under flat names
    from fleet_policy_readers import int_of, is_int, str_of
except ImportError:
    from .policy.readers import int_of, is_int, str_of

# the windows the workload opens: an NVTX range, or cudaProfilerStart() to cudaProfilerStop()
CAPTURE_RANGES = ("nvtx", "cudaProfilerApi")


def _gpus(value) -> tuple[int, ...] | None:
    """NVML's indices of the run's GPUs; None (every GPU) where they are not a list of them: a
    check or a watch is never narrowed by what it cannot read."""
    if isinstance(value, list) and all(is_int(i) for i in value):
        return tuple(value)
    return None


def _listed(gpus) -> list | None:
    return list(gpus) if gpus is not None else None


def _part(doc) -> dict | None:
    """The part's JSON object, or None where it is none (not an object, or empty: no part)."""
    return doc if isinstance(doc, dict) and doc else None


def part_json(part) -> dict:
    """A plan's part as the plan writes it: ``{}`` for none."""
    return part.to_json() if part is not None else {}


@dataclass(frozen=True)
class RecheckPart:
    """The last-moment check: the run's GPUs looked at again right before a counter-using profiler
    starts, by the rule the plan was made with (``gpus``: NVML's indices, None: every GPU)."""
    gpus: tuple[int, ...] | None = None
    allow_own: bool = False

    @classmethod
    def from_json(cls, doc) -> "RecheckPart | None":
        doc = _part(doc)
        if doc is None:
            return None
        return cls(_gpus(doc.get("gpus")), doc.get("allow_own") is True)

    def to_json(self) -> dict:
        return {"gpus": _listed(self.gpus), "allow_own": self.allow_own}


@dataclass(frozen=True)
class WatchPart:
    """The run watch: the GPUs watched through the run (None: every GPU), --allow-own, the Slurm
    job the run is in, and whether the run programs counters (it yields to a newcomer)."""
    gpus: tuple[int, ...] | None = None
    allow_own: bool = False
    job: str | None = None
    counters: bool = False

    @classmethod
    def from_json(cls, doc) -> "WatchPart | None":
        doc = _part(doc)
        if doc is None:
            return None
        return cls(_gpus(doc.get("gpus")), doc.get("allow_own") is True, str_of(doc.get("job")),
                   doc.get("counters") is True)

    def to_json(self) -> dict:
        return {"gpus": _listed(self.gpus), "allow_own": self.allow_own, "job": self.job,
                "counters": self.counters}


@dataclass(frozen=True)
class WindowPart:
    """--window START:DURATION: nsys collects DURATION seconds after START and leaves the workload
    on; with --detach the agent leaves it running, its output in ``output`` from its start. ``at``:
    a Slurm rank's, the moment (seconds since the epoch) every rank's window starts. A window
    without a whole START and DURATION is none."""
    start: int
    duration: int
    detach: bool = False
    output: str = ""
    at: int | None = None

    @classmethod
    def from_json(cls, doc) -> "WindowPart | None":
        doc = _part(doc)
        if doc is None or not (is_int(doc.get("start")) and is_int(doc.get("duration"))):
            return None
        return cls(doc["start"], doc["duration"], doc.get("detach") is True,
                   str_of(doc.get("output")) or "", int_of(doc.get("at")))

    def to_json(self) -> dict:
        doc = {"start": self.start, "duration": self.duration, "detach": self.detach,
               "output": self.output}
        if self.at is not None:
            doc["at"] = self.at
        return doc


@dataclass(frozen=True)
class CapturePart:
    """Windows the workload opens (--nvtx-window, --cuda-profiler-window): which (``range``, one of
    CAPTURE_RANGES; a capture of another is none), the NVTX range, how many windows were asked
    (--repeat), and with --detach the file the workload's output goes to."""
    range: str
    nvtx: str | None = None
    repeat: int = 1
    detach: bool = False
    output: str = ""

    @classmethod
    def from_json(cls, doc) -> "CapturePart | None":
        doc = _part(doc)
        if doc is None or doc.get("range") not in CAPTURE_RANGES:
            return None
        repeat = int_of(doc.get("repeat"))
        return cls(doc["range"], str_of(doc.get("nvtx")), repeat if repeat and repeat > 0 else 1,
                   doc.get("detach") is True, str_of(doc.get("output")) or "")

    def to_json(self) -> dict:
        return {"range": self.range, "nvtx": self.nvtx, "repeat": self.repeat,
                "detach": self.detach, "output": self.output}
