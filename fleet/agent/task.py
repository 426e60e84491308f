"""One task of a profiled Slurm job: look at this node's GPUs, then profile the rank or not.

Runs ON THE COMPUTE NODE (standard library, Python 3.8), started by the job's
``srun`` (or by torchrun or mpirun for each worker) in place of the user's
command, which follows it on the command line untouched. The node is planned
right here, by the same policy and planner as a lab server, just before the
profiler starts, with what the node's Slurm prolog saw as root: a tenant on the
job's GPUs refuses ncu without running anything, and the refusal is written
where fleet gathers the results. Ranks outside ``--ranks`` exec the workload as
it is. The profiled run itself is
:mod:`run`'s: signals stop the profiler so its report is finished, the report
is found, finished from a leftover ``.qdstrm`` and hashed, and the result is
left beside it as ``NODE/rankN.result.json``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from dataclasses import replace

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_files as files
    import fleet_agent_node as node
    import fleet_agent_run as run
    import fleet_rundir as rundir
    import fleet_plan as planner
    import fleet_policy as policy
except ImportError:  # as part of the installed package
    from . import files, node, run
    from .. import plan as planner
    from .. import policy, rundir

SIGNAL_SLACK = 60  # seconds: Slurm may send --signal's USR1 up to this much before the time asked

# Where each launcher puts the worker's global rank, and its rank on the node: named with the files.
RANK_VARS, LOCAL_RANK_VARS = rundir.RANK_VARS, rundir.LOCAL_RANK_VARS


class TaskArgs:
    """What the batch script's FLEET_TASK gives every rank (fleet.slurm.launchers), read once: the
    script is written by fleet, but it is the job's file. A value missing or not of its kind reads
    as the default the task then uses."""

    def __init__(self, args):
        # The request as every rank gets it (for_rank), and where reports go: read only by a rank
        # that is profiled (one outside --ranks runs its workload whatever else the script says).
        self.request = args.get("request")
        self.report_dir = args.get("report_dir")
        tools = args.get("tools")
        self.tools = tools if isinstance(tools, dict) else {}
        self.prolog_expected = bool(args.get("prolog_expected"))
        self.window = args.get("window")          # checked by rank_window
        self.stop_before = args.get("stop_before")  # checked by time_to_run
        launcher = args.get("launcher")
        self.launcher = launcher if isinstance(launcher, str) else "srun"
        ranks = args.get("ranks")                 # --ranks: the ranks profiled; None: every one
        self.ranks = ranks if isinstance(ranks, list) else None
        nonce = args.get("nonce")                 # the run's: gather takes only results with it
        self.nonce = nonce if isinstance(nonce, str) else None


def rank_of(env, launcher, table=None):
    for var in (table or RANK_VARS).get(launcher, (table or RANK_VARS)["srun"]):
        if (env.get(var) or "").isdigit():
            return int(env[var])
    return None


def whose(env, launcher, rank, node_name, gpu_uuids):
    """Whose this rank's report is, as the launcher told the worker at its exec point: kept in its
    result, so that every report says which job, step, rank and GPUs it is of, whatever its name."""
    return {"job": env.get("SLURM_JOB_ID"), "step": env.get("SLURM_STEP_ID"), "rank": rank,
            "local_rank": rank_of(env, launcher, LOCAL_RANK_VARS), "host": node_name,
            "gpu_uuids": list(gpu_uuids), "launcher": launcher, "pid": os.getpid()}


def slurm_gpu_ids(env):
    """Slurm's ids of the GPUs it gave this step or job here (not NVML's indices); None: no GRES."""
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        ids = [int(x) for x in (env.get(var) or "").split(",") if x.strip().isdigit()]
        if ids:
            return tuple(ids)
    return None


def prolog_verdict(env, expected) -> dict | None:
    """What fleet's Slurm prolog (fleet slurm install) saw on the job's GPUs, as root (the document
    ``policy.PrologVerdict`` reads): None where no prolog is installed, else its document, or
    ``{"error": ...}`` when there is none to read
    although the cluster has the prolog (``expected``), or it cannot be read (the policy then
    counts the GPUs as shared)."""
    path = env.get("FLEET_PROLOG_VERDICT")
    if not path:
        return {"error": "the prolog left no verdict for this job"} if expected else None
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) else {"error": "%s holds no JSON object" % path}
    except (OSError, ValueError) as e:
        return {"error": "%s: %s" % (path, e)}


def time_to_run(env, stop_before, tool, now=None):
    """Seconds an nsys rank's workload may still run for nsys to stop it itself (--duration,
    which keeps its kernels) before the batch script's USR1 trap signals it (a signal loses
    them): the job's end, as the script read it from Slurm, less --stop-before and Slurm's
    slack. None for ncu, where the end is unknown, or too near: then the trap stops it."""
    end = env.get("FLEET_JOB_END") or ""
    if tool != "nsys" or not (end.isascii() and end.isdigit()) or not stop_before:
        return None
    left = int(end) - (time.time() if now is None else now) - stop_before - SIGNAL_SLACK
    return int(left) if 1 <= left <= planner.MAX_TIMEOUT else None


def rank_window(env, window, now=None):
    """(this rank's --window as nsys's delay and duration, the moment every
    rank's window starts) for
    --window START:DURATION: START seconds after the batch script's FLEET_WINDOW_FROM, less the time
    since, so that the ranks srun started one after another collect the same seconds, and every
    rank's nsys exits at the same moment, its report written; (None, None) without a window. Where
    the script's moment is not readable, the rank counts from its own start; where it is past, the
    rank's window starts at once (and its note does not claim the others' moment)."""
    if not (isinstance(window, list) and len(window) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= planner.MAX_TIMEOUT
                    for v in window)):
        return None, None
    start, duration = window
    since = env.get("FLEET_WINDOW_FROM") or ""
    if not (since.isascii() and since.isdigit()):
        return (start, duration), None
    at = int(since) + start
    away = at - (time.time() if now is None else now)
    # srun started this rank after the moment: its window starts now, not with the others'
    if away < 0:
        return (0, duration), None
    return (-int(-away // 1), duration), at


def plan_rank(args, env, label, command):
    """The rank's plan, made from this node's state as it is now (``args``: its
    :class:`TaskArgs`), and what the manifest needs of it."""
    node_name = env.get("SLURMD_NODENAME") or socket.gethostname()
    req = planner.ProfileRequest.from_json(args.request)
    document = node.probe({"tools": args.tools, "environment_check": False,
                           "report_dir": args.report_dir, "versions": [req.tool]})
    document["prolog_verdict"] = prolog_verdict(env, args.prolog_expected)
    state = policy.NodeState.read(document)
    gpus = policy.job_gpu_indices(slurm_gpu_ids(env), state.gpus)
    window, window_at = rank_window(env, args.window)
    rank = planner.RankPart(job=env.get("SLURM_JOB_ID"), gpus=gpus,
                            output_name="%s/%s" % (node_name, label),
                            timeout=time_to_run(env, args.stop_before, req.tool),
                            window=window, window_at=window_at)
    req = replace(req, command=tuple(command), rank=rank)
    plan = planner.plan(label, state, req)
    context = dict(state.facts(req.gpus, req.tool).to_json(), slurm_node=node_name,
                   job_id=env.get("SLURM_JOB_ID"),
                   directory=rundir.RunDir(os.path.join(args.report_dir,
                                                        req.run_id)).node(node_name).path)
    launcher = args.launcher
    uuids = [g.uuid for g in state.chosen(gpus)]
    context["whose"] = whose(env, launcher, rank_of(env, launcher), node_name, uuids)
    return plan, context


def refuse(plan, context, report_root):
    """No profiler, no workload: the refusal goes where fleet gathers results,
    and to the job's log."""
    result = dict(context, status=run.AgentStatus.REFUSED, host=plan.host,
                  reasons=list(plan.reasons), remedy=plan.remedy,
                  tenants=[str(t) for t in plan.tenants], reports=[])
    sys.stderr.write("fleet: %s on %s refused, nothing was run: %s\n" % (
        plan.host, context["slurm_node"], "; ".join(plan.reasons)))
    try:
        files.private_dir(context["directory"], root=report_root)
        files.write_private(rundir.RunDir(context["directory"]).result(plan.host),
                            run.frame(result))
    except OSError as e:
        sys.stderr.write("fleet: %s: could not write the refusal's result: %s\n" % (plan.host, e))
    return run.REFUSED_EXIT


def main(args, argv=None, env=None):
    command = list(argv if argv is not None else sys.argv[2:])
    env = os.environ if env is None else env
    if not command:
        sys.stderr.write("fleet task: no command given\n")
        return 2
    args = TaskArgs(args)
    rank = rank_of(env, args.launcher)
    if args.ranks is not None and rank not in args.ranks:
        os.execvp(command[0], command)  # not profiled: the workload exactly as given
    # From here on a stop (Slurm's SIGTERM, fleet's USR1 trap) is remembered, not fatal:
    # the rank still writes its result, and a profiler is never started after it.
    stops = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: stops.append(s))
    label = rundir.RunDir.label(rank, os.getpid())
    plan, context = plan_rank(args, env, label, command)
    context["rank"] = rank
    if args.nonce is not None:
        context["nonce"] = args.nonce
    if plan.status != "ok":
        return refuse(plan, context, args.report_dir)
    return run.main({"plan": plan, "context": context, "result_line": False}, stops)
