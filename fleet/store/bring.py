"""Bringing a run's files home from a node, for lab servers and Slurm ranks alike.

What a node names is data, never a path to follow: each file must be a plain name directly in
the run's own folder on that node (``node_dir``), with a size and a sha256 of their shape. Only
such files are fetched (``collect.fetch_verified``: resumable, checked, renamed into place);
any other entry is recorded as not brought home, with the reason, and nothing is read for it.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING

from .. import safenames
from ..agent import wire
from .collect import fetch_verified
from .manifest import ReportEntry

if TYPE_CHECKING:
    from ..inventory import Host
    from ..transport import Fanout


def file_problem(report: object, node_dir: str) -> str | None:
    """Why a file a node named is not one fleet fetches, or None."""
    wrong = wire.check(report, wire.FILE, "the file's entry", wire.FILE_REQUIRED)
    if wrong:
        return wrong[0]
    path = report["path"]
    name = posixpath.basename(path)
    problem = safenames.component_problem(name, "the report's file name")
    if problem:  # named by the node (or, on Slurm, by a file the job could write): kept off the store
        return problem
    if posixpath.normpath(posixpath.dirname(path)) != posixpath.normpath(node_dir):
        return f"{path!r} is not in the run's folder on the node ({node_dir})"
    return None


async def bring_home(fan: "Fanout", via: "Host", to_fetch: list, dest_dir: Path, *, node_dir: str,
                     gathering=None, read_through: bool = False) -> list[ReportEntry]:
    """The reports and summaries an agent's result names, fetched through ``via`` from
    ``node_dir`` into ``dest_dir`` and checked against the node's sha256."""
    checked = [(report, file_problem(report, node_dir)) for report in to_fetch]
    if gathering is not None:
        gathering.expect(sum(r["size"] for r, problem in checked if problem is None))
    entries = []
    for report, problem in checked:
        if problem:
            remote = report.get("path") if isinstance(report, dict) else None
            entries.append(ReportEntry(remote=str(remote), error=problem))
            continue
        dest = dest_dir / os.path.basename(report["path"])
        entry = await fetch_verified(fan, via, report, dest, gathering.advance if gathering else None)
        if read_through:
            entry["read_through"] = via.name
        if report.get("summary") is not None:  # an extra made of a report: a CSV summary, or its SQLite export
            entry.update(status="export" if report.get("kind") == "export" else "summary", summary=report["summary"])
        entries.append(ReportEntry.from_json(entry))
    return entries
