"""A run of the embedded store into the team store: its verified files up, then its catalog rows.

Order is what keeps a cut harmless: every object is sent and checked first (:mod:`.objects`), and
the run's rows commit last, in one transaction. A cut before the commit (the catalog stopped, the
object store killed, fleet killed) leaves no visible run and no row pointing at a missing object,
only objects (or a multipart upload) that the next push finds and keeps. A run already in the
catalog with this very manifest is left alone: pushing again changes nothing.

The embedded store stays the truth on this machine: a run is pushed from it, and one that could not
be pushed stays there, marked by the absence of its ``team.json`` (see :func:`state`).
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ...statuses import HostStatus, RunStatus
from .. import layout, private
from ..catalog import _metric_rows
from ..summary_csv import checked_kernel_rows
from ..manifest import RunManifest
from ..manifest_io import UNFINISHED, read_manifest
from . import catalog, objects
from .catalog import TeamError
from .config import TeamStore

# beside a run's manifest: where and when it was pushed, and which manifest
MARK = "team.json"
# statuses of a run not finished (or never run): pushed once it is
NOT_YET = (*UNFINISHED, RunStatus.DRY_RUN)


@dataclass
class Pushed:
    run_id: str
    sent: int = 0              # files sent now
    already_there: int = 0     # files the object store had with this content
    resumed_parts: int = 0
    unchanged: bool = False    # the catalog had this run with this very manifest: nothing was done
    owner: str = ""


def manifest_digest(path: Path) -> str:
    return hashlib.sha256(private.read_text(path).encode()).hexdigest()


def _stored_files(m: RunManifest, manifest_path: Path) -> list[tuple]:
    """(host, file in the store, report entry) of every verified file of the run."""
    found = []
    for host in m.hosts:
        for rep in host.reports:
            path = layout.here(manifest_path, rep.stored)
            if rep.verified and rep.sha256 and path:
                found.append((host, Path(path), rep))
    return found


def _rows(m: RunManifest, manifest_path: Path, keys: dict[str, str]) -> tuple[list, list, list]:
    """The catalog's rows of the run, as the embedded catalog makes them (one shape for both)."""
    tool = m.asked.tool
    reports, kernels = [], []
    for host in m.hosts:
        for rep in host.reports:
            name = Path(rep.stored or rep.remote).name
            key = keys.get(rep.stored) if rep.verified else None
            reports.append((m.run_id, host.host, name, tool, rep.status, rep.sha256, rep.size,
                            host.gpu, host.driver, host.tool_version, m.started, key))
            stored = layout.here(manifest_path, rep.stored)
            if rep.summary == "cuda_gpu_kern_sum" and rep.verified and stored:
                kernels += [(m.run_id, host.host, *k) for k in checked_kernel_rows(Path(stored))[0]]
        if not host.reports:
            status = ("running" if m.status in UNFINISHED else
                      "refused" if host.status == HostStatus.REFUSED else "missing")
            placeholder = "" if host.rank is None else f"(rank {host.rank})"
            reports.append((m.run_id, host.host, placeholder, tool, status, None, None, host.gpu,
                            host.driver, host.tool_version, m.started, None))
    return _unique(reports), kernels, _metric_rows(m)[0]


def _unique(reports: list[tuple]) -> list[tuple]:
    """One row per (host, name), as the embedded catalog's primary key keeps (the last one wins)."""
    seen: dict[tuple, tuple] = {}
    for row in reports:
        seen[(row[1], row[2])] = row
    return list(seen.values())


def push_run(team: TeamStore, store_root: Path, run_id: str, *, s3=None, conn=None) -> Pushed:
    """Push one run of the embedded store (see the module); TeamError/TeamUnavailable on failure,
    with nothing visible in the catalog that was not there before. ``conn``: a catalog connection
    kept for several runs (the run committed on it, or rolled back); else one of its own."""
    if conn is None:
        with catalog.connected(team) as own:
            return push_run(team, store_root, run_id, s3=s3, conn=own)
    manifest_path = _manifest_path(store_root, run_id)
    m = read_manifest(manifest_path)
    if m.status in NOT_YET:
        raise TeamError(f"run {run_id} is {m.status}: it is pushed once it has finished")
    digest = manifest_digest(manifest_path)
    with catalog.unit(conn):
        catalog.check_version(conn)
        owner = catalog.whoami(conn)
        there = catalog.pushed_digest(conn, run_id)
        if there is not None and there[0] != owner:
            raise TeamError(f"run id {run_id} is taken in the team store by {there[0]}'s run")
        if there == (owner, digest):
            mark(manifest_path, team, digest)
            return Pushed(run_id, unchanged=True, owner=owner)
        result = Pushed(run_id, owner=owner)
        keys = _send(team, m, manifest_path, owner, s3 or objects.client(), result)
        reports, kernels, metrics = _rows(m, manifest_path, keys)
        catalog.publish(conn, _run_row(m, manifest_path, digest), reports, kernels, metrics)
    mark(manifest_path, team, digest)
    return result


def _manifest_path(store_root: Path, run_id: str) -> Path:
    from ..queries import manifest_of

    return manifest_of(store_root, run_id)


def _send(team: TeamStore, m: RunManifest, manifest_path: Path, owner: str, s3,
          result: Pushed) -> dict[str, str]:
    """Every verified file of the run sent (or found there): its key by its stored path."""
    keys = {}
    for host, path, rep in _stored_files(m, manifest_path):
        key = objects.key_of(team.objects, owner, m.site, m.run_id, host.host, rep.sha256)
        sent = objects.upload(s3, team.objects.bucket, key, path, rep.sha256)
        result.sent += not sent.already_there
        result.already_there += sent.already_there
        result.resumed_parts += sent.resumed_parts
        keys[rep.stored] = key
    return keys


def _run_row(m: RunManifest, manifest_path: Path, digest: str) -> dict:
    return {"run_id": m.run_id, "site": m.site, "day": m.day, "started": m.started,
            "tool": m.asked.tool, "command": m.asked.command_json(), "status": m.status,
            "manifest": private.read_text(manifest_path), "manifest_sha256": digest,
            "pushed_from": socket.gethostname()}


def mark(manifest_path: Path, team: TeamStore, digest: str) -> None:
    private.write_file(manifest_path.with_name(MARK), json.dumps(
        {"objects": str(team.objects), "manifest_sha256": digest,
         "pushed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")


def state(manifest_path: Path) -> str:
    """"pushed" when the team store has this very manifest of the run (as last pushed from here),
    "not pushed" else (never pushed, or changed since)."""
    try:
        doc = json.loads(private.read_text(manifest_path.with_name(MARK), limit=1 << 16))
        pushed = isinstance(doc,
                            dict) and doc.get("manifest_sha256") == manifest_digest(manifest_path)
    except (OSError, ValueError):
        pushed = False
    return "pushed" if pushed else "not pushed"
