"""``fleet profile`` and ``fleet gather``: on lab servers here, on Slurm through
:mod:`fleet.cli.slurm`."""

from __future__ import annotations

import sys

import click

from .. import completeness, exitcodes
from ..statuses import HostStatus
from ..plan import MAX_TIMEOUT
from .context import Context, exclude_option, fail, store_option, stored_run, push_when_done
from .output import echo_json, json_option
from .parsing import WorkloadCommand, refuse_options, seconds
from .slurm import gather_on_slurm, profile_on_slurm, slurm_options
from .terminal import echo


def image(ctx, param, value):
    """An image name, never an option: ``--docker=--privileged`` is refused here, before
    anything."""
    from ..wrapping.containers import image_problem

    if value is not None and (why := image_problem(value, "--" + param.name.replace("_image", ""))):
        raise click.BadParameter(why)
    return value


def window_choice(ctx, param, value):
    """--window START:DURATION, whole seconds (nsys's --delay and --duration take them): (start,
    duration)."""
    if value is None:
        return None
    start, _, duration = value.partition(":")
    digits = all(part.isascii() and part.isdigit() and len(part) < 9 for part in (start, duration))
    if not (digits and int(duration) > 0):
        raise click.BadParameter(f"{value!r}: START:DURATION in whole seconds, the "
                                 "duration more than 0 (e.g. 60:30)")
    return int(start), int(duration)


def gpu_choice(ctx, param, value):
    """--gpu: NVML indices, or `free` alone (fleet chooses, by the neighbours it finds)."""
    if not value:
        return ()
    if "free" in value:
        if len(value) > 1:
            raise click.BadParameter("free chooses the GPU: give it alone, or name GPUs by index")
        return ("free",)
    if not all(v.isdigit() and len(v) < 6 for v in value):
        raise click.BadParameter(f"{' '.join(value)!r}: a GPU's index (0, 1, ...) or free")
    return tuple(int(v) for v in value)


@click.command(cls=WorkloadCommand)
@click.option("--hosts", "hosts_", help="Hosts or ranges to profile on.")
@click.option("--group", "group", help="Inventory group to profile on.")
@exclude_option
@click.option("--tool", type=click.Choice(["nsys", "ncu"]), default="nsys", show_default=True)
@click.option("--gpu", "gpus", multiple=True, callback=gpu_choice, metavar="N|free",
              help="GPU index the workload runs on (repeatable); it gets CUDA_VISIBLE_DEVICES and "
                   "the neighbour "
              "check covers it. free: on each host a GPU nobody else is on now (a host with none "
              "is refused). Default: every GPU.")
@click.option("--count", "free_count", type=click.IntRange(1),
              help="With --gpu free: the N least busy free GPUs "
              "across the hosts, one a host; the other hosts are left out of the run.")
@click.option("--gpu-metrics", is_flag=True,
              help="nsys: sample GPU metrics (counters; refused beside tenants).")
@click.option("--allow-own", is_flag=True,
              help="Your own other processes on the GPU are not tenants.")
@click.option("--pause-dcgm", is_flag=True,
              help="Pause DCGM profiling for the run on pre-Hopper GPUs (owned nodes).")
@click.option("--wait", "lock_wait", type=click.FloatRange(0, MAX_TIMEOUT), default=0.0,
              callback=seconds, help="Seconds to wait for another run's GPU lock.")
@click.option("--timeout", type=click.FloatRange(0, MAX_TIMEOUT, min_open=True), callback=seconds,
              help="Seconds the workload may run; then nsys stops it (its --duration, kernels "
                   "kept) or ncu gets SIGINT; the report is kept.")
@click.option("--finish-timeout", type=click.FloatRange(0, MAX_TIMEOUT, min_open=True),
              callback=seconds,
              help="With --timeout: seconds past it a node may take to stop the profiler, finish "
                   "the report and answer, before fleet calls it silent (default 3600).")
@click.option("--window", callback=window_choice, metavar="START:DURATION",
              help="nsys: collect DURATION seconds from START seconds into the run; "
                   "the workload goes on after it.")
@click.option("--detach", is_flag=True,
              help="With --window: leave once the window's report is home, the workload "
              "running on (its output in the run's folder on the node).")
@click.option("--nvtx-window", metavar="RANGE[@DOMAIN]",
              help="nsys: collect while the workload is in this NVTX range "
              "(the first one, or --repeat N of them); the workload goes on after it.")
@click.option("--cuda-profiler-window", is_flag=True,
              help="nsys: collect from the workload's cudaProfilerStart() "
              "to its cudaProfilerStop() (the first, or --repeat N); "
              "the workload goes on after it.")
@click.option("--repeat", type=click.IntRange(1, 100), metavar="N", help="With --nvtx-window or "
              "--cuda-profiler-window: N windows, each its own report.")
