"""``fleet profile --partition``: one run is one batch job, from submission to the store.

Three steps, each a few round trips to the login node: ``prepare`` (Slurm's
version and the user's home: one call, read-only, also for ``--dry-run``),
``submit`` (the agent and the script put in the run's directory and
``sbatch``ed: one call), ``watch`` (one batched status call per interval, with
backoff: :mod:`fleet.slurm.watch`) and ``gather`` (every rank's result read in one call, then its
reports fetched and verified against the sha256 the compute node computed).
The manifest is written at each step, so ``fleet gather RUN`` can finish a run
whose fleet went away.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import outcome, safenames, store
from ..agent import wire
from ..agent.messages import ProfileResult, ReportFile
from ..agent.bundle import script as agent_script
from ..rundir import RunDir
from ..statuses import HostStatus, RunStatus
from ..collection.bring import bring_home, file_problem
from ..collection.fetch import fetch_verified
from ..store.manifest import HostEntry, ReportEntry, RunManifest, SlurmInfo
from ..plan import ProfileRequest
from .cluster import Cluster
from .jobs import NoGPUs, SlurmClient, file_mark
from .jobstate import JobMarks, JobShape, JobState
from .raygather import driver_entry, ray_home
from .results import RankResult, this_runs
from .states import job_end_verdict, job_refusal, no_gpus, why_missing
from .watch import NeverStarts, watch
from ..wrapping.containers import nsight_dirs, slurm_words
from .script import AGENT_FILE, REQUEST_FILE, SCRIPT_FILE, JobFiles, render, request_doc
from .options import CheckedJobSpec

if TYPE_CHECKING:
    from ..transport import Fanout

@dataclass
class Prepared:
    spec: CheckedJobSpec
    files: JobFiles
    script: str
    version: str
    request: dict
    cluster_name: str | None = None       # Slurm's ClusterName, as the login node said it
    # which Python the agent runs with on the compute nodes, and why
    python_note: str = ""


async def prepare(client: SlurmClient, cluster: Cluster, req: ProfileRequest,
                  spec: CheckedJobSpec) -> Prepared:
    """What will be submitted. ``spec`` was checked against ``req`` once (``options.checked``):
    the inventory's values it takes on are checked here, before the login node is asked anything."""
    # a caller's slip: options.checked finds the usage errors first
    if not isinstance(spec, CheckedJobSpec):
        raise TypeError("a job is prepared from options.checked's CheckedJobSpec, not "
                        f"{type(spec).__name__}")
    tools = {t: cluster.login.vars[f"{t}_path"] for t in ("nsys", "ncu")
             if cluster.login.vars.get(f"{t}_path")}
    scratch = cluster.login.vars.get("slurm_scratch")
    inventory_values(cluster, spec, tools, scratch)
    info = await client.cluster_info(spec.partition)
    if spec.partition and req.uses_counters and (why := no_gpus(spec.partition, info.gres,
                                                                counters_word(req))):
        raise NoGPUs(why)
    root = cluster.report_root(info.home)
    python, python_note = agent_python(cluster, info.python)
    files = JobFiles(f"{root}/{req.run_id}", root, python, tools, scratch,
                     bool(cluster.login.vars.get("fleet_slurm_prolog")), python_note,
                     secrets.token_hex(16))
    # The job runs where the user is: here when fleet runs on the login node, else the login home.
    spec = replace(spec, workdir=spec.workdir or (os.getcwd() if cluster.local else info.home))
    if spec.container and not spec.container.nsight_dirs:
        spec = replace(spec, container=replace(spec.container, nsight_dirs=nsight_dirs(tools)))
    return Prepared(spec, files, render(req, spec, files), info.version_text,
                    request_doc(req, files),
                    # the cluster's word: checked
                    info.name if safenames.is_component(info.name) else None,
                    python_note)


def counters_word(req: ProfileRequest) -> str:
    return "--tool ncu" if req.tool == "ncu" else "--gpu-metrics"


