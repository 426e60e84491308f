"""The Slurm side of the command line: ``fleet profile --partition``'s options, ``fleet jobs``,
``fleet cancel``."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .. import exitcodes
from .context import Context, fail, store_option, push_when_done
from .output import echo_json, json_option
from .parsing import seconds
from .terminal import echo

if TYPE_CHECKING:
    from ..store.manifest import RunManifest
    from ..plan import ProfileRequest
    from ..slurm.options import CheckedJobSpec

SLURM_OPTIONS = [
    click.option("--partition", "-p", help="Slurm partition: profile in a batch job there."),
    click.option("--cluster",
                 help="Slurm cluster (its login host or group) when the inventory has several."),
    click.option("--nodes", "-N", type=int, help="sbatch --nodes."),
    click.option("--ntasks", "-n", type=int, help="sbatch --ntasks."),
    click.option("--ntasks-per-node", type=int, help="sbatch --ntasks-per-node."),
    click.option("--gpus", "slurm_gpus", help="sbatch --gpus (e.g. 4 or h100:4)."),
    click.option("--gres", help="sbatch --gres (e.g. gpu:2)."),
    click.option("--time", "-t", "time_limit",
                 help="sbatch --time (the profilers stop --stop-before seconds earlier)."),
    click.option("--account", "-A", help="sbatch --account."),
    click.option("--qos", help="sbatch --qos."),
    click.option("--exclusive/--shared", default=None,
                 help="Whole nodes for the job. Default: exclusive for ncu and GPU metrics, "
                      "shared for nsys trace."),
    click.option("--sbatch-arg", "sbatch_args", multiple=True,
                 help="Further sbatch option, as one word "
                 "(repeatable), e.g. --sbatch-arg=--constraint=h100."),
    click.option("--ranks",
                 help="Profile only these ranks (e.g. 0,3); the others run unprofiled. With "
                 "--launcher ray: the actors whose names match these patterns (e.g. 'trainer-*')."),
    click.option("--launcher", type=click.Choice(["srun", "torchrun", "mpirun", "ray"]),
                 default="srun",
                 show_default=True,
                 help="What starts the ranks; the profiler goes in front of each worker. On lab "
                 "servers (--hosts): mpirun or torchrun."),
    click.option("--container-image",
                 help="Run each task in this image (pyxis); Nsight is mounted read-only."),
    click.option("--apptainer", "apptainer_image", help="Run each task in this Apptainer image."),
    click.option("--stop-before", type=int,
                 help="Seconds before the time limit at which the profilers are "
                 "stopped, reports finished. Default: 120, or half a shorter --time."),
    click.option("--workdir",
                 help="The job's working directory (default: here on the login node, else home)."),
    click.option("--no-wait", is_flag=True,
                 help="Submit, print the job id and return; `fleet gather RUN` later."),
    click.option("--keep-pending", is_flag=True,
                 help="A job pending for a reason Slurm never clears by itself "
                      "(e.g. PartitionTimeLimit) is left in the queue, not cancelled; fleet still "
                      "ends the run."),
    click.option("--poll", type=click.FloatRange(0, 86400, min_open=True), default=5.0,
                 show_default=True, callback=seconds, help="Longest seconds between status calls."),
]


def slurm_options(f):
    for option in reversed(SLURM_OPTIONS):
        f = option(f)
    return f


def spec_from(opts: dict, req: "ProfileRequest") -> "CheckedJobSpec":
    """The job's shape, checked once against what sbatch takes and against the request
    (``UnsafeValue``, ``JobSpecError``: one line, exit 2), before the cluster is asked anything."""
    from ..wrapping.containers import Container, image_problem
    from ..slurm import options
    from ..slurm.spec import JobSpec

    from ..slurm.launchers import actor_patterns

    ranks = None if opts.get("ranks") is None else (
        actor_patterns(opts["ranks"]) if opts.get("launcher") == "ray"
        else options.parse_ranks(opts["ranks"]))
    if opts.get("container_image") and opts.get("apptainer_image"):
        fail("choose one of --container-image (pyxis) and --apptainer")
    for key, option in (("container_image", "--container-image"),
                        ("apptainer_image", "--apptainer")):
        if opts.get(key) is not None and (why := image_problem(opts[key], option)):
            fail(why)
    container = (Container("pyxis", opts["container_image"]) if opts.get("container_image") else
                 Container("apptainer", opts["apptainer_image"]) if opts.get("apptainer_image")
                 else None)
    raw = JobSpec(partition=opts.get("partition"), nodes=opts.get("nodes"),
                  ntasks=opts.get("ntasks"),
                  ntasks_per_node=opts.get("ntasks_per_node"), gpus=opts.get("slurm_gpus"),
                  gres=opts.get("gres"),
                  time=opts.get("time_limit"), account=opts.get("account"), qos=opts.get("qos"),
                  exclusive=opts.get("exclusive"), sbatch_args=tuple(opts.get("sbatch_args") or ()),
                  ranks=ranks,
                  launcher=opts.get("launcher") or "srun", stop_before=opts.get("stop_before"),
                  workdir=opts.get("workdir"), container=container)
    return options.checked(raw, req)


def cluster_named(obj: Context, partition: str | None, name: str | None):
    from ..slurm.cluster import choose

    return choose(obj.inventory, partition, name, embedded=not obj.inventories)


def job_state_printer(as_json: bool):
    """The job's state as it changes, one line on stderr each (nothing beside --json)."""
    def on_state(st):
        if not as_json:
            extra = "".join(f" {k}={v}" for k, v in (("reason", st.reason), ("nodes", st.nodes))
                            if v and v not in ("None", "(null)"))
            echo(f"fleet: job {st.job_id} {st.state}{extra}", err=True)

    return on_state