@click.option("-X", "--profiler-arg", "profiler_args", multiple=True,
              help="Extra argument for nsys/ncu (repeatable).")
@click.option("--docker", "docker_image", callback=image,
              help="Lab servers: run the workload and the node's "
              "profiler in this Docker image, with the least privilege the plan needs.")
@store_option
@click.option("--site", default="lab", show_default=True,
              help="Store folder for this group of machines.")
@click.option("--dry-run", is_flag=True,
              help="Print each node's plan (commands, sysctls, locks, refusals); touch nothing.")
@json_option
@slurm_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def profile(obj: Context, hosts_, group, exclude, tool, gpus, free_count, gpu_metrics, allow_own,
            pause_dcgm,
            lock_wait, timeout, finish_timeout, window, detach, nvtx_window, cuda_profiler_window,
            repeat,
            profiler_args, docker_image, store_root, site, dry_run, as_json, command, **slurm):
    """Profile COMMAND with nsys or ncu on lab servers (--hosts, --group) or in a Slurm
    batch job (--partition), leaving every node as it was.

    ncu and GPU metrics are refused on a GPU with any other tenant. Ctrl-C stops the
    profiler with SIGTERM so the report is finished (in a terminal, for nsys on lab
    servers, it asks first whether to leave the workload running instead, nsys alone
    stopping its collection); a second Ctrl-C leaves the nodes (or the job) to finish
    on their own.
    """
    from ..placement.free import FreeGpus
    from ..plan import LabPart, ProfileRequest, window_problem
    from ..userflags import profiler_args_error
    from ..store.records import new_run_id

    req = ProfileRequest(tool=tool, command=tuple(command), run_id=new_run_id(),
                         gpu_metrics=gpu_metrics,
                         allow_own=allow_own, pause_dcgm=pause_dcgm,
                         profiler_args=tuple(profiler_args),
                         nvtx_window=nvtx_window, cuda_profiler_window=cuda_profiler_window,
                         repeat=repeat,
                         lab=LabPart(gpus=None if gpus == ("free",) else tuple(gpus) or None,
                                     timeout=timeout,
                                     lock_wait=lock_wait, docker_image=docker_image, window=window,
                                     detach=detach))
    if (why := profiler_args_error(tool, tuple(profiler_args)) or window_problem(req)):
        fail(why)
    free = FreeGpus(free_count) if gpus == ("free",) else None
    if free_count is not None and free is None:
        fail("--count N picks the N least busy free GPUs: give --gpu free too")
    ctx = click.get_current_context()
    if slurm.get("partition") or slurm.get("cluster"):
        if hosts_ or group:
            fail("--partition/--cluster (a Slurm job) and --hosts/--group (lab servers) do not mix")
        refuse_lab_options(ctx)
        return profile_on_slurm(obj, req, slurm, store_root=store_root, site=None if site == "lab"
                                else site, dry_run=dry_run, as_json=as_json)
    req, targets = _lab_request(ctx, req, slurm, hosts_, group, timeout, finish_timeout)
    run = profile_lab_servers(obj, obj.select(targets, exclude), req, store_root=store_root,
                              site=site,
                              dry_run=dry_run, as_json=as_json, finish_timeout=finish_timeout,
                              free=free)
    for host, why in (free.left_out if free else {}).items():
        echo(f"{host}: not in this run: {why}", err=True)
    show_lab_run(run.manifest, store_root, dry_run, as_json)
    push_when_done(store_root, run.manifest, as_json)
    sys.exit(run.exit_status())


def _lab_request(ctx, req, slurm: dict, hosts_, group, timeout, finish_timeout):
    """The request for lab servers (with its launcher) and where it goes, each option that does not
    belong there refused in one line."""
    refuse_options(ctx, [name for name in slurm if name not in ("partition", "cluster",
                                                                "launcher")],
                   "Slurm options, for a batch job with --partition; on lab "
                   "servers pick GPUs with --gpu")
    if ctx.get_parameter_source("launcher") not in (click.core.ParameterSource.DEFAULT, None):
        req = lab_launcher(req, slurm["launcher"])
    if finish_timeout is not None and timeout is None:
        fail("--finish-timeout bounds what follows --timeout: give --timeout too")
    targets = ",".join(t for t in (hosts_, group) if t)
    if not targets:
        fail("name where to profile: --hosts H or --group G (lab "
             "servers), or --partition P (Slurm)")
    return req, targets


def lab_launcher(req, launcher: str):
    """The request with --launcher on lab servers, or the one-line error (exit 2), nothing
    contacted."""
    from ..lab import profile as profile_mod
    from ..wrapping.launchers import LauncherError

    try:
        return profile_mod.with_launcher(req, launcher)
    except LauncherError as e:
        fail(str(e))