def inventory_values(cluster: Cluster, spec: CheckedJobSpec, tools: dict,
                     scratch: str | None) -> None:
    """UnsafeValue for an inventory value of the login host that the batch script could not take
    (the agent's Python, the run folder, scratch; the folders a container mounts), found before
    the login node is asked anything: the script would refuse it only once it had answered."""
    # under the login home, which comes later
    report_dir = str(cluster.login.vars.get("report_dir") or "")
    safenames.sbatch_word(report_dir, "report_dir")
    if (named := cluster.login.vars.get("ansible_python_interpreter")):
        safenames.quote(named, "the agent Python (ansible_python_interpreter)")
    if scratch is not None:
        safenames.check_text(scratch, "slurm_scratch")
    if spec.container is not None:
        slurm_words(replace(spec.container, nsight_dirs=spec.container.nsight_dirs
                            or nsight_dirs(tools)),
                    report_dir or "/", scratch)


def agent_python(cluster: Cluster, probed: str | None) -> tuple[str, str]:
    """The Python the agent is started with on the compute nodes, by absolute path (a job under
    --export=NONE or Apptainer's --cleanenv has no PATH to find a bare ``python3`` on), and
    where it came from: the inventory's ``ansible_python_interpreter``, else the login node's
    ``command -v python3`` (the batch script checks it exists on the node before any rank)."""
    named = cluster.login.vars.get("ansible_python_interpreter")
    if named:
        return str(named), f"{named} (the inventory's ansible_python_interpreter)"
    if probed:
        return (probed,
                f"{probed} (the login node's python3; set ansible_python_interpreter to choose)")
    return "python3", ("python3 from the job's PATH (the login node has none on its PATH: a job "
                       "under --export=NONE will not find it; set ansible_python_interpreter)")


def expected_ranks(shape: JobShape) -> list[int] | None:
    """The ranks that should each leave a result; None when the launcher decides how many there
    are (torchrun, mpirun, Ray)."""
    # its --ranks names actors (patterns), each a worker of its own
    if shape.launcher == "ray":
        return None
    if shape.ranks is not None:
        return sorted(shape.ranks)
    if shape.launcher != "srun":
        return None
    return list(range(shape.ntasks or (shape.nodes or 1) * (shape.ntasks_per_node or 1)))


def new_manifest(req: ProfileRequest, cluster: Cluster, prep: Prepared, site: str) -> RunManifest:
    manifest = RunManifest.begin(req, site)
    manifest.slurm = SlurmInfo(cluster=cluster.name, cluster_name=prep.cluster_name,
                               login=cluster.login.name,
                               version=prep.version, python=prep.python_note or None,
                               run_dir=prep.files.run_dir, state="SUBMITTING",
                               spec=prep.spec.to_json(),
                               script=prep.script, result_nonce=prep.files.nonce or None)
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


def rank_entry(res: dict, reports: list[ReportEntry] = (), tool: str | None = None, *,
               fleet_stopped: bool = False, answer: ProfileResult | None = None) -> HostEntry:
    """A rank's entry from the result it left (its node facts are in it: ``NodeState.facts``),
    what came home of it, and whether fleet recorded a stop of the job (its stop marks).
    ``answer``: the result already read into its types, else it is read here."""
    answer = answer if answer is not None else ProfileResult.read(res)
    status, why = outcome.of_result(answer, list(reports), tool=tool, fleet_stopped=fleet_stopped)
    return HostEntry.from_facts(answer.node, status, answer.facts, rank=answer.rank,
                                missing_why=why,
                                tenants_seen=answer.tenants, given_up=answer.given_up, result=res,
                                answer=answer, reports=reports)