def profile_on_slurm(obj: Context, req: "ProfileRequest", opts: dict, *, store_root, site, dry_run,
                     as_json):
    from .. import store
    from .interrupt import run as run_interruptible, stop_on_signals
    from .output import byte_progress
    from ..wrapping.containers import ContainerError
    from ..run import SlurmRun
    from ..slurm import runs
    from ..slurm.jobs import SlurmError, SlurmRejected

    spec = spec_from(opts, req)
    cluster = cluster_named(obj, opts.get("partition"), opts.get("cluster"))
    if spec.stop_note:
        echo(f"fleet: {spec.stop_note}", err=True)

    def on_python(note):
        if not as_json and not dry_run:
            echo(f"fleet: the agent's Python on the compute nodes: {note}", err=True)

    run = SlurmRun(req, store.root(store_root), site, cluster=cluster, spec=spec, dry_run=dry_run,
                   wait=not opts.get("no_wait"), poll=opts.get("poll") or 5.0,
                   keep_pending=bool(opts.get("keep_pending")))
    try:
        with byte_progress(enabled=not as_json and not dry_run) as gathering:
            manifest = run_interruptible(run.go(
                obj.ssh_settings(), obj.fanout, gathering=gathering,
                on_state=job_state_printer(as_json), on_python=on_python,
                stop=lambda: stop_on_signals("stopping the job's profilers (SIGTERM to its steps), "
                                             "waiting for their reports")))
    except SlurmRejected as e:
        fail(str(e), exitcodes.USAGE)
    except (SlurmError, ContainerError) as e:
        fail(str(e), exitcodes.of_error(e))
    except KeyboardInterrupt:
        fail(f"left the job running; bring its reports home later with: fleet gather {req.run_id}",
             exitcodes.INTERRUPTED)
    if dry_run:
        if as_json:
            echo_json(manifest.to_json())
        else:
            echo(manifest.slurm.script, nl=False)
        sys.exit(run.exit_status())  # a dry run: 0
    if as_json:
        echo_json(manifest.to_json())
    else:
        echo(runs.render(manifest), nl=False)
    push_when_done(store_root, manifest, as_json)
    sys.exit(run.exit_status())


def gather_on_slurm(obj: Context, run_id: str, store_root, as_json: bool = False) -> None:
    """``fleet gather RUN`` for a Slurm run: once its job has ended, bring home what the ranks
    left."""
    from .. import store
    from ..slurm import run as slurm_run
    from ..slurm.jobs import SlurmError

    from ..slurm.runs import by_cluster, render

    root = store.root(store_root)
    path = store.manifest_of(root, run_id)
    [(cluster, _)] = by_cluster(obj.inventory, [store.read_manifest(path)])

    try:
        m = obj.over_pool(lambda fan: slurm_run.gather_later(fan, cluster, path, root))
    except SlurmError as e:
        fail(str(e), exitcodes.of_error(e))
    if as_json:
        echo_json(m.to_json())
    elif m.status in store.UNFINISHED:
        echo(f"run {run_id}: job {m.slurm.job_id} is {m.slurm.state}; gather again once it ends")
    else:
        echo(render(m), nl=False)
    push_when_done(store_root, m, as_json)
    sys.exit(exitcodes.for_run(m))


def _stored(store_root, run_ids=()) -> list["RunManifest"]:
    from .. import store
    from ..slurm import runs

    try:
        return runs.stored(store.root(store_root), tuple(run_ids), on_skipped=lambda why: echo(
            f"fleet: {why}", err=True))
    except LookupError as e:
        fail(str(e))


