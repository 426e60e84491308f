"""The records a manifest is made of, read back from its JSON: only a record's own keys are
taken (the others keep their defaults), and what is not a JSON object is a ``ManifestError``. The
small ones live here (a report brought home, a process seen on a GPU), and what a run asked for
(``Asked``), read once from the request it keeps; a run's id."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..errors import FleetError
from . import numbers
from ..policy.readers import int_of, ints_of, str_of, strs_of


def new_run_id() -> str:
    """A run's id: when it began, and four hex digits against two runs in one second."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


class ManifestError(FleetError, ValueError):
    """A manifest fleet cannot read: not one, or written by a newer fleet."""


def known_fields(cls, doc: Any, what: str) -> dict:
    """The keys of ``doc`` that are fields of ``cls`` (the others take their defaults)."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{what} is not a JSON object: {doc!r:.80}")
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in doc.items() if k in names}


class Record:
    """A dataclass that reads its JSON back, keeping only its own keys."""
    WHAT = "a record"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict):
        return cls(**known_fields(cls, doc, cls.WHAT))


@dataclass
class ReportEntry(Record):
    """One report or summary brought home (``fetch.fetch_verified``), or one that was not."""
    remote: str = ""                      # its path on the node
    stored: str = ""                      # its path in the store
    size: int | None = None
    sha256: str | None = None             # as the node computed it
    status: str = "missing"               # complete | finished-from-qdstrm | summary | missing
    verified: bool = False
    resumed_from: int | None = None
    # an nsys stats / ncu CSV: which one (cuda_gpu_kern_sum, ncu_raw, ...)
    summary: str | None = None
    read_through: str | None = None       # fetched through this host (a shared report directory)
    removed_from_node: bool | None = None
    # why removal was asked for and not done (remove_gathered_reports)
    kept_on_node: str | None = None
    error: str | None = None
    WHAT = "a report entry"


@dataclass
class ProcessSeen(Record):
    """A process on one of the run's GPUs when its node was looked at."""
    gpu: int | None = None
    pid: int | None = None
    user: str | None = None
    used_memory: int | None = None
    foreign: bool | None = None
    slurm_job: str | None = None
    WHAT = "a process seen"


def _listed(v: Any) -> list | None:
    return list(v) if isinstance(v, (list, tuple)) else None


@dataclass(frozen=True)
class Asked:
    """What a run asked for, as its manifest keeps the request (``ProfileRequest.to_json``): the
    fields the store, its commands and the analyses read, read here alone. A value not of its type
    reads as absent (``manifest_io`` refuses a stored request whose tool or command is not)."""
    tool: str | None = None
    command: tuple[str, ...] | None = None      # None: the request named none
    gpus: tuple[int, ...] = ()                  # --gpu: NVML indices; (): every GPU
    launcher: str | None = None                 # a lab run's --launcher
    ranks: int | None = None                    # ... and how many ranks its command line says
    profiler_args: tuple[str, ...] = ()

    @classmethod
    def read(cls, request: dict) -> "Asked":
        # A manifest made in this process keeps the request's tuples; one read back, JSON's lists.
        command = _listed(request.get("command"))
        return cls(str_of(request.get("tool")), strs_of(command) if command is not None else None,
                   ints_of(_listed(request.get("gpus"))), str_of(request.get("launcher")),
                   int_of(request.get("ranks")), strs_of(_listed(request.get("profiler_args"))))

    def command_json(self) -> str:
        """The command as the catalogs keep it: JSON, ``null`` where the request named none."""
        return json.dumps(list(self.command) if self.command is not None else None)

    def said(self) -> str:
        """``TOOL -- COMMAND``, as the store's commands show a run."""
        return f"{self.tool} -- {' '.join(self.command or ())}"


@dataclass(frozen=True)
class MetricRow:
    """One metric of a playbook's run on one device, as its manifest keeps it."""
    metric: str
    device: str
    value: float
    flags: tuple[str, ...] = ()     # why the value is not clean (a tenant, throttling)


def metric_rows(given: Any) -> tuple[tuple[MetricRow, ...], tuple[str, ...]]:
    """The rows of a kept list of metrics; one not of a row's shape, or whose value is out of
    bounds (a summary's ``1e400``), is left out and said (``playbook metric I (why)``)."""
    rows, refused = [], []
    for i, r in enumerate(given if isinstance(given, list) else [given]):
        try:
            if not (isinstance(r, dict) and isinstance(r.get("metric"), str)
                    and isinstance(r.get("device"), str)):
                raise ValueError("not a metric with a name and a device")
            flags = r.get("flags") or []
            value = numbers.real(r.get("value"), "its value")
            rows.append(MetricRow(r["metric"], r["device"], value,
                                  tuple(map(str, flags if isinstance(flags, list) else [flags]))))
        except ValueError as e:
            refused.append(f"playbook metric {i} ({e})")
    return tuple(rows), tuple(refused)


@dataclass(frozen=True)
class PlaybookRun:
    """What a playbook's run keeps in its manifest (``RunManifest.playbook``), read here alone: its
    name, its workload's version, its metrics (a confirmation's apart: they are no night of the
    history), the rows left out and why, and its stragglers as ``nightly.stragglers`` found them."""
    name: str | None = None
    version: str | None = None
    metrics: tuple[MetricRow, ...] = ()
    confirm_metrics: tuple[MetricRow, ...] = ()
    refused: tuple[str, ...] = ()
    stragglers: dict | None = None

    @classmethod
    def read(cls, doc: Any) -> "PlaybookRun":
        if not isinstance(doc, dict):
            return cls()
        metrics, refused = metric_rows(doc.get("metrics") or [])
        confirm = doc.get("confirm")
        confirmed = (metric_rows(confirm.get("metrics") or [])[0] if isinstance(confirm, dict)
                     else ())
        stragglers = doc.get("stragglers")
        return cls(str_of(doc.get("name")), str_of(doc.get("version")), metrics, confirmed,
                   refused, stragglers if isinstance(stragglers, dict) else None)
