"""``fleet profile`` on lab servers: probe, plan, run the agent, bring the reports home.

Two calls per node over one connection: the probe, and the run, whose agent is started beside the
probe and sent its plan once every host is planned and the run saved (fleet/lab/ahead.py). The
policy decides; the agent acts on the node; this module only moves plans, output and reports, and
says what happened on each node.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import agentcall, completeness, outcome, policy, safenames, since_started, store
from ..agent import wire
from ..agent.messages import ProfileResult
from ..statuses import HostStatus, RunStatus
from ..collection.bring import bring_home
from ..store.manifest import HostEntry, ReportEntry, RunManifest
from ..plan import LabPart, Plan, ProfileRequest, plan
from ..policy import NO_SAMPLING_FLAGS, NodeState, docker_privileges, tool_found
from ..transport import Result
from . import ahead, leftrunning
from ..placement import free as placement
from ..wrapping import containers, launchers
from .ranks import LAB_LAUNCHERS, with_missing_ranks
from .sink import LineSink

if TYPE_CHECKING:
    from ..inventory import Host
    from ..transport import Fanout

# The agent's own bounds past --timeout (nsys's backstop, a wedged profiler's kill, the importer,
# nsys stats) add up to well under this: a node that has not answered by then has gone silent.
FINISH_TIMEOUT = 3600.0


@dataclass
class HostRun:
    host: str
    status: str = HostStatus.PENDING
    plan: Plan | None = None
    state: NodeState | None = None   # what the probe found
    result: dict | None = None       # the agent's document, as the manifest keeps it
    answer: ProfileResult | None = None  # that document read into its types, once
    reports: list[ReportEntry] = field(default_factory=list)
    error: str | None = None
    gpus: tuple[int, ...] | None = None  # the GPUs --gpu free chose here (else the request's)


def with_launcher(req: ProfileRequest, launcher: str) -> ProfileRequest:
    """The request with its ranks started by ``launcher`` on each host (the plan puts the profiler
    between the launcher's options and the program: fleet.plan._launched); LauncherError, before
    any host is asked anything, where that cannot be done as fleet promises."""
    if launcher not in LAB_LAUNCHERS:
        raise launchers.LauncherError(
            f"--launcher {launcher}: on lab servers one of {', '.join(LAB_LAUNCHERS)} (srun and "
            "ray start their workers in a Slurm job: --partition)")
    if (why := launchers.command_problem(launcher, req.command)):
        raise launchers.LauncherError(why)
    k = launchers.script_index(list(req.command), launcher)
    if launcher == "mpirun" and (far := launchers.mpirun_other_hosts(list(req.command[1:k]))):
        raise launchers.LauncherError(
            "--launcher mpirun on lab servers starts every rank on the host given (--hosts); "
            f"{far} would start ranks on hosts fleet has not checked for tenants, nor watches: "
            "give each host to --hosts")
    if req.uses_counters:
        # Every rank runs a profiler of its own on the host's GPUs: several would program the
        # counters of one GPU at once, which the run's GPU lock (one per run) cannot keep apart.
        raise launchers.LauncherError(
            f"--launcher {launcher} on lab servers runs one profiler per rank: ncu and "
            "--gpu-metrics program GPU counters that only one profiler at a time may use: trace "
            f"with nsys, or give ncu one rank's program without {launcher}")
    if req.docker_image:
        raise launchers.LauncherError(f"--launcher {launcher} and --docker do not go together "
                                      f"yet: {launcher} would have to be in the image; leave out "
                                      "one of them")
    starts, program = launchers.lab_launch(launcher, list(req.command))
    ranks, _ = launchers.rank_count(launcher, list(req.command), tuple(req.profiler_args))
    return replace(req, lab=replace(req.lab or LabPart(), launcher=launcher, starts=starts,
                                    program=program, ranks=ranks))


async def plan_all(fan: "Fanout", hosts: list["Host"], req: ProfileRequest, *,
                   free: placement.FreeGpus | None = None) -> dict[str, HostRun]:
    """Round trip 1: probe every node and plan (or refuse) the run there. ``free`` (--gpu free):
    on each host a GPU nobody else is on (fleet.placement.free), or the ``count`` least busy of
    them across the hosts; a host left out by the count is not in the run (``free.left_out``)."""
    runs = {h.name: HostRun(h.name) for h in hosts}
    unsafe = unsafe_names(hosts)
    for name, why in unsafe.items():
        runs[name].status, runs[name].error = HostStatus.FAILED, why
    probed = await _probed(fan, [h for h in hosts if h.name not in unsafe], runs, req.tool)
    choices = _placed(probed, runs, req, free.count) if free is not None else {}
    for h in probed:
        choice = choices.get(h.name)
        if choice is not None and choice.gpu is None and not choice.refused:
            free.left_out[h.name] = choice.why  # left out by --count: not part of this run
            del runs[h.name]
            continue
        _plan_host(h, runs[h.name], req, choice)
    return runs


def unsafe_names(hosts: list["Host"]) -> dict[str, str]:
    """The hosts whose names are no safe file name, and why. The inventory refuses such names when
    it is read; a host made some other way is kept off the nodes, since its name becomes the
    report's, the result's and the store's paths."""
    return {h.name: why for h in hosts
            if (why := safenames.component_problem(h.name, "host name"))}


async def _probed(fan: "Fanout", hosts: list["Host"], runs: dict[str, HostRun],
                  tool: str) -> list["Host"]:
    """The hosts whose probe answered with a state (kept in their run); the others' runs say why
    not. Only the run's own profiler is asked its version."""
    for h, r in zip(hosts, await agentcall.probe(fan, hosts, environment_check=False,
                                                 versions=(tool,))):
        run = runs[h.name]
        if r.extra.get("state") is None:
            run.status, run.error = (HostStatus.UNREACHABLE if not r.reached
                                     else HostStatus.FAILED), r.error
        else:
            run.state = r.extra["state"]
    return [h for h in hosts if runs[h.name].state is not None]


def _placed(hosts: list["Host"], runs: dict[str, HostRun], req: ProfileRequest,
            count: int | None) -> dict:
    states = {h.name: runs[h.name].state for h in hosts}
    request = policy.Request(allow_own=req.allow_own)
    try:
        return placement.across(states, request, count) if count else placement.per_host(states,
                                                                                         request)
    # a state of its shape, with values unusable
    except (TypeError, KeyError, AttributeError, ValueError) as e:
        return {h: placement.Choice(None,
                                    "--gpu free: a probe answer cannot be placed on: "
                                    f"{type(e).__name__}: {e}",
                                    refused=True) for h in states}


def _plan_host(h: "Host", run: HostRun, req: ProfileRequest, choice) -> None:
    """One probed host's plan, on the GPU ``choice`` gave it (--gpu free), or its refusal."""
    if choice is not None and choice.refused:
        run.plan = Plan(h.name, policy.REFUSED, (choice.why,),
                        "wait until a GPU is free, or name one with --gpu N")
        run.status, run.error = HostStatus.REFUSED, choice.why
        return
    if choice is not None:
        req = replace(req, lab=replace(req.lab or LabPart(), gpus=(choice.gpu,)))
        run.gpus = (choice.gpu,)
    try:
        run.plan = plan(h.name, run.state, req, h.vars.get("owned_sysctls"))
        if req.docker_image and run.plan.status == "ok":
            run.plan = in_docker(run.plan, run.state, req, h.vars.get("docker_seccomp_profile"))
    except (TypeError, KeyError, AttributeError, ValueError) as e:
        # The probe's answer had its shape, yet a value in it the planner cannot use: this
        # node's answer is not believed, and the other hosts go on.
        run.status = HostStatus.FAILED
        run.error = f"{h.name}'s probe answer cannot be planned on: {type(e).__name__}: {e}"
        run.state = None
        return
    if choice is not None:
        run.plan = replace(run.plan, placement=choice.why)
    run.status = HostStatus.PLANNED if run.plan.status == "ok" else HostStatus.REFUSED
    if run.status == HostStatus.REFUSED:
        run.error = "; ".join(run.plan.reasons)


def in_docker(p: Plan, state: NodeState, req: ProfileRequest, seccomp_profile: str | None) -> Plan:
    """The plan with the profiler and workload inside ``docker run``, with the least privilege
    the policy grants it (sampling given up where Docker cannot allow it)."""
    sampling = not set(NO_SAMPLING_FLAGS) <= set(p.command.fleet_flags)
    granted = docker_privileges(p.tool, req.uses_counters, sampling, seccomp_profile)
    if granted.given_up:
        p = p.without_sampling(granted.given_up)
    uuids = p.env.get("CUDA_VISIBLE_DEVICES")
    found = {t: tool_found(state, t) for t in ("nsys", "ncu")}
    tools = {t: f.path for t, f in found.items() if f is not None}
    wrapper = containers.docker_run(
        containers.Container("docker", req.docker_image, containers.nsight_dirs(tools)),
        p.report_dir, user=f"{state.uid}:{state.gid}",
        gpus=tuple(uuids.split(",")) if uuids else None, privileges=granted)
    env = {k: v for k, v in p.env.items() if k != "CUDA_VISIBLE_DEVICES"}  # --gpus chose them
    return replace(p, command=replace(p.command, wrapper=tuple(wrapper)), env=env)


async def run_planned(fan: "Fanout", hosts: list["Host"], runs: dict[str, HostRun],
                      req: ProfileRequest, *,
                      out: Path, write: Callable[[str, str], None] = lambda s, t: None,
                      stop: asyncio.Event | None = None, gathering=None,
                      finish_timeout: float | None = None,
                      started: dict[str, ahead.Ahead] | None = None) -> None:
    """Round trip 2: the agent carries out each planned run; the reports come home. With a
    --timeout the round trip is bounded (the workload's time, then ``finish_timeout``); without
    one, SSH keepalives decide when a node has gone silent. ``started``: agents started ahead
    (fleet/lab/ahead.py), sent their plans here; a host without one is started now."""
    # --count left some out
    todo = [h for h in hosts if h.name in runs and runs[h.name].status == HostStatus.PLANNED]
    # Nodes that share a report directory (inventory: shared_report_dir: LABEL) are read
    # through one of them, once, instead of each over its own connection.
    readers: dict[str, "Host"] = {}
    for h in todo:
        label = h.vars.get("shared_report_dir")
        if label:
            readers.setdefault(label, h)

    bound, started = run_bound(req, finish_timeout), started or {}

    async def one(host: "Host") -> Result:
        run = runs[host.name]
        # The launcher is said in the result's whose, as a Slurm rank's is: each rank's report
        # beside it.
        context = {"whose": {"launcher": req.launcher}} if req.launcher else {}
        args = {"mode": "profile", "plan": run.plan.to_json(), "context": context}
        agent = started.get(host.name)  # started ahead, and still waiting for its plan: sent it
        agent = agent if agent is not None and agent.waiting else None
        sink = agent.sink if agent else LineSink(host.name, False, write)
        sink.prefix = len(todo) > 1
        r = await (agent.send(args) if agent else _started_now(fan, host, args, sink, stop, bound))
        sink.flush()
        run.result = sink.result
        if run.result is None:
            run.status = (HostStatus.UNREACHABLE if not r.reached or r.error_kind == "timeout"
                          else HostStatus.FAILED)
            run.error = (sink.malformed or r.error
                         or f"the agent ended (exit {r.exit_status}) without a result: "
                            f"{r.stderr.decode(errors='replace').strip()[-300:]}")
            if r.error_kind == "timeout":
                run.error += f"; bring home what it finished later with: fleet gather {req.run_id}"
            return r
        answer = run.answer = ProfileResult.read(run.result)
        if answer.made_reports:
            via = readers.get(host.vars.get("shared_report_dir"), host)
            run.reports += await bring_home(fan, via, wire.named_files(run.result),
                                            safenames.join(out, host.name, what="host name"),
                                            node_dir=os.path.dirname(run.plan.output),
                                            gathering=gathering,
                                            read_through=via is not host, remove_for=removing(host),
                                            output=run.plan.output)
        run.status, run.error = outcome.of_result(answer, run.reports, tool=run.plan.tool,
                                                  allow_own=completeness.allows_own(run.plan))
        return r

    await fan.each(todo, one)


async def profile(fan: "Fanout", hosts: list["Host"], req: ProfileRequest, *, store_root: Path,
                  site: str,
                  dry_run: bool = False, write: Callable[[str, str], None] = lambda s, t: None,
                  stop: asyncio.Event | None = None, gathering=None,
                  finish_timeout: float | None = None,
                  free: placement.FreeGpus | None = None) -> RunManifest:
    """Probe, plan, run; the reports and the run's manifest go into the store. The manifest back
    (for ``dry_run``, one with every host's plan, in the store nowhere). ``free``: --gpu free."""
    # a site that is no folder name stops here, before any node
    store.run_dir(store_root, site, req.run_id)
    manifest = RunManifest.begin(req, site)
    # each node's agent starts now and waits for its plan (none for a dry run: nothing runs; none
    # on a host whose name plan_all refuses: such a host is kept off the nodes)
    unsafe = unsafe_names(hosts)
    safe = [h for h in hosts if h.name not in unsafe]
    started: dict[str, ahead.Ahead] = {}
    try:
        if not dry_run:
            started = ahead.start(fan, safe, write=write, stop=stop,
                                  bound=run_bound(req, finish_timeout))
        runs = list((await plan_all(fan, hosts, req, free=free)).values())
        # the agents of hosts refused, unreachable or left out end now, not with the run
        ahead.tell_none(started, but={r.host for r in runs if r.status == HostStatus.PLANNED})
        # connected, probed and planned: each node's run starts
        manifest.phases = {"probed": since_started()}
        manifest.hosts = [entry_for(req, r) for r in runs]
        if dry_run:
            manifest.status = RunStatus.DRY_RUN
            return manifest
        # Written before anything runs, so that `fleet gather` can finish the run if fleet dies.
        directory = store.save(store_root, manifest)
        await run_planned(fan, hosts, {r.host: r for r in runs}, req, out=directory, write=write,
                          stop=stop, gathering=gathering, finish_timeout=finish_timeout,
                          started=started)
    except asyncio.CancelledError:  # a second Ctrl-C: the agents sent nothing are not waited for
        ahead.abandon(started)
        raise
    finally:  # an agent sent no plan ends having done nothing
        await ahead.release(started)
    manifest.phases["home"] = since_started()  # every node answered, its files home and verified
    manifest.hosts = with_missing_ranks([entry_for(req, r) for r in runs])
    manifest.status = outcome.run_status(h.status for h in manifest.hosts)
    # `fleet jobs` finds it, `fleet cancel` ends it
    leftrunning.mark(store.save(store_root, manifest), manifest)
    return manifest


async def _started_now(fan: "Fanout", host: "Host", args: dict, sink: LineSink,
                       stop: asyncio.Event | None, bound: float | None) -> Result:
    """A host's run, its agent started with its plan (one not started ahead)."""
    argv, stdin = agentcall.agent_call(host, args)
    # --timeout plus --finish-timeout bound it all: no grace past them (the agent stops itself in
    # time)
    return await fan.run(host, argv, input=stdin, sink=sink, stop=stop, timeout=bound, grace=0)


def run_bound(req: ProfileRequest, finish_timeout: float | None) -> float | None:
    """The seconds a node's run may take in all: --timeout plus --finish-timeout; None without a
    --timeout (SSH keepalives decide when a node has gone silent)."""
    return req.timeout + (finish_timeout or FINISH_TIMEOUT) if req.timeout else None


def removing(host: "Host") -> "Host | None":
    """The host, when it asks for its reports to be removed from the node once verified home."""
    return host if host.vars.get("remove_gathered_reports") else None


def entry_for(req: ProfileRequest, run: HostRun) -> HostEntry:
    """A lab host's manifest entry: its node's facts from the state the probe found."""
    facts = run.state.facts(run.gpus or req.gpus, req.tool) if run.state else None
    tenants = [str(t) for t in (run.plan.tenants if run.plan else ())]
    given_up = ((run.answer.given_up if run.answer else ())
                or (run.plan.given_up if run.plan else ()))
    return HostEntry.from_facts(run.host, run.status, facts, missing_why=run.error,
                                tenants_seen=tenants, given_up=given_up,
                                plan=run.plan.to_json() if run.plan else None, result=run.result,
                                answer=run.answer, reports=run.reports)


def json_doc(manifest: RunManifest) -> dict:
    """``fleet profile --json``: the manifest, each host with ``error`` as this output always had
    it."""
    doc = manifest.to_json()
    for h in doc["hosts"]:
        h["error"] = h["missing_why"]
    return doc


def _plan_lines(p: Plan) -> list[str]:
    """What a planned host would do: the command, the sysctls it holds, its locks and checks."""
    lines = [f"  run:      {p.shell()}"]
    lines += [f"  sysctl:   {name} -> {value} for the run, then restored (owned)"
              for name, value in p.sysctls.items()]
    if p.gpu_locks:
        lines.append(f"  lock:     GPU counters of {', '.join(p.gpu_locks)}")
    if p.recheck:
        lines.append(f"  check:    GPUs {list(p.recheck.gpus or ())} again right before the "
                     "profiler starts")
    if p.pause_dcgm:
        lines.append("  dcgm:     profiling paused for the run, resumed after")
    return lines


def render(entry: HostEntry) -> str:
    """One host's plan or outcome, for people."""
    p = Plan.from_json(entry.plan) if entry.plan else None
    refused_by_plan = p is not None and p.status == "refused"
    # a launcher's rank: missing
    who = entry.host + (f" rank {entry.rank}" if entry.rank is not None else "")
    # the plan's reasons follow instead
    lines = [outcome.status_line(who, entry, why=not refused_by_plan)]
    if p and p.placement and p.status == "ok":
        lines.append(f"  gpu:      {p.placement}")
    if p and p.status == "ok" and entry.status == HostStatus.PLANNED:
        lines += _plan_lines(p)
    elif refused_by_plan:
        lines += [f"  because:  {r}" for r in p.reasons]
        lines += [f"  remedy:   {p.remedy}"] if p.remedy else []
    lines += outcome.detail_lines(entry)
    return "\n".join(lines) + "\n"