@click.command()
@click.argument("run_ids", nargs=-1)
@store_option
@json_option
@click.pass_obj
def jobs(obj: Context, run_ids, store_root, as_json):
    """Slurm jobs of runs not yet gathered (or of RUN_IDS): one squeue call per cluster; and the
    workloads lab runs left running (--detach, Ctrl-C), one look a host."""
    from ..slurm import runs
    from ..lab import leftrunning

    skipped = None if run_ids else (lambda why: echo(f"fleet: {why}", err=True))
    groups = runs.by_cluster(obj.inventory, _stored(store_root, run_ids), on_skipped=skipped)
    left = _left_running(store_root, run_ids)

    async def go(fan):
        await leftrunning.look(fan, obj.inventory, [item for _, items in left for item in items])
        return await runs.job_rows(fan, groups)

    from ..slurm.jobs import SlurmError

    try:
        rows = obj.over_pool(go)
    except SlurmError as e:
        fail(str(e), exitcodes.of_error(e))
    for folder, items in left:
        leftrunning.unmark_ended(folder, items)
    lab = [item for _, items in left for item in items]
    if as_json:
        echo_json({"jobs": rows, "left_running": [item.to_json() for item in lab]})
        return
    _print_jobs(rows, lab)


def _print_jobs(rows: list[dict], lab: list) -> None:
    """The Slurm jobs' table (even empty, where nothing was left running), then the lab's workloads
    left running."""
    from .output import print_table

    if rows or not lab:
        print_table(["RUN", "CLUSTER", "JOB", "STATE", "REASON", "NODES", "TIME"],
                    [[r["run_id"], r["cluster"], r["job_id"] or "", r["state"] or "",
                      r["reason"] if r["reason"] not in (None, "None") else "", r["nodes"] or "",
                      r["elapsed"] or ""]
                     for r in rows], status_column=3)
    if lab:
        if rows:
            echo()
            echo("left running on lab servers:")
        print_table(["RUN", "HOST", "PIDS", "STATE", "OUTPUT"],
                    [[i.run_id, i.host, ",".join(map(str, i.pids)), i.state if not i.why
                      else f"{i.state}: {i.why}", i.output or ""] for i in lab], status_column=3)


def _left_running(store_root, run_ids=()):
    from .. import store
    from ..lab import leftrunning

    return leftrunning.in_store(store.root(store_root), tuple(run_ids), on_skipped=lambda why: echo(
        f"fleet: {why}", err=True))


@click.command()
@click.argument("run_ids", nargs=-1, required=True)
@store_option
@click.option("--dry-run", is_flag=True,
              help="Say which jobs would be cancelled; cancel nothing, reach no cluster.")
@json_option
@click.pass_obj
def cancel(obj: Context, run_ids, store_root, dry_run, as_json):
    """Cancel the Slurm jobs of RUN_IDS (scancel); the profilers get SIGTERM and finish their
    reports. A lab run's workload left running (--detach, Ctrl-C) gets SIGTERM, where it is still
    that process."""
    from ..lab import leftrunning
    from ..slurm import runs
    from ..slurm.jobs import SlurmError

    groups = runs.by_cluster(obj.inventory, _stored(store_root, run_ids))
    lab = [item for _, items in _left_running(store_root, run_ids) for item in items]
    # from the manifests alone: the jobs fleet would scancel, whatever state they are in now
    if dry_run:
        return _say_cancelled([(name, ids) for name, _, ids in runs.jobs_of(groups)], lab, as_json,
                              dry_run=True)

    async def go(fan):
        await leftrunning.end(fan, obj.inventory, lab)
        return await runs.cancel(fan, groups)

    try:
        cancelled = obj.over_pool(go)
    except SlurmError as e:
        fail(str(e), exitcodes.of_error(e))
    _say_cancelled(cancelled, lab, as_json, dry_run=False)


def _say_cancelled(jobs: list, lab: list, as_json: bool, dry_run: bool) -> None:
    """What fleet cancel did (or, --dry-run, would do): the clusters' jobs, the lab's workloads left
    running."""
    if as_json:
        return echo_json({"dry_run": dry_run,
                          "cancelled": [{"cluster": c, "job_ids": ids} for c, ids in jobs],
                          "stopped": [item.to_json() for item in lab]})
    for cluster, ids in jobs:
        echo(f"{cluster}: {'would cancel' if dry_run else 'cancelled'} job(s) {', '.join(ids)}")
    for item in lab:
        pids = ", ".join(map(str, item.pids))
        if dry_run:
            echo(f"{item.host}: would stop run {item.run_id}'s workload left running "
                 f"(pid {pids}), where it still runs")
        elif item.signalled:
            echo(f"{item.host}: run {item.run_id}'s workload left running: SIGTERM to pid "
                 f"{', '.join(map(str, item.signalled))}")
        elif item.state == "ended":
            echo(f"{item.host}: run {item.run_id}'s workload left running had ended already "
                 f"(pid {pids})")
        else:
            echo(f"{item.host}: run {item.run_id}'s workload left running: "
                 f"not stopped ({item.why})")
