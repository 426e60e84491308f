"""Ray's workers brought home from a Slurm job: each ``worker-HOST-PID.nsys-rep`` Ray's nsight
plugin wrote, with the ``.whose.json`` fleet's Ray hook (fleet/slurm/ray_hook.py) wrote beside it,
read as the job's data: bounded, checked, never a path to follow."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import outcome, safenames
from ..completeness import RAY_DRIVER
from ..policy.readers import str_of, strs_of
from ..rundir import RunDir
from ..outcome import HostStatus
from ..collection.bring import bring_home
from ..store.manifest import WHOSE, HostEntry
from .jobs import SlurmClient, file_mark
from .jobstate import JobShape

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
    from ``run_dir``/ray. A worker the job marked unfinished (worker-HOST-PID.unfinished: its nsys
    still ran when the job stopped waiting) is missing, its report never counted."""
    hosts = []
    marks, extras = made_of_reports([found for found in map(file_mark, lines) if found is not None])
    whose_files, unfinished, reported = _listed(marks)
    for found in marks:
        path, base = found["path"], RunDir.ray_base(found["path"])
        if RunDir.is_unfinished(path):
            if base not in reported and base + RunDir.WHOSE not in whose_files:
                hosts.append(await _missing(fan, via, run_dir, found, directory, unfinished=True))
            continue
        if RunDir.is_whose(path):
            if base not in reported:
                hosts.append(await _missing(fan, via, run_dir, found, directory,
                                            unfinished=base in unfinished))
            continue
        said = whose_files.get(base + RunDir.WHOSE)
        if base in unfinished:  # what is at its name is what nsys had written when the job ended
            hosts.append(await _missing(fan, via, run_dir, said or found, directory,
                                        unfinished=True))
            continue
        hosts.append(await _reported(fan, via, run_dir, found, said, directory,
                                     extras.get(base, [])))
    return hosts


def _listed(marks: list[dict]) -> tuple[dict[str, dict], set[str], set[str]]:
    """What the listing says of the workers: their whose files (by path), and the workers (by
    base) marked unfinished and those that left a report."""
    whose = {found["path"]: found for found in marks if RunDir.is_whose(found["path"])}
    unfinished = {RunDir.ray_base(found["path"]) for found in marks
                  if RunDir.is_unfinished(found["path"])}
    reported = {RunDir.ray_base(found["path"]) for found in marks
                if not (RunDir.is_whose(found["path"]) or RunDir.is_unfinished(found["path"]))}
    return whose, unfinished, reported


def made_of_reports(marks: list[dict]) -> tuple[list[dict], dict[str, list[dict]]]:
    """The listed files apart from the export and summaries made of each worker's report
    (fleet/agent/rayend.py), which go home beside it: (the others, each report's base -> its
    extras, each marked with its summary's name and kind). An export or summary of no report
    listed is left on the cluster."""
    reports = {RunDir.ray_base(f["path"]) for f in marks if f["path"].endswith(RunDir.NSYS_REPORT)}
    made = {path: (base, what) for base in reports
            for path, what in RunDir.ray_extras(base).items()}
    others, extras = [], {}
    for found in marks:
        if found["path"] in made:
            base, (name, kind) = made[found["path"]]
            extras.setdefault(base, []).append(dict(found, summary=name,
                                                    **({"kind": kind} if kind else {})))
        elif not found["path"].endswith((RunDir.NSYS_EXPORT, ".csv")):
            others.append(found)
    return others, extras


async def _reported(fan: "Fanout", via: "Host", run_dir: str, found: dict, said: dict | None,
                    directory: Path, extras: list[dict]) -> HostEntry:
    """A worker with its report (and whose it is, where it said, and its export and summaries),
    brought home."""
    node = RunDir.ray_worker_host(found["path"]) or "ray"
    if not safenames.is_component(node):  # named by a file the job wrote
        return unsafe_worker(node)
    reports = await bring_home(fan, via, [found] + ([said] if said else []) + extras,
                               directory / node, node_dir=RunDir(run_dir).ray)
    for rep in reports:  # whose the report is: an extra beside it, as a summary is
        if RunDir.is_whose(rep.stored) or RunDir.is_whose(rep.remote):
            rep.status, rep.summary = "summary", WHOSE
    gone = outcome.lost(reports)
    worker = ray_worker_name(reports) or os.path.basename(found["path"])
    named_by_actor(reports)
    return HostEntry(node, HostStatus.FAILED if gone else HostStatus.OK, worker=worker,
                     missing_why=gone[0].error if gone else None, reports=reports)


async def _missing(fan: "Fanout", via: "Host", run_dir: str, said: dict, directory: Path, *,
                   unfinished: bool) -> HostEntry:
    """A worker without a report to count, named by its whose file where ``said`` is one.

    Left no report (its whose file says it ran under nsys: only a profiled worker writes one): its
    nsys ended before writing it (killed before or with the worker; a killed nsys leaves its data in
    its TMPDIR, not at the output name). Unfinished: its nsys still ran when the job stopped waiting
    for it, so what is at the report's name, if anything, is not the whole report; it stays on the
    cluster as it was. Either is missing, never counted ok, where before it was left out or
    counted."""
    node = RunDir.ray_worker_host(said["path"]) or "ray"
    if not safenames.is_component(node):
        return unsafe_worker(node)
    reports = []
    if RunDir.is_whose(said["path"]):
        reports = await bring_home(fan, via, [said], directory / node, node_dir=RunDir(run_dir).ray)
    for rep in reports:
        rep.status, rep.summary = "summary", WHOSE
    worker = ray_worker_name(reports) or os.path.basename(RunDir.ray_base(said["path"]))
    if unfinished:
        # worker-HOST-nsysPID: its worker unknown
        base = os.path.basename(RunDir.ray_base(said["path"]))
        left = (f" (left on the cluster as {base}{RunDir.NSYS_REPORT})"
                if base.rsplit("-", 1)[-1].isdigit() else "")
        why = (f"the nsys of {worker} still ran when the job stopped waiting for it after the Ray "
               f"program ended: its report is missing or unfinished{left}")
    else:
        why = (f"{worker} ran under nsys but left no report: its nsys ended before writing one "
               "(killed before or with its worker; Ray's shutdown kills an actor still alive then, "
               "nsys with it: fleet ends the program's actors first at its end, but not when a "
               "signal killed the program, nor one still running 10 s later, nor one created by "
               "another actor)")
    return HostEntry(node, HostStatus.MISSING, worker=worker, reports=reports, missing_why=why)


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
    if JobShape.read(slurm.spec).launcher != "ray" or job_exit in (None, 0) or refusal:
        return []
    return ([driver_failed(
        "ended with "
        f"{f'signal {job_exit - 128}' if job_exit > 128 else f'exit status {job_exit}'}")])


