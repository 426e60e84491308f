"""Bringing reports home: resumable, sha256-verified, atomic.

The node computed each report's sha256 when the profiler finished. A copy
lands as ``NAME.partial`` and enters the store only by rename once its hash
matches, so a reader never sees half a report. A transfer cut off half-way
resumes from the bytes already here; a copy whose hash is wrong is fetched
again once. An empty file is a file like any other (fetched, and checked against
the sha256 of nothing). The node's copy is never removed by a failed transfer.

The folder a copy lands in, and the one above it (the run's), are checked to be the user's,
0700, before each report (:mod:`fleet.store.private`); the transports write the ``.partial``
through :func:`fleet.agent.files.open_partial` (a new file made afresh, or the one resumed,
never a link), and the rename checks the folder again on its open handle.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..agent.messages import ReportFile
from ..store import private
from ..store.errors import UnsafeStore

if TYPE_CHECKING:
    from ..inventory import Host
    from ..transport import Fanout


def _sha256_prefix(path: Path, size: int) -> "hashlib._Hash":
    h = hashlib.sha256()
    if size:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h


def _resumable(partial: Path) -> int:
    """The bytes of an earlier copy to resume from: 0 when there is none, or when what is there is
    not a regular file of the user's (a link: it goes, never read or appended to)."""
    try:
        st = os.lstat(partial)
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        partial.unlink()
        return 0
    return st.st_size


def sha256_of(path: str | os.PathLike) -> str:
    return _sha256_prefix(Path(path), 1).hexdigest()


def is_summary(entry) -> bool:
    """Whether a brought-home ReportEntry is an optional extra the node made of a report: a CSV
    summary (nsys stats, ncu --import) or a report's SQLite export (status ``export``). One that
    did not come home is recorded as such in its entry, and never fails the run; an empty one is
    as nsys wrote it."""
    return entry.status in ("summary", "export")


async def fetch_verified(fan: "Fanout", host: "Host", report: ReportFile, dest: Path,
                         progress: Callable[[int], None] | None = None) -> dict:
    """Copy one report (its ``path``, ``size`` and ``sha256`` from the node, each of its shape:
    ``bring.file_problem``) to ``dest``; ``progress`` hears of every block that arrives (a byte
    progress bar)."""
    partial = dest.with_name(dest.name + ".partial")
    entry = {"remote": report.path, "stored": str(dest), "size": report.size,
             "sha256": report.sha256, "status": "truncated" if report.truncated else
                       "finished-from-qdstrm" if report.finished_from_qdstrm else "complete",
             "verified": False}
    try:
        private.check_folder(dest.parent, dest.parent.parent)
        for _ in range(2):  # a wrong hash earns one fresh copy
            have = _resumable(partial)
            if have > report.size:
                partial.unlink()
                have = 0
            # The hash is computed as the bytes arrive; only a resumed prefix is read again.
            digest = await asyncio.to_thread(_sha256_prefix, partial, have)

            def arrived(block: bytes, digest=digest) -> None:
                digest.update(block)
                if progress is not None:
                    progress(len(block))

            # An empty file is fetched too (nsys stats writes empty CSVs): that copies it, or says
            # the node no longer has it, where skipping would leave no .partial to rename.
            if have < report.size or not partial.exists():
                await fan.fetch(host, report.path, str(partial), offset=have, on_block=arrived,
                                size=report.size)
                entry["resumed_from"] = have or None
            if digest.hexdigest() == report.sha256:
                private.rename_into_place(partial, dest)
                entry["verified"] = True
                return entry
            partial.unlink()
        entry["error"] = "sha256 differs from the node's twice; the node's copy is kept"
    except (OSError, UnsafeStore) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        entry["error"] = f"could not bring it home: {why}; the node's copy is kept"
    entry["status"] = "missing"
    return entry