def refuse_lab_options(ctx: click.Context) -> None:
    """The lab servers' options, refused on Slurm, each with what to use there instead."""
    refuse_options(ctx, ["docker_image"],
                   "on Slurm, containers are --container-image (pyxis) or --apptainer")
    refuse_options(ctx, ["gpus", "free_count"],
                   "on Slurm, ask for GPUs with --gpus or --gres; --gpu picks a GPU on a "
                   "lab server")
    refuse_options(ctx, ["timeout", "lock_wait", "finish_timeout"],
                   "on Slurm, the job's --time bounds the run "
                   "(the profilers stop --stop-before seconds ahead); --timeout "
                   "and --wait are for lab servers")
    refuse_options(ctx, ["exclude"], "on Slurm, leave nodes out with --sbatch-arg=--exclude=NODES")
    refuse_options(ctx, ["detach"],
                   "--detach is for lab servers yet: on Slurm the job runs on after a --window, "
                   "and fleet brings the reports home at its end "
                   "(--no-wait and fleet gather: later)")


def profile_lab_servers(obj: Context, hosts, req, *, store_root, site, dry_run, as_json,
                        finish_timeout, free=None):
    """The lab run (a LabRun), Ctrl-C stopping the profilers (a second one leaves the nodes to
    finish)."""
    from .. import store
    from ..run import LabRun
    from .interrupt import run as run_interruptible, stop_on_signals
    from .output import byte_progress

    # Not with --timeout: the workload ends at it anyway, and its bound is the wait's.
    leave = ("stopping the collection (nsys stop of each node's session), leaving the workloads "
             "running; waiting for the reports") if req.tool == "nsys" and not (req.launcher
                                                                                or req.docker_image
                                                                       or req.timeout) else None
    run = LabRun(req, store.root(store_root), site, hosts=hosts, dry_run=dry_run,
                 finish_timeout=finish_timeout, free=free)
    try:
        with byte_progress(enabled=not as_json and not dry_run) as gathering:
            run_interruptible(run.go(
                obj.ssh_settings(), obj.fanout, write=workload_writer(as_json), gathering=gathering,
                stop=lambda: stop_on_signals("stopping the profilers (SIGTERM), "
                                             "waiting for their reports", leave)))
    except KeyboardInterrupt:  # the second Ctrl-C
        fail("left the nodes to finish on their own; bring the reports home later "
             f"with: fleet gather {req.run_id}",
             exitcodes.INTERRUPTED)
    return run


def workload_writer(as_json: bool):
    """Where the workload's and the profiler's lines go as they come: stdout, or stderr beside
    --json."""
    def write(stream: str, text: str) -> None:
        (sys.stderr if stream == "stderr" or as_json else sys.stdout).write(text)

    return write


def show_lab_run(manifest, store_root, dry_run: bool, as_json: bool) -> None:
    from ..lab import profile as profile_mod
    from ..lab.ranks import ranks_line
    from .. import store

    if as_json:
        echo_json(profile_mod.json_doc(manifest))
        return
    for h in manifest.hosts:
        echo(profile_mod.render(h), nl=False, err=h.status not in (HostStatus.OK,
                                                                   HostStatus.PLANNED))
    if (ranks := ranks_line(manifest)):
        echo(ranks)
    if not dry_run:  # where to look next, as the Slurm path says it
        directory = store.run_dir(store.root(store_root), manifest.site, manifest.run_id)
        # how many reports are whole, the run line last
        for line in completeness.run_lines(manifest.hosts):
            echo(line)
        echo(f"run {manifest.run_id} {manifest.status}: reports in {directory} "
             f"(fleet reports show {manifest.run_id})")


@click.command()
@click.argument("run_id")
@store_option
@json_option
@click.pass_obj
def gather(obj: Context, run_id, store_root, as_json):
    """Bring home what run RUN_ID left on its nodes (after fleet was killed, or a failed
    transfer)."""
    from ..lab import gather as lab_gather
    from .. import store

    if stored_run(store_root, run_id).slurm is not None:
        return gather_on_slurm(obj, run_id, store_root, as_json)
    manifest = obj.over_pool(lambda fan: lab_gather.gather(fan, obj.inventory.hosts,
                                                           store.root(store_root), run_id))
    if as_json:
        echo_json(manifest.to_json())
    for h in manifest.hosts if not as_json else ():
        # a launcher's rank that left no report
        who = h.host + (f" rank {h.rank}" if h.rank is not None else "")
        echo(f"{who}: {h.status}" + (f" ({h.missing_why})" if h.missing_why else ""))
        for r in h.reports:
            echo(f"  {r.stored} ({'verified' if r.verified else r.error})")
    push_when_done(store_root, manifest, as_json)
    sys.exit(exitcodes.for_run(manifest))