async def gather(fan: "Fanout", client: SlurmClient, manifest: RunManifest, directory: Path,
                 state: JobState | None, gathering=None) -> RunManifest:
    """Bring every rank's reports home into ``directory/NODE/``; say which ranks left nothing and
    why; then the job's end state is applied to the ranks (:func:`states.job_end_verdict`)."""
    slurm = manifest.slurm
    found, marks = await client.read_results(slurm.run_dir)
    results, refused = this_runs(found, marks, slurm.result_nonce)
    _job_end(slurm, state, marks)
    found = file_mark(marks.log)  # slurm-JOBID.out
    if found and file_problem(found, slurm.run_dir) is None:
        log = ReportFile.read(found)
        slurm.log = ReportEntry.from_json(await fetch_verified(fan, client.login, log,
                                                               directory / os.path.basename(
                                                                   log.path)))
    tool = manifest.asked.tool
    tail = _log_tail(slurm.log)
    refusal = job_refusal(slurm.job_exit, tail, marks.script_refused)
    # recorded before its signal
    fleet_stopped = marks.stopped or marks.stop_asked

    async def one(res: RankResult) -> HostEntry:
        return await _rank_home(fan, client, slurm.run_dir, res, directory, gathering, tool,
                                fleet_stopped)

    # Ranks come home side by side (the transport bounds transfers per login connection).
    hosts = sorted(await asyncio.gather(*(one(res) for res in results)) + refused, key=lambda e: (
        not isinstance(e.rank, int), e.rank if isinstance(e.rank, int) else 0, e.host))
    hosts += await ray_home(fan, client, slurm.run_dir, list(marks.ray),
                            directory) + driver_entry(slurm, refusal)
    hosts += await _missing_ranks(fan, client, slurm, hosts, list(marks.orphans), directory,
                                  state, gathering, refusal, tail)
    # Slurm's own count, which no gap between two looks misses
    slurm.requeues = max(slurm.requeues, state.requeues if state is not None else 0,
                         marks.restarts)
    end = job_end_verdict(slurm.state, hosts, requeues=slurm.requeues,
                          stopped_before_time_limit=slurm.stopped_before_time_limit,
                          stopped_by_fleet=fleet_stopped)
    slurm.end, manifest.hosts = end.note, end.hosts
    manifest.status = RunStatus.CANCELLED if state is not None and state.state == "CANCELLED" else \
        outcome.run_status(h.status for h in manifest.hosts)
    return manifest


def _job_end(slurm: SlurmInfo, state: JobState | None, marks: JobMarks) -> None:
    """The job's end as Slurm said it (``state``) and as its batch script marked it (``marks``)."""
    if state is not None:
        slurm.state, slurm.exit_code, slurm.nodes, slurm.reason = (state.state, state.exit_code,
                                                                   state.nodes, state.reason)
    slurm.job_exit = marks.job_exit
    slurm.stopped_before_time_limit = marks.stopped


async def _missing_ranks(fan: "Fanout", client: SlurmClient, slurm: SlurmInfo,
                         hosts: list[HostEntry],
                         orphan_lines: list[str], directory: Path, state: JobState | None,
                         gathering, refusal: str | None, tail: str) -> list[HostEntry]:
    """A missing entry for each rank expected that left no result among ``hosts``, and why; with the
    report it finished where it was killed before writing its result."""
    seen = {e.rank for e in hosts}
    ranks = expected_ranks(JobShape.read(slurm.spec))
    orphans = _orphans(orphan_lines)
    log = RunDir("").batch_log_of(slurm.job_id)
    missing = []
    for rank in ranks if ranks is not None else ([] if hosts else [0]):
        if rank in seen:
            continue
        if rank in orphans:  # killed before it wrote its result: the report it finished comes home
            node, found = orphans[rank]
            reports = await bring_home(fan, client.login, [found], directory / node,
                                       node_dir=RunDir(slurm.run_dir).node(node).path,
                                       gathering=gathering)
            missing.append(HostEntry(node, HostStatus.MISSING, rank=rank, reports=reports,
                                     missing_why=(f"rank {rank} on {node} left no result (it was "
                                                  "killed first; job "
                                                  f"{state.state if state else 'unknown'}, see "
                                                  f"{log}); the report it left was brought home, "
                                                  "unchecked by its agent")))
        else:
            missing.append(HostEntry("(no result)", HostStatus.MISSING, rank=rank,
                                     missing_why=why_missing(rank, state.state if state else None,
                                                             log, refusal, tail)))
    return missing


