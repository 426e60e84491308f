"""``fleet profile --partition``: one run is one batch job, from submission to the store.

Three steps, each a few round trips to the login node: ``prepare`` (Slurm's
version and the user's home: one call, read-only, also for ``--dry-run``),
``submit`` (the agent and the script put in the run's directory and
``sbatch``ed: one call), ``watch`` (one batched status call per interval, with
backoff) and ``gather`` (every rank's result read in one call, then its
reports fetched and verified against the sha256 the compute node computed).
The manifest is written at each step, so ``fleet gather RUN`` can finish a run
whose fleet went away.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import outcome, safenames, store
from ..agent import wire
from ..agent.bundle import script as agent_script
from ..outcome import HostStatus
from ..store.bring import bring_home, file_problem
from ..store.collect import fetch_verified
from ..store.manifest import HostEntry, ReportEntry, RunManifest, SlurmInfo
from ..plan import ProfileRequest, profiler_args_error
from . import launchers, options
from .cluster import Cluster
from .jobs import JobState, SlurmClient, SlurmError, UsageError
from ..containers import nsight_dirs
from .script import AGENT_FILE, REQUEST_FILE, SCRIPT_FILE, JobFiles, JobSpec, render, request_doc

if TYPE_CHECKING:
    from ..transport import Fanout

POLL_FIRST = 0.5    # seconds; then each wait 1.5x longer, up to the poll interval
WATCH_FAILURES = 10  # status calls failing in a row before fleet gives up watching (the job goes on)


@dataclass
class Prepared:
    spec: JobSpec
    files: JobFiles
    script: str
    version: str
    request: dict
    cluster_name: str | None = None       # Slurm's ClusterName, as the login node said it


async def prepare(client: SlurmClient, cluster: Cluster, req: ProfileRequest, spec: JobSpec) -> Prepared:
    spec = options.checked(spec)  # UnsafeValue before Slurm is asked anything
    if (why := profiler_args_error(req.tool, req.profiler_args)) or (
            why := launchers.unsupported(spec.launcher, req.tool, req.profiler_args, req.gpu_metrics)) or (
            why := launchers.command_problem(spec.launcher, req.command)):
        raise UsageError(why)  # playbooks too: a usage error, found before the login node is asked anything
    info = await client.cluster_info()
    root = cluster.report_root(info.home)
    tools = {t: cluster.login.vars[f"{t}_path"] for t in ("nsys", "ncu") if cluster.login.vars.get(f"{t}_path")}
    files = JobFiles(f"{root}/{req.run_id}", root, cluster.login.vars.get("ansible_python_interpreter", "python3"),
                     tools, cluster.login.vars.get("slurm_scratch"), bool(cluster.login.vars.get("fleet_slurm_prolog")))
    # The job runs where the user is: here when fleet runs on the login node, else the login home.
    spec = replace(spec, workdir=spec.workdir or (os.getcwd() if cluster.local else info.home))
    if spec.container and not spec.container.nsight_dirs:
        spec = replace(spec, container=replace(spec.container, nsight_dirs=nsight_dirs(tools)))
    return Prepared(spec, files, render(req, spec, files), info.version_text, request_doc(req, files),
                    info.name if safenames.is_component(info.name) else None)  # the cluster's word: checked


def expected_ranks(spec: dict) -> list[int] | None:
    """The ranks that should each leave a result (``spec`` as the manifest keeps it);
    None when the launcher decides how many there are (torchrun, mpirun, Ray)."""
    if spec.get("ranks") is not None:
        return sorted(spec["ranks"])
    if spec.get("launcher", "srun") != "srun":
        return None
    return list(range(spec.get("ntasks") or (spec.get("nodes") or 1) * (spec.get("ntasks_per_node") or 1)))


def new_manifest(req: ProfileRequest, cluster: Cluster, prep: Prepared, site: str) -> RunManifest:
    manifest = RunManifest.begin(req, site)
    manifest.slurm = SlurmInfo(cluster=cluster.name, cluster_name=prep.cluster_name, login=cluster.login.name,
                               version=prep.version,
                               run_dir=prep.files.run_dir, state="SUBMITTING", spec=asdict(prep.spec),
                               script=prep.script)
    return manifest


def filing_name(cluster: Cluster, cluster_name: str | None) -> str:
    """The store folder of a cluster's runs: Slurm's ClusterName, which every user's inventory
    agrees on, or the inventory's name for the cluster where Slurm did not say (or said
    something that cannot name a folder: it comes from the cluster, and is not trusted)."""
    return cluster_name if safenames.is_component(cluster_name) else cluster.name


async def submit(client: SlurmClient, prep: Prepared) -> str:
    files = {AGENT_FILE: agent_script().encode(), SCRIPT_FILE: prep.script.encode(),
             REQUEST_FILE: json.dumps(prep.request).encode()}
    return await client.submit(prep.files.run_dir, files, SCRIPT_FILE)


async def watch(client: SlurmClient, job_id: str, *, poll: float = 5.0, stop: asyncio.Event | None = None,
                on_state: Callable[[JobState], None] = lambda s: None) -> JobState:
    """Until the job ends. A stop request (Ctrl-C) sends SIGTERM to the job's steps once:
    the profilers stop their applications and finish their reports, and the job ends."""
    interval, last, stopping, failures = POLL_FIRST, None, False, 0
    while True:
        try:
            st = (await client.states([job_id]))[job_id]
            failures = 0
        except SlurmError as e:  # the login node or slurmctld busy for a moment: keep watching
            failures += 1
            if failures >= WATCH_FAILURES:
                raise
            st = JobState(job_id, "UNKNOWN", f"status call failed ({e}); asking again")
        if (st.state, st.reason) != last:
            on_state(st)
            last = (st.state, st.reason)
        if st.terminal:
            return st
        if stop is not None and stop.is_set() and not stopping:
            await client.cancel([job_id], signal="TERM")
            stopping = True
        try:
            await asyncio.wait_for(stop.wait() if stop is not None and not stopping else asyncio.sleep(interval),
                                   interval)
        except asyncio.TimeoutError:
            pass
        interval = min(interval * 1.5, poll)


def _why_missing(rank: int, st: JobState | None, log: str) -> str:
    state = st.state if st else "unknown"
    if state == "CANCELLED":
        return f"rank {rank} left no result: the job was cancelled before it finished ({log})"
    if state == "TIMEOUT":
        return f"rank {rank} left no result: killed at the time limit before its report was finished ({log})"
    return f"rank {rank} left no result (job {state}; see {log})"


def rank_entry(res: dict, reports: list[ReportEntry] = (), tool: str | None = None) -> HostEntry:
    """A rank's entry from the result it left (its node facts are in it: ``wire.facts``'s keys)
    and what came home of it."""
    status, why = outcome.of_result(res, list(reports), tool=tool)
    return HostEntry.from_facts(
        res.get("slurm_node") or res.get("node"), status, res, rank=res.get("rank"), missing_why=why,
        tenants_seen=[t if isinstance(t, str) else _tenant_text(t) for t in res.get("tenants") or []],
        given_up=res.get("given_up") or [], result=res, reports=reports)


def _tenant_text(t: dict) -> str:
    return f"GPU {t.get('gpu')}: pid {t.get('pid')} ({t.get('user') or 'unknown user'}) {t.get('why')}"


async def gather(fan: "Fanout", client: SlurmClient, manifest: RunManifest, directory: Path,
                 state: JobState | None, gathering=None) -> RunManifest:
    """Bring every rank's reports home into ``directory/NODE/``; say which ranks left nothing and why."""
    slurm = manifest.slurm
    results, marks = await client.read_results(slurm.run_dir)
    if state is not None:
        slurm.state, slurm.exit_code, slurm.nodes, slurm.reason = state.state, state.exit_code, state.nodes, \
            state.reason
    slurm.job_exit = int(marks["job.exit"]) if marks.get("job.exit", "").lstrip("-").isdigit() else None
    slurm.stopped_before_time_limit = "job.stopped" in marks
    log = f"slurm-{slurm.job_id}.out"
    if "slurm" in marks:  # slurm-JOBID.out: its size, sha256 and path, from a line the job could write too
        size, sha, path = (marks["slurm"].split(" ", 2) + ["", ""])[:3]
        job_log = {"path": path, "size": int(size) if size.isdigit() else size, "sha256": sha}
        if file_problem(job_log, slurm.run_dir) is None:
            slurm.log = ReportEntry.from_json(await fetch_verified(
                fan, client.login, job_log, directory / os.path.basename(path)))

    tool = (manifest.request or {}).get("tool")

    async def one(res: dict) -> HostEntry:
        wrong = wire.problems(res, "profile")
        node = res.get("slurm_node") or res.get("node")
        # The node's name comes from a result file in the run directory, which the job can write:
        # one that is not a folder name, or a result not of its shape, brings nothing home.
        problem = "; ".join(wrong[:3]) if wrong else safenames.component_problem(node, "the node name in a rank's result")
        if problem:
            rank = res.get("rank") if isinstance(res.get("rank"), int) else None
            return HostEntry(str(node), HostStatus.FAILED, rank=rank, missing_why=f"a malformed result: {problem}")
        reports = []
        if res.get("status") in ("ok", "yielded"):
            # Written to node-local scratch, they now are in the run directory, under the same names.
            to_fetch = [dict(r, path=f"{slurm.run_dir}/{node}/{os.path.basename(r['path'])}")
                        for r in (res.get("reports") or []) + (res.get("summaries") or [])]
            reports = await bring_home(fan, client.login, to_fetch, directory / node,
                                       node_dir=f"{slurm.run_dir}/{node}", gathering=gathering)
        return rank_entry(res, reports, tool)

    # Ranks come home side by side (the transport bounds transfers per login connection).
    ordered = sorted(results, key=lambda r: (not isinstance(r.get("rank"), int), r.get("rank") if isinstance(
        r.get("rank"), int) else 0, str(r.get("host") or "")))
    hosts = list(await asyncio.gather(*(one(res) for res in ordered)))
    for line in marks["ray"]:  # Ray's workers, named worker-HOST-PID.nsys-rep (no rank, no agent)
        size, sha, path = (line.split(" ", 2) + ["", ""])[:3]
        node = os.path.basename(path).removesuffix(".nsys-rep")[len("worker-"):].rsplit("-", 1)[0] or "ray"
        if not safenames.is_component(node):  # named by a file the job wrote
            hosts.append(HostEntry(str(node), HostStatus.FAILED, worker=os.path.basename(path),
                                   missing_why=safenames.component_problem(node, "the Ray worker's node name")))
            continue
        report = {"path": path, "size": int(size) if size.isdigit() else size, "sha256": sha}
        reports = await bring_home(fan, client.login, [report], directory / node, node_dir=f"{slurm.run_dir}/ray")
        gone = outcome.lost(reports)
        hosts.append(HostEntry(node, HostStatus.FAILED if gone else HostStatus.OK, worker=os.path.basename(path),
                               missing_why=gone[0].error if gone else None, reports=reports))
    seen = {e.rank for e in hosts}
    ranks = expected_ranks(slurm.spec)
    for rank in ranks if ranks is not None else ([] if hosts else [0]):
        if rank not in seen:
            hosts.append(HostEntry("(no result)", HostStatus.MISSING, rank=rank,
                                   missing_why=_why_missing(rank, state, log)))
    manifest.hosts = hosts
    manifest.status = "cancelled" if state is not None and state.state == "CANCELLED" else \
        outcome.run_status(h.status for h in hosts)
    return manifest


