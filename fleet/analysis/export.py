"""One nsys SQLite export, read with the standard library: the processes it traced, each with its
GPU kernels, NVTX ranges and marks, the blocking calls asked for, and the GPUs it ran on.

The tables and columns are nsys's own (2025.3, as ``nsys export --type sqlite`` and ``nsys stats``
write them; tests/fixtures/ranks-h200): ``CUPTI_ACTIVITY_KIND_KERNEL``, ``NVTX_EVENTS``,
``StringIds``, ``TARGET_INFO_GPU``, ``TARGET_INFO_SESSION_START_TIME``, ``PROCESSES``,
``CUPTI_ACTIVITY_KIND_RUNTIME``, ``OSRT_API``. A table a trace did not make (no NVTX, no OS
runtime tracing) is read as empty. Times stay in the export's own clock (nanoseconds since its
session started): nothing here compares one export's times with another's.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FleetError
from . import untrusted_sqlite
from .untrusted_sqlite import text

NVTX_MARK = 34                            # NVTX_EVENTS.eventType of nvtxMark
# an NVTX mark "rank 3": the process's rank
RANK_MARK = re.compile(r"rank[ _=:]?(\d{1,9})$", re.IGNORECASE)


class ExportError(FleetError, ValueError):
    """A file that is not an nsys export fleet can read; the message is one line."""


@dataclass(frozen=True)
class Gpu:
    cuda_id: int | None                   # the device as the process's CUDA saw it
    uuid: str | None
    name: str | None
    bus: str | None


@dataclass
class Process:
    """One traced process: a rank, when it did GPU work or reached a collective."""
    pid: int
    name: str
    epoch_ns: int | None                  # the session's start, UTC: shown, never trusted
    rank_mark: int | None = None
    gpus: list[Gpu] = field(default_factory=list)
    kernels: list[tuple[int, int, str]] = field(default_factory=list)      # start, end, name
    ranges: list[tuple[int, int, str, int]] = field(default_factory=list)  # start, end, text, tid
    # start, end, function, tid
    calls: list[tuple[int, int, str, int]] = field(default_factory=list)

    def range_times(self, name: str) -> list[tuple[int, int]]:
        return sorted((s, e) for s, e, text, _ in self.ranges if text == name)


TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS", "StringIds", "TARGET_INFO_GPU",
          "TARGET_INFO_SESSION_START_TIME", "PROCESSES", "CUPTI_ACTIVITY_KIND_RUNTIME", "OSRT_API")


def _pid(global_id: int | None) -> int | None:
    """nsys's serialized global ids: the process id in bits 24-47 (tid in the low 24)."""
    return None if global_id is None else (global_id >> 24) & 0xFFFFFF


def _tid(global_id: int | None) -> int:
    return 0 if global_id is None else global_id & 0xFFFFFF


