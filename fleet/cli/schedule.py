"""``fleet schedule``: a playbook run at times (cron, scrontab, or a Slurm job that resubmits
itself), listed, removed, and fired; each firing is ``fleet run`` of the playbook."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .context import Context, store_option, push_when_done
from .nightly import loaded_playbook, run_playbook
from .output import echo_json, json_option
from .terminal import echo

if TYPE_CHECKING:
    from ..nightly.schedule import ScheduleRecord


@click.group()
def schedule():
    """Run playbooks unattended (scrontab, a self-resubmitting Slurm job, or crontab)."""


@schedule.command("install")
@click.argument("playbook", type=click.Path(exists=True, dir_okay=False))
@click.option("--cron",
              help="When, as crontab takes it: '0 2 * * *', '30 9 * * MON-FRI', '@daily'.")
@click.option("--every",
              help="Or every DURATION (30s, 15m, 6h, 1d); crontab and scrontab take only what "
                   "cron repeats exactly.")
@click.option("--name", help="The schedule's name (default: the playbook's).")
@click.option("--backend", type=click.Choice(["scrontab", "resubmit", "crontab"]),
              help="Force a way (default: the best this site has).")
@click.option("--sbatch-arg", "sbatch_args", multiple=True,
              help="sbatch option for the scheduling job.")
@store_option
@click.option("--dry-run", is_flag=True,
              help="Say what would be installed (the table lines or the job); install nothing.")
@json_option
@click.pass_obj
def schedule_install(obj: Context, playbook, cron, every, name, backend, sbatch_args, store_root,
                     dry_run, as_json):
    """Schedule PLAYBOOK; each firing is a normal `fleet run`."""
    from ..nightly import schedule as sched
    from .. import store

    pb = loaded_playbook(playbook)
    root = store.root(store_root).resolve()
    env = _firing_env(obj, root)
    here = False
    if pb.on_slurm:
        from ..slurm.cluster import choose

        here = choose(obj.inventory, pb.target.get("partition"), pb.target.get("cluster"),
                      embedded=not obj.inventories).local
    record = sched.install(root, name or pb.name, playbook, cron=cron,
                           every=sched.every_seconds(every) if every else None, on_slurm_here=here,
                           env=env,
                           sbatch_args=tuple(sbatch_args), backend=backend, dry_run=dry_run)
    if as_json:
        return echo_json({**record.doc, "dry_run": dry_run,
                          "next": [t.isoformat(timespec="seconds")
                                   for t in sched.next_times(record)]})
    if dry_run:
        where = {"crontab": "your crontab", "scrontab": "your scrontab",
                 "resubmit": f"{record.dir}/{record.name}.sbatch, submitted with "
                             "sbatch --begin"}
        echo(f"would schedule {record.name} ({_when(record)}) with {record.backend}, "
             f"adding to {where[record.backend]}:")
        echo(record.would_install, nl=False)
    else:
        echo(f"scheduled {record.name} ({_when(record)}) with "
             f"{record.backend}" + (f": job {record.job_id}" if record.job_id else ""))
    echo("next: " + ", ".join(t.isoformat(" ", "minutes") for t in sched.next_times(record)))


def _firing_env(obj: Context, root: Path) -> dict[str, str]:
    """What a schedule's firing needs of this shell: fleet's settings, its store and inventories,
    and where the team store's clients find their credentials (a night pushed from cron lands in the
    team store as it would from here)."""
    from ..store.team.config import CREDENTIAL_FILES, CREDENTIAL_LOCATIONS

    kept = ("PATH", "HOME", *CREDENTIAL_LOCATIONS)
    env = {k: v for k, v in os.environ.items() if k.startswith(("FLEET_", "SLURM_CONF"))
           or k in kept}
    env.update({k: os.path.abspath(env[k]) for k in CREDENTIAL_FILES if env.get(k)})
    env["FLEET_STORE"] = str(root)
    if obj.inventories:
        env["FLEET_INVENTORY"] = " ".join(str(Path(i).resolve()) for i in obj.inventories)
    return env


def _when(record: "ScheduleRecord") -> str:
    from ..nightly import schedule as sched

    if record.cron:
        return record.cron
    line = sched.when(record)
    return f"every {sched.duration(record.every)}" + (f", cron '{line}'" if line else "")


@schedule.command("ls")
@store_option
@json_option
def schedule_ls(store_root, as_json):
    """The schedules and how often each has fired."""
    from ..nightly import schedule as sched
    from .. import store

    records = [sched.ScheduleRecord.read(json.loads(p.read_text()))
               for p in sorted(sched.records_dir(store.root(store_root)).glob("*.json"))]
    listed = [(r, _next_times(r)) for r in records]
    if as_json:
        echo_json({"schedules": [{**r.doc, "next": times} for r, times in listed]})
        return
    for r, times in listed:
        nxt = ", ".join(t.replace("T", " ")[:16] for t in times)
        echo(f"{r.name}  {_when(r)}  {r.backend}  fired {r.fired}x  "
             f"next {nxt}  {r.playbook}")


def _next_times(record: "ScheduleRecord") -> list[str]:
    from ..nightly import schedule as sched

    try:
        return [t.isoformat(timespec="seconds") for t in sched.next_times(record)]
    except sched.ScheduleError:  # a record from before --every was checked against cron
        return []


@schedule.command("rm")
@click.argument("name")
@store_option
@json_option
def schedule_rm(name, store_root, as_json):
    """Remove a schedule (a pending scheduling job is cancelled)."""
    from ..nightly import schedule as sched
    from .. import store

    record = sched.remove(store.root(store_root), name)
    if as_json:
        return echo_json({"removed": record.doc})
    echo(f"removed {name} ({record.backend})")


@schedule.command("fire", hidden=True)
@click.argument("name")
@store_option
@click.pass_obj
def schedule_fire(obj: Context, name, store_root):
    """Run by the schedule itself: the next occurrence is set up, then the playbook runs."""
    from ..nightly import schedule as sched
    from .. import store

    record = sched.fire(store.root(store_root), name)
    m = run_playbook(obj, record.playbook, store_root, False, quiet=True)
    echo(f"schedule {name}: run {m.run_id} {m.status}")
    # a team store named in the site config file: the night lands there
    push_when_done(store_root, m)
