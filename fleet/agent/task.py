"""One task of a profiled Slurm job: look at this node's GPUs, then profile the rank or not.

Runs ON THE COMPUTE NODE (standard library, Python 3.8), started by the job's
``srun`` (or by torchrun or mpirun for each worker) in place of the user's
command, which follows it on the command line untouched. The node is planned
right here, by the same policy and planner as a lab server, just before the
profiler starts: a tenant on the job's GPUs refuses ncu without running
anything, and the refusal is written where fleet gathers the results. Ranks
outside ``--ranks`` exec the workload as it is. The profiled run itself is
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

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_node as node
    import fleet_agent_owned as owned
    import fleet_agent_run as run
    import fleet_plan as planner
except ImportError:  # as part of the installed package
    from . import node, owned, run
    from .. import plan as planner

# Where each launcher puts the worker's global rank.
RANK_VARS = {"srun": ("SLURM_PROCID",), "torchrun": ("RANK",),
             "mpirun": ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")}


def rank_of(env, launcher):
    for var in RANK_VARS.get(launcher, RANK_VARS["srun"]):
        if (env.get(var) or "").isdigit():
            return int(env[var])
    return None


def job_gpus(env):
    """Physical indices of the GPUs Slurm gave this step or job here; None: no GRES, every GPU."""
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        indices = [int(x) for x in (env.get(var) or "").split(",") if x.strip().isdigit()]
        if indices:
            return tuple(indices)
    return None


def prolog_tenants(env):
    """Tenants fleet's Slurm prolog found on the job's GPUs (fleet slurm install), if it ran."""
    path = env.get("FLEET_PROLOG_VERDICT")
    try:
        with open(path) as f:
            return [str(t) for t in json.load(f).get("tenants") or []]
    except (TypeError, OSError, ValueError, AttributeError):
        return []


def plan_rank(args, env, label, command):
    """The rank's plan, made from this node's state as it is now, and what the manifest needs of it."""
    node_name = env.get("SLURMD_NODENAME") or socket.gethostname()
    state = node.probe({"tools": args.get("tools") or {}, "environment_check": False,
                        "report_dir": args["report_dir"]})
    req = planner.ProfileRequest(
        tool=args["tool"], command=tuple(command), run_id=args["run_id"], gpus=job_gpus(env),
        gpu_metrics=args.get("gpu_metrics", False), allow_own=args.get("allow_own", False),
        profiler_args=tuple(args.get("profiler_args") or ()), clock_control=args.get("clock_control", "base"),
        output_name="%s/%s" % (node_name, label), job=env.get("SLURM_JOB_ID"))
    plan = planner.plan(label, state, req).to_json()
    seen = prolog_tenants(env) if plan["status"] == "ok" and (req.tool == "ncu" or req.gpu_metrics) else []
    if seen:  # the node's prolog, as root, saw someone on the job's GPUs
        plan.update(status="refused", reasons=["tenant seen by the node's prolog: " + t for t in seen],
                    remedy="run where the job's GPUs are free", tenants=seen)
    plan["env"].pop("CUDA_VISIBLE_DEVICES", None)  # Slurm (or the launcher) chose each task's GPUs
    plan["gpu_locks"] = []  # the job's allocation is the lock: ranks sharing a GPU must not refuse each other
    plan["recheck"] = {}    # this plan was made a moment ago, by the job-aware rule
    gpus = [g for g in state.get("gpus") or [] if req.gpus is None or g.get("index") in req.gpus]
    tool = (state.get("tools") or {}).get(args["tool"])
    context = {"slurm_node": node_name, "job_id": env.get("SLURM_JOB_ID"),
               "directory": os.path.join(args["report_dir"], args["run_id"], node_name),
               "gpu": ", ".join(sorted({g.get("name") or "?" for g in gpus})) or None,
               "driver": (state.get("nvml") or {}).get("driver"),
               "tool_version": tool.get("version") if isinstance(tool, dict) else None,
               "processes_seen": [{"gpu": g["index"], "pid": p.get("pid"), "user": p.get("user"),
                                   "foreign": p.get("foreign"), "slurm_job": p.get("slurm_job")}
                                  for g in gpus for p in g.get("processes") or []]}
    return plan, context


def refuse(plan, context):
    """No profiler, no workload: the refusal goes where fleet gathers results, and to the job's log."""
    result = dict(context, status="refused", host=plan["host"], reasons=list(plan["reasons"]),
                  remedy=plan.get("remedy"), tenants=list(plan.get("tenants") or []), reports=[])
    os.makedirs(context["directory"], exist_ok=True)
    owned.write_json(os.path.join(context["directory"], "%s.result.json" % plan["host"]), result)
    sys.stderr.write("fleet: %s on %s refused, nothing was run: %s\n" % (
        plan["host"], context["slurm_node"], "; ".join(plan["reasons"])))
    return run.REFUSED_EXIT


def main(args, argv=None, env=None):
    command = list(argv if argv is not None else sys.argv[2:])
    env = os.environ if env is None else env
    if not command:
        sys.stderr.write("fleet task: no command given\n")
        return 2
    rank = rank_of(env, args.get("launcher", "srun"))
    ranks = args.get("ranks")
    if ranks is not None and rank not in ranks:
        os.execvp(command[0], command)  # not profiled: the workload exactly as given
    # From here on a stop (Slurm's SIGTERM, fleet's USR1 trap) is remembered, not fatal:
    # the rank still writes its result, and a profiler is never started after it.
    stops = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: stops.append(s))
    label = "rank%d" % rank if rank is not None else "pid%d" % os.getpid()
    plan, context = plan_rank(args, env, label, command)
    context["rank"] = rank
    if plan["status"] != "ok":
        return refuse(plan, context)
    return run.main({"plan": plan, "context": context, "result_line": False}, stops)
