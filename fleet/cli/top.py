"""``fleet top``: the live look at every GPU of the targets (fleet/lab/look.py over SSH,
fleet/slurm/look.py in a job, each sample judged in fleet/look.py), on a screen refreshed each
interval, as one table (``--once``), or as JSON lines (``--json``)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import replace

import click

from .. import exitcodes
from .context import Context, exclude_option, fail
from .output import echo_json_line, print_table
from ..visible import visible
from .terminal import echo

HOME_AND_CLEAR = "\x1b[H\x1b[2J"  # fleet's own escape, written as itself; nothing a node sent is
SORTS = ("host", "activity", "memory", "free")
ACTIVITY_COLUMNS = (("SM", "sm_activity"), ("OCC", "sm_occupancy"), ("TENSOR", "tensor_activity"),
                    ("DRAM", "dram_bandwidth"))


def _pct(value) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _activity_cells(a) -> list[str]:
    if a.source == "gpm":
        return [_pct(a.metric(key)) for _, key in ACTIVITY_COLUMNS]
    return [f"util {_pct(a.utilization)}", "-", "-", "-"]  # the plain figure, said as such


def _gib(n) -> str:
    return "?" if n is None else f"{n / 2**30:.1f}"


def _who(g) -> str:
    people = []
    for p in g.processes:
        job = f" job {p.slurm_job}" if p.slurm_job else ""
        box = f" [{p.container}]" if p.container else ""
        left = f" (fleet run {p.left_running}, left running)" if p.left_running else ""
        people.append(f"{p.user or '?'}:{p.pid} {_gib(p.used_memory)}G "
                      f"{(p.command or p.name or p.why or '')[:40]}{job}{box}{left}")
    people += [f"unseen: {u}" for u in g.unseen]
    return "; ".join(people) or "-"


def _conditions(c) -> list[str]:
    throttle = [t for t in c.throttle or () if t != "gpu_idle"]
    return [f"{c.power_w:.0f}W" if c.power_w is not None else "-",
            str(c.sm_clock_mhz) if c.sm_clock_mhz is not None else "-",
            f"{c.temperature_c}C" if c.temperature_c is not None else "-",
            ",".join(throttle) or "-"]


def gpu_row(g) -> list[str]:
    return [g.host, str(g.index), f"{_gib(g.memory_used)}/{_gib(g.memory_total)}",
            *_activity_cells(g.activity),
            *_conditions(g.conditions), "free" if g.free else "shared", "ok" if g.ncu == "ok"
            else "refused", _who(g)]


HEADERS = ["HOST", "GPU", "MEM GiB", *(h for h, _ in ACTIVITY_COLUMNS), "POWER", "SM MHZ", "TEMP",
           "THROTTLE", "TENANTS", "NCU", "WHO (user:pid memory command)"]


def _chosen(views, free_only: bool, user: str | None, sort: str):
    gpus = [g for v in views for g in v.gpus
            if (not free_only or g.free) and (user is None
                                              or any(p.user == user for p in g.processes))]
    key = {"host": lambda g: (g.host, g.index), "memory": lambda g: -(g.memory_used or 0),
           "activity": lambda g: -(g.activity.metric("sm_activity") or g.activity.utilization or 0),
           "free": lambda g: (not g.free, g.host, g.index)}[sort]
    return sorted(gpus, key=key)


def _host_lines(views, interval: float) -> list[str]:
    now = time.monotonic()
    lines = []
    for v in views:
        if v.error:
            lines.append(visible(f"{v.host}: {v.error}"))  # one line, whatever the node said
        elif v.stale(now, interval):
            since = ("no sample yet" if v.received is None
                     else f"last sample {now - v.received:.0f} s ago")
            lines.append(f"{v.host}: stale ({since})")
        elif v.received is None:
            lines.append(f"{v.host}: waiting for its first sample")
    return lines


def show_table(views, interval, free_only, user, sort) -> None:
    print_table(HEADERS, [gpu_row(g) for g in _chosen(views, free_only, user, sort)])
    for line in _host_lines(views, interval):
        echo(line, err=True)


def _view_json(v, interval: float) -> dict:
    return {"host": v.host, "seq": v.seq, "time": v.sampled_at, "error": v.error,
            "stale": v.stale(time.monotonic(), interval), "gpus": [g.to_json() for g in v.gpus]}


def _where(obj: Context, targets, exclude, job, partition, cluster_name):
    """What to look at: (hosts, None, None) for inventory hosts; (hosts, (cluster, job id), None)
    for a look inside a running Slurm job; (None, None, (cluster, partition)) for a partition's
    nodes, which the login node names and the inventory reaches over SSH."""
    if job is None and partition is None:
        if cluster_name is not None:
            fail("--cluster chooses the cluster of --job or --partition: give one of them too")
        return obj.select(targets, exclude), None, None
    if job is not None and partition is not None:
        fail("give --job (a running job's nodes) or --partition (a partition's nodes), not both")
    if targets or exclude:
        fail("give TARGETS (inventory hosts), --job or --partition, not more than one")
    from ..slurm.cluster import choose

    if partition is not None:
        from ..slurm.options import name

        name(partition, "--partition", many=True)
        return None, None, (choose(obj.inventory, None, cluster_name), partition)
    if not (job.isdigit() and len(job) <= 12):
        fail(f"--job {job!r}: a Slurm job id is its number")
    return [], (choose(obj.inventory, None, cluster_name, embedded=not obj.inventories), job), None


def _not_in_inventory(node: str, partition: str):
    from ..look import HostView

    return HostView(node,
                    error=f"in partition {partition}, but not a host of the inventory: fleet "
                          "reaches a node "
                                "over SSH only as the inventory says")


def _of_another_cluster(node: str, partition: str, login: str):
    from ..look import HostView

    return HostView(node,
                    error=f"in partition {partition}, but the inventory's host {node} is of the "
                          "cluster whose "
                                f"login node is {login}: not looked at as this cluster's node")


async def _partition_hosts(obj: Context, fan, where, on_view) -> list:
    """The partition's nodes that the inventory names (each a host fleet reaches over SSH), unless
    the inventory puts that name in another cluster (two clusters may both have a node1); each other
    node is shown as such, with its reason."""
    from ..slurm.look import partition_nodes

    cluster, partition = where
    nodes = await partition_nodes(fan, cluster, partition)
    found = []
    for node in nodes:
        host = obj.inventory.hosts.get(node)
        login = host.vars.get("slurm_login") if host is not None else None
        if host is None:
            on_view(_not_in_inventory(node, partition))
        elif login not in (None, cluster.login.name) and cluster.name != "local":
            on_view(_of_another_cluster(node, partition, str(login)))
        else:
            found.append(host)
    return found


class Recorder:
    """--record FILE: every sample as a JSON line, written to FILE's private partial and renamed
    into place when the look ends (O_NOFOLLOW, 0600: never through a link someone left)."""

    def __init__(self, path: str | None):
        self.path, self.file = path, None
        if path:
            partial = f"{path}.partial"
            fd = os.open(partial,
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            self.file = os.fdopen(fd, "w")

    def write(self, line: dict) -> None:
        if self.file:
            self.file.write(json.dumps(line, default=str) + "\n")

    def close(self) -> None:
        if self.file:
            self.file.close()
            os.replace(f"{self.path}.partial", self.path)


def _left_running() -> dict:
    """The workloads fleet runs left running (--detach, Ctrl-C), by host and
    session, from the store."""
    from .. import store
    from ..lab import leftrunning

    # no store, or one fleet does not use: nothing marked
    return leftrunning.by_session(store.root(None))


def _mark_left_running(view, left: dict) -> None:
    """Each GPU process of a workload a fleet run left running named by that
    run (``left_running``)."""
    for g in view.gpus if left else ():
        g.processes = [_marked(p, left, view.host) for p in g.processes]


def _marked(p, left: dict, host: str):
    """The process, named by the fleet run that left its session running, if one did."""
    return replace(p, left_running=left[(host, p.session)]) if (host, p.session) in left else p


async def _run(obj: Context, hosts, *, once: bool, interval: float, count: int | None,
               as_json: bool, recorder: Recorder, shown, job=None, partition=None):
    """The look until its end or Ctrl-C; ``shown`` paints the latest views each interval.
    ``job``: (cluster, job id) for a look inside a running Slurm job instead of ``hosts``;
    ``partition``: (cluster, partition) for that partition's nodes over SSH."""
    from ..lab.look import look
    from ..look import HostView
    from ..slurm.look import look_job
    from .interrupt import stop_on_signals

    stop = stop_on_signals("stopping the look")
    # in the targets' order; a job's nodes as they come
    latest = {h.name: HostView(h.name) for h in hosts or ()}
    left = _left_running()

    def on_view(v) -> None:
        _mark_left_running(v, left)
        latest[v.host] = v
        if v.seq is not None or v.error:
            recorder.write(_view_json(v, interval))
        if as_json and not once:
            echo_json_line(_view_json(v, interval))

    async def paint():
        while True:
            await asyncio.sleep(interval)
            shown(list(latest.values()))

    async with obj.fanout_for_run() as fan:
        painter = None if once or as_json else asyncio.ensure_future(paint())
        try:
            samples = 1 if once else count
            if job is not None:
                return await look_job(fan, job[0], job[1], interval=interval, samples=samples,
                                      on_view=on_view, stop=stop)
            if partition is not None:
                hosts = await _partition_hosts(obj, fan, partition, on_view)
                latest.update((h.name, HostView(h.name)) for h in hosts)
                absent = [v for v in latest.values() if v.error]
                return absent + await look(fan, hosts, interval=interval, samples=samples,
                                           on_view=on_view, stop=stop)
            return await look(fan, hosts, interval=interval, samples=samples, on_view=on_view,
                              stop=stop)
        finally:
            if painter:
                painter.cancel()


