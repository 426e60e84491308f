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

NVTX_MARK = 34                            # NVTX_EVENTS.eventType of nvtxMark
RANK_MARK = re.compile(r"rank[ _=:]?(\d+)$", re.IGNORECASE)   # an NVTX mark "rank 3": the process's rank


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
    calls: list[tuple[int, int, str, int]] = field(default_factory=list)   # start, end, function, tid

    def range_times(self, name: str) -> list[tuple[int, int]]:
        return sorted((s, e) for s, e, text, _ in self.ranges if text == name)


def _pid(global_id: int | None) -> int | None:
    """nsys's serialized global ids: the process id in bits 24-47 (tid in the low 24)."""
    return None if global_id is None else (int(global_id) >> 24) & 0xFFFFFF


def _tid(global_id: int | None) -> int:
    return 0 if global_id is None else int(global_id) & 0xFFFFFF


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info('{table}')")}


def _or_null(db: sqlite3.Connection, table: str, *wanted: str) -> str:
    """The columns to select: each of ``wanted`` the table has, NULL for one it lacks (older nsys)."""
    have = _columns(db, table)
    return ", ".join(f'"{c}"' if c in have else "NULL" for c in wanted)


def _rows(db: sqlite3.Connection, table: str, wanted: tuple[str, ...], sql: str, args=()) -> list:
    """The rows of ``sql`` when ``table`` has the ``wanted`` columns; none when it is absent."""
    have = _columns(db, table)
    return list(db.execute(sql, args)) if have and set(wanted) <= have else []


def read(path: str | Path, sync_calls: tuple[str, ...] = ()) -> list[Process]:
    """The processes of one export, by pid; ``sync_calls`` names the CUDA runtime or OS runtime
    functions (``cudaStreamSynchronize``, ``pthread_cond_wait``) whose calls are read too."""
    try:
        db = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
        try:
            db.execute("SELECT 1 FROM sqlite_master").fetchall()
            if not _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL") and not _columns(db, "NVTX_EVENTS"):
                raise ExportError(f"{path}: no CUPTI_ACTIVITY_KIND_KERNEL nor NVTX_EVENTS table: "
                                  f"not an nsys export of a CUDA or NVTX trace")
            return _read(db, sync_calls)
        finally:
            db.close()
    except sqlite3.DatabaseError as e:
        raise ExportError(f"{path}: not a SQLite file nsys wrote ({e})") from None


def _read(db: sqlite3.Connection, sync_calls: tuple[str, ...]) -> list[Process]:
    epoch = _rows(db, "TARGET_INFO_SESSION_START_TIME", ("utcEpochNs",),
                  "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    procs: dict[int, Process] = {}
    strings = dict(_rows(db, "StringIds", ("id", "value"), "SELECT id, value FROM StringIds"))
    names = {pid: name for pid, name in _rows(db, "PROCESSES", ("pid", "name"), "SELECT pid, name FROM PROCESSES")}

    def proc(pid: int | None) -> Process:
        pid = pid or 0
        if pid not in procs:
            procs[pid] = Process(pid, str(names.get(pid) or "?"), int(epoch[0][0]) if epoch else None)
        return procs[pid]

    gpus = {row[0]: Gpu(*row) for row in db.execute(
        f"SELECT {_or_null(db, 'TARGET_INFO_GPU', 'id', 'uuid', 'name', 'busLocation')} FROM TARGET_INFO_GPU")
        } if _columns(db, "TARGET_INFO_GPU") else {}
    if {"start", "end"} <= _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL"):
        name = "demangledName" if "demangledName" in _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL") else "shortName"
        for start, end, gpid, device, text in db.execute(
                f"SELECT {_or_null(db, 'CUPTI_ACTIVITY_KIND_KERNEL', 'start', 'end', 'globalPid', 'deviceId', name)}"
                f" FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start"):
            p = proc(_pid(gpid))
            p.kernels.append((int(start), int(end), strings.get(text, "?")))
            gpu = gpus.get(device) or (next(iter(gpus.values())) if len(gpus) == 1 else Gpu(device, None, None, None))
            if gpu not in p.gpus:
                p.gpus.append(gpu)
    _read_nvtx(db, proc)
    if sync_calls:
        marks = ",".join("?" * len(sync_calls))
        for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "OSRT_API"):
            for start, end, gtid, name in _rows(
                    db, table, ("start", "end", "globalTid", "nameId"),
                    f"SELECT t.start, t.end, t.globalTid, s.value FROM {table} t JOIN StringIds s "
                    f"ON s.id = t.nameId WHERE s.value IN ({marks}) ORDER BY t.start", sync_calls):
                proc(_pid(gtid)).calls.append((int(start), int(end), str(name), _tid(gtid)))
    return sorted(procs.values(), key=lambda p: p.pid)


def _read_nvtx(db: sqlite3.Connection, proc) -> None:
    """Ranges (pushed/popped or started/ended) with their text, and the "rank N" marks."""
    text_id = "n.textId" if "textId" in _columns(db, "NVTX_EVENTS") else "NULL"
    for start, end, kind, gtid, text in _rows(
            db, "NVTX_EVENTS", ("start", "end", "eventType", "globalTid", "text"),
            f"SELECT n.start, n.end, n.eventType, n.globalTid, COALESCE(n.text, s.value) FROM NVTX_EVENTS n "
            f"LEFT JOIN StringIds s ON s.id = {text_id} ORDER BY n.start"):
        p = proc(_pid(gtid))
        if kind == NVTX_MARK or end is None:
            found = RANK_MARK.fullmatch(str(text or "").strip()) if kind == NVTX_MARK else None
            if found:
                p.rank_mark = int(found.group(1))
            continue
        if text is not None:
            p.ranges.append((int(start), int(end), str(text), _tid(gtid)))
