"""Ray's workers brought home from a Slurm job: each ``worker-HOST-PID.nsys-rep`` Ray's nsight plugin
wrote, with the ``.whose.json`` fleet's Ray hook (fleet/slurm/ray_hook.py) wrote beside it, read as
the job's data: bounded, checked, never a path to follow."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .. import outcome, safenames
from ..agent.rundir import RunDir
from ..outcome import HostStatus
from ..store.bring import bring_home
from ..store.manifest import HostEntry
from .jobs import SlurmClient, file_mark

if TYPE_CHECKING:
    from ..inventory import Host
    from ..store.manifest import SlurmInfo
    from ..transport import Fanout


async def ray_home(fan: "Fanout", client: SlurmClient, run_dir: str, lines: list[str],
                    directory: Path) -> list[HostEntry]:
    """Ray's workers of a Slurm job, brought home through the login node."""
    return await workers_home(fan, client.login, run_dir, lines, directory)


async def workers_home(fan: "Fanout", via: "Host", run_dir: str, lines: list[str],
                       directory: Path) -> list[HostEntry]:
    """Ray's workers, named worker-HOST-PID.nsys-rep (no rank, no agent), and whose each is, as
    fleet's Ray hook wrote it beside the report (worker-HOST-PID.whose.json: the actor or task),
    listed in ``lines`` (SIZE SHA256 PATH, as the node computed them) and fetched through ``via``
    from ``run_dir``/ray."""
    hosts = []
    marks = [found for found in map(file_mark, lines) if found is not None]
    whose = {found["path"]: found for found in marks if RunDir.is_whose(found["path"])}
    reported = {RunDir.whose_beside(found["path"]) for found in marks if not RunDir.is_whose(found["path"])}
    for found in marks:
        path = found["path"]
        if RunDir.is_whose(path):
            if path not in reported:
                hosts.append(await _left_no_report(fan, via, run_dir, found, directory))
            continue
        node = RunDir.ray_worker_host(path) or "ray"
        if not safenames.is_component(node):  # named by a file the job wrote
            hosts.append(unsafe_worker(node))
            continue
        said = whose.get(RunDir.whose_beside(path))
        reports = await bring_home(fan, via, [found] + ([said] if said else []), directory / node,
                                   node_dir=RunDir(run_dir).ray)
        for rep in reports:  # whose the report is: an extra beside it, as a summary is
            if RunDir.is_whose(rep.stored) or RunDir.is_whose(rep.remote):
                rep.status, rep.summary = "summary", "whose"
        gone = outcome.lost(reports)
        worker = ray_worker_name(reports) or os.path.basename(path)
        hosts.append(HostEntry(node, HostStatus.FAILED if gone else HostStatus.OK, worker=worker,
                               missing_why=gone[0].error if gone else None, reports=reports))
    return hosts


async def _left_no_report(fan: "Fanout", via: "Host", run_dir: str, said: dict, directory: Path) -> HostEntry:
    """A worker that said whose it is (so it ran under nsys: only a profiled worker writes one) and
    has no report beside it: its nsys ended before writing it (killed before or with the worker; a
    killed nsys leaves its data in its TMPDIR, not at the output name). Missing, named by its actor:
    never counted ok, where before it was left out and the run said complete."""
    node = RunDir.ray_worker_host(said["path"]) or "ray"
    if not safenames.is_component(node):
        return unsafe_worker(node)
    reports = await bring_home(fan, via, [said], directory / node, node_dir=RunDir(run_dir).ray)
    for rep in reports:
        rep.status, rep.summary = "summary", "whose"
    worker = ray_worker_name(reports) or os.path.basename(said["path"])
    return HostEntry(node, HostStatus.MISSING, worker=worker, reports=reports, missing_why=(
        f"{worker} ran under nsys but left no report: its nsys ended before writing one (killed before or "
        "with its worker)"))


def unsafe_worker(node: str) -> HostEntry:
    """A worker whose file names a node that is no safe name: failed, under a name of fleet's own,
    the job's words said only escaped (they reach a terminal and the store)."""
    return HostEntry("(ray worker)", HostStatus.FAILED, worker="(unsafe name)",
                     missing_why=safenames.component_problem(node, "the Ray worker's node name"))


def driver_entry(slurm: "SlurmInfo", refusal: str | None) -> list[HostEntry]:
    """The Ray program itself, the job's driver, run by the batch script: one that failed makes the
    run not ok, whatever its workers left (their reports are kept); none when it ended with 0, the
    script refused to start it (said on its own), or the launcher is not Ray."""
    job_exit = slurm.job_exit
    if slurm.spec.get("launcher") != "ray" or job_exit in (None, 0) or refusal:
        return []
    how = f"signal {job_exit - 128}" if job_exit > 128 else f"exit status {job_exit}"
    return [HostEntry("(driver)", HostStatus.WORKLOAD_FAILED, worker="the Ray program", missing_why=(
        f"the Ray program (the job's driver) ended with {how}; its workers' reports are kept"))]


def ray_worker_name(reports: list) -> str | None:
    """A Ray worker as people know it, from the whose file it wrote (the job's, so read bounded and
    checked): ``Trainer trainer-a on node1, GPU 0, pid 123``, or the task's function; None without one."""
    for rep in reports:
        if not (rep.verified and RunDir.is_whose(rep.stored)) or (rep.size or 0) > 65536:
            continue
        try:
            doc = json.loads(Path(rep.stored).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict):
            return None
        words = [doc.get(k) for k in ("actor_class", "actor_name", "task")]
        who = " ".join(w for w in words if isinstance(w, str) and w) or "worker"
        gpus = [g for g in doc.get("gpu_ids") or [] if isinstance(g, str)] if isinstance(doc.get("gpu_ids"), list) else []
        where = [f"on {doc['host']}" if isinstance(doc.get("host"), str) else None,
                 f"GPU {','.join(gpus)}" if gpus else None,
                 f"pid {doc['pid']}" if isinstance(doc.get("pid"), int) else None]
        named = (who + " " + ", ".join(w for w in where if w)).strip()[:200]
        return "".join(c if c.isprintable() else "?" for c in named)  # the job's words reach a terminal
    return None