@click.command()
@click.argument("targets", required=False)
@exclude_option
@click.option("--once", is_flag=True, help="One sample of every host, as one table, then exit.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON lines, one per host and sample, in fleet's envelope.")
@click.option("--interval", "-n", default=1.0, show_default=True, type=click.FloatRange(0.2, 60),
              help="Seconds between samples.")
@click.option("--count", type=click.IntRange(1), help="Stop after this many samples of each host.")
@click.option("--record", type=click.Path(dir_okay=False),
              help="Keep every sample in FILE, as JSON lines.")
@click.option("--free", "free_only", is_flag=True,
              help="Only GPUs nobody else is on (no tenant, no MIG, no MPS).")
@click.option("--user", help="Only GPUs with a process of this user.")
@click.option("--sort", type=click.Choice(SORTS), default="host", show_default=True,
              help="Order of the GPUs.")
@click.option("--job",
              help="A running Slurm job of yours: its nodes and GPUs, from a step inside it "
              "(srun --jobid --overlap).")
@click.option("--partition",
              help="Every node of this Slurm partition, over SSH as the inventory reaches each "
              "(an admin's look, outside any job).")
@click.option("--cluster",
              help="With --job or --partition: which cluster, when the "
                   "inventory describes several.")
@click.pass_obj
def top(obj: Context, targets, exclude, once, as_json, interval, count, record, free_only, user,
        sort, job, partition, cluster):
    """Every GPU of TARGETS, live: memory, SM activity and occupancy, tensor and DRAM activity (NVML
    GPM on Hopper and newer, else the plain utilization, said as such), power, clock, throttling;
    who is on it (user, pid, command, container, Slurm job; `unseen` where fleet cannot list them);
    and whether fleet would let ncu run there now. Reads NVML only: safe beside anyone's work."""
    hosts, inside, nodes = _where(obj, targets, exclude, job, partition, cluster)
    screen = sys.stdout.isatty() and not once and not as_json
    try:
        recorder = Recorder(record)
    except OSError as e:
        fail(f"--record {record}: {e.strerror}")

    def shown(views) -> None:
        if screen:
            click.echo(HOME_AND_CLEAR, nl=False)
            echo(f"fleet top: {len(views)} host(s), every {interval:g} s  "
                 f" {time.strftime('%H:%M:%S')}")
        else:
            echo(f"--- {time.strftime('%H:%M:%S')}")
        show_table(views, interval, free_only, user, sort)

    from .interrupt import run

    try:
        views = run(_run(obj, hosts, once=once, interval=interval, count=count, as_json=as_json,
                         recorder=recorder, shown=shown, job=inside, partition=nodes))
    except KeyboardInterrupt:
        views = []
    except Exception as e:  # a Slurm error is the look's one line; anything else is fleet's to show
        from ..slurm.jobs import SlurmError

        if not isinstance(e, SlurmError):
            raise
        fail(str(e), exitcodes.of_error(e))
    finally:
        recorder.close()
    if once:
        if as_json:
            for v in views:
                echo_json_line(_view_json(v, interval))
        else:
            show_table(views, interval, free_only, user, sort)
    sys.exit(exitcodes.for_parts(v.error is not None for v in views))
