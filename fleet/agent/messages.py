"""The agent's answers as types: a profile's result read once, on the controller, into dataclasses
(:class:`ProfileResult` and its parts), so that nothing downstream looks into a node's dict.

The node still writes the dict that :data:`wire.RESULT` holds to its shape; this reads it. Reading
never fails: a value not of its type reads as absent, so a result from an older agent, or from a
manifest in the store, reads as well as a fresh answer that :func:`wire.read` checked. Written to the
agent's rules (standard library, Python 3.8; tests/test_bundle.py holds it to them), so that the node
can build the same types: it travels once a shipped module imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

try:
    import fleet_agent_wire as wire
except ImportError:
    from . import wire


class AgentStatus(str, Enum):
    """The agent's word for its run (wire.RESULT_STATUSES)."""
    OK = "ok"
    REFUSED = "refused"
    STOPPED = "stopped"
    NO_REPORT = "no-report"
    ERROR = "error"
    YIELDED = "yielded"
    PROFILER_ERROR = "profiler-error"


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _int(v):
    return v if _is_int(v) else None


def _str(v):
    return v if isinstance(v, str) else None


def _number(v):
    return v if wire.number_or_none(v) is None else None


def _strs(v):
    return tuple(s for s in v if isinstance(s, str)) if isinstance(v, list) else ()


def _dicts(v):
    return [d for d in v if isinstance(d, dict)] if isinstance(v, list) else []


def _dict(v):
    return v if isinstance(v, dict) else {}


@dataclass(frozen=True)
class ReportFile:
    """A file the agent made for fleet to bring home (wire.FILE): a report, an export, a summary."""
    path: str
    size: int | None = None
    sha256: str | None = None
    status: str | None = None
    summary: str | None = None          # the summary's kind (cuda_gpu_kern_sum, ...), None for a report
    truncated: str | None = None        # why the report is cut, None where it is whole
    finished_from_qdstrm: bool = False  # the report finished from the data of a killed profiler

    @classmethod
    def read(cls, d):
        return cls(d["path"], _int(d.get("size")), _str(d.get("sha256")), _str(d.get("status")),
                   _str(d.get("summary")), _str(d.get("truncated")), d.get("finished_from_qdstrm") is True)


@dataclass(frozen=True)
class Running:
    """A workload left running on the node (wire.RUNNING)."""
    pids: tuple
    started: tuple
    boot: str | None
    output: str | None
    session: int | None

    @classmethod
    def read(cls, d):
        pids = d.get("pids")
        return cls(tuple(pids) if isinstance(pids, list) else (),
                   tuple(d["started"]) if isinstance(d.get("started"), list) else (),
                   _str(d.get("boot")), _str(d.get("output")), _int(d.get("session")))


@dataclass(frozen=True)
class Workload:
    """How the wrapped command ended (wire.WORKLOAD): its exit status, or the signal that killed it."""
    exit_status: int | None = None
    signal: str | None = None
    running: Running | None = None

    @classmethod
    def read(cls, d):
        running = d.get("running")
        return cls(_int(d.get("exit_status")), _str(d.get("signal")),
                   Running.read(running) if isinstance(running, dict) else None)


@dataclass(frozen=True)
class Newcomer:
    """Who arrived on the run's GPU while it ran, and what the agent did (wire.NEWCOMER)."""
    gpu: int | None = None
    pid: int | None = None
    user: str | None = None
    used_memory: int | None = None
    unseen: bool = False
    appeared_s: float | None = None
    overlap_s: float | None = None
    action: str | None = None

    @classmethod
    def read(cls, d):
        return cls(_int(d.get("gpu")), _int(d.get("pid")), _str(d.get("user")), _int(d.get("used_memory")),
                   d.get("unseen") is True, _number(d.get("appeared_s")), _number(d.get("overlap_s")),
                   _str(d.get("action")))


@dataclass(frozen=True)
class SampledProcess:
    """A process one of the run watch's samples listed on its GPU; ``own``: below the run's profiler."""
    pid: int
    user: str | None = None
    name: str | None = None
    own: bool | None = None

    @classmethod
    def read(cls, d):
        own = d.get("own")
        return cls(d["pid"], _str(d.get("user")), _str(d.get("name")), own if isinstance(own, bool) else None)


@dataclass(frozen=True)
class Sample:
    """One of the run watch's samples of one GPU: its processes (those with a pid)."""
    gpu: int | None
    processes: tuple

    @classmethod
    def read(cls, d):
        return cls(_int(d.get("gpu")), tuple(SampledProcess.read(p) for p in _dicts(d.get("processes"))
                                             if _is_int(p.get("pid"))))


@dataclass(frozen=True)
class ProfileResult:
    """What an agent said of one run (wire.RESULT), typed. ``said`` is its word as written, ``status``
    that word where fleet knows it (None: an agent's word this fleet does not know)."""
    said: str | None = None
    status: AgentStatus | None = None
    reasons: tuple = ()
    notes: tuple = ()
    given_up: tuple = ()
    reports: tuple = ()             # ReportFile
    summaries: tuple = ()           # ReportFile
    exit_status: int | None = None  # the profiler's (which passes the workload's on)
    stopped: bool = False           # the agent saw fleet's stop
    profiler_errors: tuple = ()
    workload: Workload | None = None
    newcomer: Newcomer | None = None
    samples: tuple = ()             # Sample: the run watch's
    user: str | None = None         # whose run it was (its ``whose``)
    missing_ranks: tuple = ()       # a launcher's ranks that left no report, as the node says
    unfinished: tuple = ()          # a line for each of nsys's data left without its report

    @classmethod
    def read(cls, d):
        said, workload, newcomer = _str(d.get("status")), d.get("workload"), d.get("newcomer")
        return cls(
            said, AgentStatus(said) if said in wire.RESULT_STATUSES else None,
            _strs(d.get("reasons")), _strs(d.get("notes")), _strs(d.get("given_up")),
            _files(d.get("reports")), _files(d.get("summaries")), _int(d.get("exit_status")), d.get("stopped") is True,
            _strs(d.get("profiler_errors")), Workload.read(workload) if isinstance(workload, dict) else None,
            Newcomer.read(newcomer) if isinstance(newcomer, dict) else None,
            tuple(Sample.read(s) for s in _dicts(_dict(d.get("conditions")).get("samples"))),
            _str(_dict(d.get("whose")).get("user")),
            tuple(r for r in d.get("missing_ranks") or [] if _is_int(r) and r >= 0)
            if isinstance(d.get("missing_ranks"), list) else (), _strs(d.get("unfinished")))

    @property
    def made_reports(self):
        """Whether the agent says it made reports to bring home (it ran, or yielded mid-run)."""
        return self.status in (AgentStatus.OK, AgentStatus.YIELDED)


def _files(v):
    return tuple(ReportFile.read(f) for f in _dicts(v) if isinstance(f.get("path"), str))