class _Tables:
    """The export's plain tables (checked by :func:`untrusted_sqlite.plain_tables`), their
    columns, and their rows with each integer column's type checked."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        self.present = untrusted_sqlite.plain_tables(db, TABLES)
        self._columns: dict[str, set[str]] = {}

    def columns(self, table: str) -> set[str]:
        if table not in self.present:
            return set()
        if table not in self._columns:
            self._columns[table] = {row[1]
                                    for row in self.db.execute(f"PRAGMA table_info('{table}')")}
        return self._columns[table]

    def rows(self, table: str, wanted: tuple[str, ...], ints: tuple[str, ...] = (), where: str = "",
             args=()) -> list[tuple]:
        """``wanted`` of each row, NULL for a column the table lacks (older nsys), none when the
        table is absent. A column written ``"!start"`` must hold an integer; one named in ``ints``
        an integer or NULL."""
        have = self.columns(table)
        names = [c.lstrip("!") for c in wanted]
        if not have:
            return []
        select = ", ".join(f'"{c}"' if c in have else "NULL" for c in names)
        checks = [(i, c.lstrip("!"), c.startswith("!")) for i, c in enumerate(wanted)
                  if c.lstrip("!") in ints or c.startswith("!")]
        out = []
        for row in untrusted_sqlite.rows(self.db, table, f'SELECT {select} FROM "{table}" {where}',
                                         args):
            for i, column, required in checks:
                if row[i] is not None or required:
                    untrusted_sqlite.whole(row[i], table, column)
            out.append(row)
        return out


def read(path: str | Path, sync_calls: tuple[str, ...] = ()) -> list[Process]:
    """The processes of one export, by pid; ``sync_calls`` names the CUDA runtime or OS runtime
    functions (``cudaStreamSynchronize``, ``pthread_cond_wait``) whose calls are read too. An export
    is hostile input (:mod:`.untrusted_sqlite`): any refusal is an
    :class:`ExportError` naming it."""
    try:
        with untrusted_sqlite.opened(path) as db:
            tables = _Tables(db)
            if (not tables.columns("CUPTI_ACTIVITY_KIND_KERNEL")
                and not tables.columns("NVTX_EVENTS")):
                raise ExportError(f"{path}: no CUPTI_ACTIVITY_KIND_KERNEL nor NVTX_EVENTS table: "
                                  f"not an nsys export of a CUDA or NVTX trace")
            return _read(tables, sync_calls)
    except untrusted_sqlite.UntrustedFileError as e:
        raise ExportError(f"{path}: {e}") from None


def _read(t: _Tables, sync_calls: tuple[str, ...]) -> list[Process]:
    epoch = t.rows("TARGET_INFO_SESSION_START_TIME", ("utcEpochNs",), ints=("utcEpochNs",))
    procs: dict[int, Process] = {}
    strings = dict(t.rows("StringIds", ("id", "value")))
    names = dict(t.rows("PROCESSES", ("pid", "name")))

    def proc(pid: int | None) -> Process:
        pid = pid or 0
        if pid not in procs:
            procs[pid] = Process(pid, text(names.get(pid)) or "?", epoch[0][0] if epoch else None)
        return procs[pid]

    gpus = {row[0]: Gpu(row[0] if isinstance(row[0], int) else None, *map(text, row[1:]))
            for row in t.rows("TARGET_INFO_GPU", ("id", "uuid", "name", "busLocation"))}
    kernel = t.columns("CUPTI_ACTIVITY_KIND_KERNEL")
    if {"start", "end"} <= kernel:
        name = "demangledName" if "demangledName" in kernel else "shortName"
        for start, end, gpid, device, name_id in t.rows(
                "CUPTI_ACTIVITY_KIND_KERNEL", ("!start", "!end", "globalPid", "deviceId", name),
                ints=("globalPid",)):
            p = proc(_pid(gpid))
            p.kernels.append((start, end, text(strings.get(name_id)) or "?"))
            gpu = gpus.get(device) or (next(iter(gpus.values())) if len(gpus) == 1 else Gpu(
                device if isinstance(device, int) else None, None, None, None))
            if gpu not in p.gpus:
                p.gpus.append(gpu)
    _read_nvtx(t, strings, proc)
    if sync_calls:
        _read_calls(t, strings, sync_calls, proc)
    for p in procs.values():  # read in the file's order, sorted here: SQLite sorts on disk
        p.kernels.sort()
        p.ranges.sort()
        p.calls.sort()
    return sorted(procs.values(), key=lambda p: p.pid)


def _read_calls(t: _Tables, strings: dict, sync_calls: tuple[str, ...], proc) -> None:
    """The calls of the functions named, from the CUDA runtime and the OS runtime traces."""
    ids = [i for i, value in strings.items() if value in sync_calls]
    if not ids:
        return
    marks = ",".join("?" * len(ids))
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "OSRT_API"):
        if {"start", "end", "globalTid", "nameId"} <= t.columns(table):
            for start, end, gtid, name_id in t.rows(table,
                                                    ("!start", "!end", "globalTid", "nameId"),
                                                    ints=("globalTid",),
                                                    where=f"WHERE nameId IN ({marks})", args=ids):
                proc(_pid(gtid)).calls.append((start, end, str(strings[name_id]), _tid(gtid)))


def _read_nvtx(t: _Tables, strings: dict, proc) -> None:
    """Ranges (pushed/popped or started/ended) with their text, and the "rank N" marks."""
    if not {"start", "end", "eventType", "globalTid", "text"} <= t.columns("NVTX_EVENTS"):
        return
    for start, end, kind, gtid, inline, text_id in t.rows(
            "NVTX_EVENTS", ("!start", "end", "eventType", "globalTid", "text", "textId"),
            ints=("end", "eventType", "globalTid")):
        p = proc(_pid(gtid))
        label = text(inline) if inline is not None else text(strings.get(text_id))
        if kind == NVTX_MARK or end is None:
            found = RANK_MARK.fullmatch((label or "").strip()) if kind == NVTX_MARK else None
            if found:
                p.rank_mark = int(found.group(1))
            continue
        if label is not None:
            p.ranges.append((start, end, label, _tid(gtid)))
