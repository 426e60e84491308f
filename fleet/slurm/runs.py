"""Slurm runs in the store, as the command line asks about them: which ones, on which cluster,
their jobs' states now, cancelling them, and one run shown to a person."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import completeness, outcome, store
from ..statuses import RunStatus
from ..inventory import TargetError
from ..store.errors import CatalogError, UnsafeStore
from .cluster import Cluster, choose
from .jobs import SlurmClient, SlurmctldSilent
from .jobstate import JobState

if TYPE_CHECKING:
    from ..inventory import Inventory
    from ..store.manifest import RunManifest
    from ..transport import Fanout


def stored(store_root: Path, run_ids: tuple[str, ...] = (),
           on_skipped: Callable[[str], None] = lambda why: None) -> list["RunManifest"]:
    """The manifests of Slurm runs: those named (LookupError for one not in the store,
    CatalogError for one that cannot be read), else every run not yet gathered. Listing them,
    a manifest that cannot be read (hand-edited, cut off, of the wrong types) is skipped and
    named through ``on_skipped``: one bad file never hides every other run's job."""
    if run_ids:
        manifests = [store.read_manifest(store.manifest_of(store_root, r)) for r in run_ids]
    else:
        manifests = []
        for path in sorted(store_root.glob("*/*/*/manifest.json")):
            if not store.may_be_unfinished(path):
                continue  # a finished run: not built (1 ms each)
            try:
                manifests.append(store.read_manifest(path))
            except UnsafeStore:
                raise  # the store itself is not the user's: nothing of it is read
            except CatalogError as e:
                on_skipped(f"skipped a run whose manifest cannot be read: {e}")
    return [m for m in manifests if m.slurm and (run_ids or m.status in store.UNFINISHED)]


def by_cluster(inventory: "Inventory", manifests: list["RunManifest"],
               on_skipped: Callable[[str], None] | None = None) -> list[tuple[Cluster,
                                                                              list["RunManifest"]]]:
    """The runs grouped by the cluster (from the inventory) their job went to. A run whose
    cluster the inventory no longer has is a TargetError, or, listing (``on_skipped``), skipped
    and named."""
    groups: dict[str, tuple[Cluster, list]] = {}
    for m in manifests:
        name = m.slurm.cluster
        try:
            cluster = choose(inventory, None, None if name == "local" else name,
                             embedded=name == "local")
        except TargetError as e:
            if on_skipped is None:
                raise
            on_skipped(f"skipped run {m.run_id}: {e}")
            continue
        groups.setdefault(cluster.name, (cluster, []))[1].append(m)
    return list(groups.values())


async def job_rows(fan: "Fanout", groups: list[tuple[Cluster, list["RunManifest"]]]) -> list[dict]:
    """Each run's job as Slurm sees it now: one squeue call per cluster, in squeue's text format,
    which every version writes (the cluster's own settings, one more round trip to slurmctld, are
    asked only for a job that has left squeue). Where slurmctld does not answer (within its
    bound), every job of that cluster is UNKNOWN, never gone."""
    rows = []
    for cluster, ms in groups:
        client = SlurmClient(fan, cluster.login)
        ids = [m.slurm.job_id for m in ms if m.slurm.job_id]
        try:
            states = await client.states(ids) if ids else {}
        except SlurmctldSilent:
            states = {j: JobState(j, "UNKNOWN", "slurmctld not answering") for j in ids}
        for m in ms:
            st = states.get(m.slurm.job_id)
            rows.append({"run_id": m.run_id, "cluster": m.slurm.cluster_name or cluster.name,
                         "job_id": m.slurm.job_id,
                         "state": st.state if st else m.slurm.state, "reason": st and st.reason,
                         "nodes": st and st.nodes, "elapsed": st and st.elapsed,
                         "run_status": m.status})
    return rows


def jobs_of(groups: list[tuple[Cluster, list["RunManifest"]]]) -> list[tuple[str, Cluster,
                                                                             list[str]]]:
    """Each cluster's name (:func:`shown_name`) and job ids among the runs (a run refused before
    sbatch has none)."""
    found = [(shown_name(cluster, ms), cluster, [m.slurm.job_id for m in ms if m.slurm.job_id])
             for cluster, ms in groups]
    return [(name, cluster, ids) for name, cluster, ids in found if ids]


async def cancel(fan: "Fanout",
                 groups: list[tuple[Cluster, list["RunManifest"]]]) -> list[tuple[str, list[str]]]:
    """scancel each cluster's jobs (the profilers get SIGTERM and finish their reports)."""
    done = []
    for name, cluster, ids in jobs_of(groups):
        run_dirs = [m.slurm.run_dir for _, ms in groups for m in ms if m.slurm.job_id in ids
                    and m.slurm.run_dir]
        # fleet's stop recorded first
        await SlurmClient(fan, cluster.login).cancel(ids, run_dirs=run_dirs)
        done.append((name, ids))
    return done


def shown_name(cluster: Cluster, manifests: list["RunManifest"]) -> str:
    """A cluster as people know it: Slurm's ClusterName, as its runs recorded it; else the
    inventory's name."""
    return next((m.slurm.cluster_name for m in manifests if m.slurm.cluster_name), cluster.name)


def render(m: "RunManifest") -> str:
    """One Slurm run for people: the job, each rank's outcome and reports."""
    s = m.slurm
    lines = ([f"run {m.run_id}: job {s.job_id} on {s.cluster_name or s.cluster} {s.state or ''} -> "
              f"{m.status}"])
    if m.status == RunStatus.SUBMITTED:
        lines.append(f"  reports will be under {s.run_dir}; bring them home with: fleet gather "
                     f"{m.run_id}")
    if s.end:
        lines.append(f"  {s.end}")
    if s.stopped_before_time_limit:
        lines.append("  the profilers were stopped ahead of the time limit, so their reports could "
                     "be finished")
    for h in m.hosts:
        # a Ray worker: its actor or task
        rank = f"rank {h.rank}" if h.rank is not None else (h.worker or "?")
        lines.append(outcome.status_line(f"{h.host} {rank}", h, indent="  "))
        lines += outcome.detail_lines(h, indent="    ", hashes=False)
    if s.log:
        lines.append(f"  job log:  {s.log.stored}")
    lines += ["  " + line for line in completeness.run_lines(m.hosts)]
    return "\n".join(lines) + "\n"