async def profile(fan: "Fanout", cluster: Cluster, req: ProfileRequest, spec: JobSpec, *, store_root: Path,
                  site: str | None = None, dry_run: bool = False, wait: bool = True, poll: float = 5.0,
                  stop: asyncio.Event | None = None, on_state: Callable[[JobState], None] = lambda s: None,
                  gathering=None, client: SlurmClient | None = None) -> RunManifest:
    """The whole run; returns its manifest (for ``--dry-run``, one with the script and no job).
    It is filed under ``site``, by default the cluster's name (:func:`filing_name`)."""
    if site is not None:
        store.run_dir(store_root, site, req.run_id)  # a site that is no folder name stops here, before the cluster
    client = client or SlurmClient(fan, cluster.login)
    prep = await prepare(client, cluster, req, spec)
    manifest = new_manifest(req, cluster, prep, site or filing_name(cluster, prep.cluster_name))
    if dry_run:
        manifest.status = "dry-run"
        return manifest
    directory = store.save(store_root, manifest)  # before sbatch: a run is never untracked
    try:
        manifest.slurm.job_id = await submit(client, prep)
    except Exception as e:
        manifest.status, manifest.error, manifest.slurm.state = "failed", str(e), "NOT SUBMITTED"
        store.save(store_root, manifest)
        raise
    manifest.status, manifest.slurm.state = "submitted", "PENDING"
    store.save(store_root, manifest)
    if not wait:
        return manifest
    state = await watch(client, manifest.slurm.job_id, poll=poll, stop=stop, on_state=on_state)
    manifest = await gather(fan, client, manifest, directory, state, gathering)
    store.save(store_root, manifest)
    return manifest


async def gather_later(fan: "Fanout", cluster: Cluster, manifest_path: Path, store_root: Path) -> RunManifest:
    """``fleet gather RUN`` for a Slurm run: the job's state once, then what it left."""
    manifest = store.read_manifest(manifest_path)
    client = SlurmClient(fan, cluster.login)
    await client.cluster_info()
    job = manifest.slurm.job_id
    state = (await client.states([job]))[job] if job else None
    if state is not None and not state.terminal:
        manifest.slurm.state = state.state
        return manifest
    manifest = await gather(fan, client, manifest, manifest_path.parent, state)
    store.save(store_root, manifest)
    return manifest
