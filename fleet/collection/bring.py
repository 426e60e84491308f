"""Bringing a run's files home from a node, for lab servers and Slurm ranks alike.

What a node names is data, never a path to follow: each file must be a plain name directly in
the run's own folder on that node (``node_dir``), with a size and a sha256 of their shape. Only
such files are fetched (``fetch.fetch_verified``: resumable, checked, renamed into place);
any other entry is recorded as not brought home, with the reason, and nothing is read for it.

Removing the node's copy (``remove_gathered_reports``) deletes less still: only a file of the
agent's result, verified here, in the run's folder, whose name is one fleet's agent gives that
host's files this run (the plan's output name: ``HOST-PID.nsys-rep``, ``HOST-PID_cuda_api_sum.csv``
...), and through that host's own login, never through a host that reads a shared folder for it.
Anything else is left on the node, and the entry says why.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING

from .. import safenames
from ..agent import wire
from ..agent.messages import ReportFile
from ..rundir import RunDir
from .fetch import fetch_verified
from ..store.manifest import ReportEntry

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
    # named by the node (or, on Slurm, by a file the job could write): kept off the store
    if problem:
        return problem
    if posixpath.normpath(posixpath.dirname(path)) != posixpath.normpath(node_dir):
        return f"{path!r} is not in the run's folder on the node ({node_dir})"
    return None


def agents_name(path: str, output: str) -> bool:
    """Whether ``path`` is named as fleet's agent names the files of the run whose plan writes to
    ``output`` (``DIR/HOST-%p``, or a launcher's ``DIR/HOST/rank%q{VAR}``): that name, each
    placeholder any value, then its own suffix."""
    stem = RunDir.output_glob(posixpath.basename(output))
    return fnmatch.fnmatchcase(posixpath.basename(path), stem + "[._]*")


async def _remove(fan: "Fanout", owner: "Host", output: str, entry: dict) -> None:
    """The node's copy of a verified file deleted through ``owner`` (the host whose agent wrote it),
    when it is named as that agent names its files; else kept, and the entry says why."""
    if not agents_name(entry["remote"], output):
        entry["kept_on_node"] = (f"not removed: {posixpath.basename(entry['remote'])!r} is not a "
                                 f"name fleet's agent gives {owner.name}'s files in this run "
                                 f"({posixpath.basename(output)}...)")
        return
    gone = await fan.run(owner, ["rm", "-f", "--", entry["remote"]])
    entry["removed_from_node"] = gone.ok
    if not gone.ok:
        entry["kept_on_node"] = (
            f"rm failed: {gone.error or gone.stderr.decode(errors='replace').strip()[-200:]}")


async def bring_home(fan: "Fanout", via: "Host", to_fetch: list, dest_dir: Path, *, node_dir: str,
                     gathering=None, read_through: bool = False, remove_for: "Host | None" = None,
                     output: str | None = None) -> list[ReportEntry]:
    """The reports and summaries an agent's result names, fetched through ``via`` from
    ``node_dir`` into ``dest_dir`` and checked against the node's sha256. ``remove_for``: the host
    whose agent wrote them asked for its copies to go (``remove_gathered_reports``), and the plan's
    ``output`` says which names are its agent's (see the module)."""
    checked = [(report, file_problem(report, node_dir)) for report in to_fetch]
    files = [ReportFile.read(report) if problem is None else None for report, problem in checked]
    if gathering is not None:
        gathering.expect(sum(f.size for f in files if f is not None))
    entries = []
    for (report, problem), f in zip(checked, files):
        if f is None:
            entries.append(ReportEntry(remote=str(wire.named_path(report)), error=problem))
            continue
        entry = await fetch_verified(fan, via, f, dest_dir / os.path.basename(f.path),
                                     gathering.advance if gathering else None)
        if read_through:
            entry["read_through"] = via.name
        if remove_for is not None and output and entry["verified"]:
            await _remove(fan, remove_for, output, entry)
        entries.append(ReportEntry.from_json(_as_made(entry, f)))
    return entries


def _as_made(entry: dict, f: ReportFile) -> dict:
    """A fetched file's entry, marked as an extra made of a report where it is one: a CSV summary,
    or the report's SQLite export."""
    if f.summary is not None:
        entry.update(status="export" if f.kind == "export" else "summary", summary=f.summary)
    return entry