def driver_failed(how: str) -> HostEntry:
    """The line of a Ray program (the job's driver) that failed, on every path: ``how`` it ended."""
    return HostEntry(RAY_DRIVER, HostStatus.WORKLOAD_FAILED, worker="the Ray program", missing_why=(
        f"the Ray program (the job's driver) {how}; its workers' reports are kept"))


@dataclass(frozen=True)
class Whose:
    """What a Ray worker's whose file says, as fleet's Ray hook writes it: its actor's class and
    name (or its task's function), the node and GPUs it ran on, its pid. The file is in the job's
    folder, so the job's to write: a value not of its type reads as absent."""
    actor_class: str | None = None
    actor_name: str | None = None
    task: str | None = None
    host: str | None = None
    gpu_ids: tuple[str, ...] = ()
    pid: int | None = None

    @classmethod
    def read(cls, doc: Any) -> "Whose | None":
        """None for what is not a JSON object."""
        if not isinstance(doc, dict):
            return None
        pid = doc.get("pid")
        return cls(str_of(doc.get("actor_class")), str_of(doc.get("actor_name")),
                   str_of(doc.get("task")), str_of(doc.get("host")), strs_of(doc.get("gpu_ids")),
                   pid if isinstance(pid, int) else None)

    @property
    def words(self) -> list[str]:
        """Its actor's class and name, or its task's function: those it says."""
        return [w for w in (self.actor_class, self.actor_name, self.task) if w]


def whose_of(reports: list) -> Whose | None:
    """What a Ray worker's whose file says (the job's, so read bounded and checked), or None."""
    for rep in reports:
        if not (rep.verified and RunDir.is_whose(rep.stored)) or (rep.size or 0) > 65536:
            continue
        try:
            doc = json.loads(Path(rep.stored).read_text())
        # 64 KB of [[[[ nests past the stack json.loads uses
        except (OSError, ValueError, RecursionError):
            return None
        return Whose.read(doc)
    return None


def actor_stem(whose: Whose | None) -> str | None:
    """A worker's files' name in the store: its actor's class and name (or its task's function)
    and its pid, ``Trainer-trainer-0-29064``, each word cut to the characters a file name keeps;
    None where that is no safe name."""
    if whose is None or whose.pid is None:
        return None
    words = [re.sub(r"[^A-Za-z0-9_.-]", "_", w)[:64] for w in whose.words]
    stem = "-".join(words + [str(whose.pid)])
    # Never a name Ray's own reports have (worker-HOST-PID): one worker's files would take
    # another's.
    return stem if words and safenames.is_component(stem + RunDir.NSYS_REPORT) and \
        not stem.startswith(RunDir.RAY_WORKER) else None


def named_by_actor(reports: list) -> None:
    """A worker's report, whose file, export and summaries, once home and verified, renamed in the
    store by its actor (:func:`actor_stem`: ``worker-node1-29064_cuda_api_sum.csv`` becomes
    ``Trainer-trainer-0-29064_cuda_api_sum.csv``), beside where they came; kept as they came where
    that name is taken."""
    stem = actor_stem(whose_of(reports))
    base = next((Path(r.stored).name[: -len(RunDir.NSYS_REPORT)] for r in reports
                 if r.stored.endswith(RunDir.NSYS_REPORT)), None)
    renamed = [(rep, Path(rep.stored),
                Path(rep.stored).with_name(stem + Path(rep.stored).name[len(base):]))
               for rep in reports if stem and base and rep.verified
               and Path(rep.stored).name.startswith(base)]
    if any(new.exists() for _, _, new in renamed):  # all of a worker's files renamed, or none
        return
    for rep, old, new in renamed:
        os.replace(old, new)
        rep.stored = str(new)


def ray_worker_name(reports: list) -> str | None:
    """A Ray worker as people know it, from the whose file it wrote (the job's, so read bounded and
    checked): ``Trainer trainer-a on node1, GPU 0, pid 123``, or the task's function; None without
    one."""
    whose = whose_of(reports)
    if whose is None:
        return None
    who = " ".join(whose.words) or "worker"
    named = (who + " " + _worker_where(whose)).strip()[:200]
    return "".join(c if c.isprintable() else "?" for c in named)  # the job's words reach a terminal


def _worker_where(whose: Whose) -> str:
    """Where a whose file says its worker ran, of what it says: ``on node1, GPU 0, pid 123``."""
    where = [f"on {whose.host}" if whose.host is not None else None,
             f"GPU {','.join(whose.gpu_ids)}" if whose.gpu_ids else None,
             f"pid {whose.pid}" if whose.pid is not None else None]
    return ", ".join(w for w in where if w)