async def _rank_home(fan: "Fanout", client: SlurmClient, run_dir: str, res: RankResult,
                     directory: Path, gathering, tool: str | None,
                     fleet_stopped: bool = False) -> HostEntry:
    """One rank's result, held to its shape, and what it names brought home from its node's
    folder."""
    wrong = wire.problems(res.body, "profile")
    answer = res.answer
    node = answer.node
    # The node's name comes from a result file in the run directory, which the job can write:
    # one that is not a folder name, or a result not of its shape, brings nothing home.
    problem = ("; ".join(wrong[:3]) if wrong
               else safenames.component_problem(node, "the node name in a rank's result"))
    if problem:
        return HostEntry(str(node or "(malformed result)"), HostStatus.FAILED, rank=answer.rank,
                         missing_why=f"the rank's result is malformed ({problem}); nothing of it "
                                     "was brought home")
    reports = []
    if answer.made_reports:
        # Written to node-local scratch, they now are in the run directory, under the same names.
        folder = RunDir(run_dir).node(node)
        to_fetch = [dict(r, path=folder.file(os.path.basename(r["path"])))
                    for r in wire.named_files(res.body)]
        reports = await bring_home(fan, client.login, to_fetch, directory / node,
                                   node_dir=folder.path, gathering=gathering)
    return rank_entry(res.body, reports, tool, fleet_stopped=fleet_stopped, answer=answer)


def _log_tail(log: ReportEntry | None) -> str:
    """The end of the job's log as it came home (verified), else nothing."""
    if log is None or not log.verified or not log.stored:
        return ""
    try:
        with open(log.stored, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _orphans(lines: list[str]) -> dict[int, tuple[str, dict]]:
    """Reports of ranks that left no result (NODE/rankN.nsys-rep or .ncu-rep), by rank."""
    out = {}
    for line in lines:
        found = file_mark(line)
        if found is None:
            continue
        node, name = found["path"].split("/")[-2:]
        rank = RunDir.rank_of(name.split(".")[0])
        if rank is not None and safenames.is_component(node):
            out.setdefault(rank, (node, found))
    return out


async def profile(fan: "Fanout", cluster: Cluster, req: ProfileRequest, spec: CheckedJobSpec, *,
                  store_root: Path,
                  site: str | None = None, dry_run: bool = False, wait: bool = True,
                  poll: float = 5.0,
                  stop: asyncio.Event | None = None, on_state: Callable[[JobState],
                                                                        None] = lambda s: None,
                  gathering=None, client: SlurmClient | None = None, keep_pending: bool = False,
                  on_python: Callable[[str], None] = lambda s: None) -> RunManifest:
    """The whole run; returns its manifest (for ``--dry-run``, one with the script and no job).
    It is filed under ``site``, by default the cluster's name (:func:`filing_name`)."""
    if site is not None:
        # a site that is no folder name stops here, before the cluster
        store.run_dir(store_root, site, req.run_id)
    client = client or SlurmClient(fan, cluster.login)
    prep = await prepare(client, cluster, req, spec)
    manifest = new_manifest(req, cluster, prep, site or filing_name(cluster, prep.cluster_name))
    if dry_run:
        on_python(prep.python_note)
        manifest.status = RunStatus.DRY_RUN
        return manifest
    directory = store.save(store_root, manifest)  # before sbatch: a run is never untracked
    try:
        manifest.slurm.job_id = await submit(client, prep)
    except Exception as e:
        manifest.status, manifest.error, manifest.slurm.state = (RunStatus.FAILED, str(e),
                                                                 "NOT SUBMITTED")
        store.save(store_root, manifest)
        raise
    # said once a job will run with it (a refused one gets its one line alone)
    on_python(prep.python_note)
    manifest.status, manifest.slurm.state = RunStatus.SUBMITTED, "PENDING"
    submitted = time.time()
    store.save(store_root, manifest)
    if not wait:
        return manifest
    try:
        state = await watch(client, manifest.slurm.job_id, poll=poll, stop=stop, on_state=on_state,
                            submitted=submitted, keep_pending=keep_pending,
                            run_dir=manifest.slurm.run_dir)
    except NeverStarts as e:
        manifest.status, manifest.error = RunStatus.FAILED, str(e)
        manifest.slurm.state = "PENDING" if keep_pending else "CANCELLED"
        store.save(store_root, manifest)
        raise
    manifest = await gather(fan, client, manifest, directory, state, gathering)
    store.save(store_root, manifest)
    return manifest


async def gather_later(fan: "Fanout", cluster: Cluster, manifest_path: Path,
                       store_root: Path) -> RunManifest:
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
