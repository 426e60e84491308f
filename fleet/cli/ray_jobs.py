"""``fleet ray submit``: a Ray job submitted to a running Ray cluster, its workers profiled by
nsys."""

from __future__ import annotations

import sys

import click

from .context import Context, fail, store_option
from .output import echo_json, json_option
from .terminal import echo, say


@click.group("ray")
def ray_group():
    """Ray clusters already running: submit a job whose workers nsys profiles."""


@ray_group.command("submit", context_settings={"ignore_unknown_options": True})
@click.option("--address", required=True, envvar="RAY_ADDRESS",
              help="The Ray cluster's dashboard, as "
              "`ray job submit` takes it, e.g. http://127.0.0.1:8265.")
@click.option("--ranks",
              help="Profile only the actors whose names match these patterns (e.g. 'trainer-*'; "
              "several separated by commas); the others start without nsys.")
@click.option("--node-dir",
              help="The run's folder on the nodes, made private by the workers, refused where "
              "another account could swap it (default ~/.cache/fleet-ray-runs/RUN, in the home of "
              "the user Ray runs as); a folder every node shares brings every node's reports home.")
@click.option("--head", help="The inventory host of the Ray head, to bring the reports home from "
              "(default: this machine, for an address on loopback).")
@click.option("--working-dir", help="Ray's --working-dir: uploaded, the entrypoint runs in it.")
@click.option("-X", "--profiler-arg", "profiler_args", multiple=True,
              help="Extra nsys option, as Ray's "
              "_nsight block takes it (repeatable), e.g. -X --sample=none.")
@store_option
@click.option("--site", default="ray", show_default=True,
              help="Store folder for this cluster's runs.")
@json_option
@click.argument("entrypoint", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def submit(obj: Context, address, ranks, node_dir, head, working_dir, profiler_args, store_root,
           site, as_json, entrypoint):
    """Submit ENTRYPOINT as a Ray job (`ray job submit`), with fleet's runtime_env: every worker,
    or the actors --ranks names, under nsys; each report named by its actor or task, its node and
    pid, and brought home from the head into the store.
    """
    import asyncio

    from .. import completeness, outcome, store
    from ..plan import ProfileRequest
    from ..ray import submit as ray_submit
    from ..run import RayRun
    from ..slurm.launchers import actor_patterns
    from ..store.records import new_run_id

    req = ProfileRequest(tool="nsys", command=tuple(entrypoint), run_id=new_run_id(),
                         profiler_args=tuple(profiler_args))
    job = ray_submit.RayJob(address=address, entrypoint=tuple(entrypoint),
                            node_dir=node_dir or f"{ray_submit.NODE_DIR}/{req.run_id}",
                            actors=actor_patterns(ranks) if ranks is not None else (),
                            profiler_args=tuple(profiler_args), working_dir=working_dir,
                            submission_id=f"fleet-{req.run_id}")
    if (why := job.problem()):
        fail(why)
    if head is None and not ray_submit.loopback(address):
        fail(f"--head HOST: which inventory host is the Ray head at {address}, "
             "to bring its reports home from")
    hosts = obj.select(head or "localhost", ())
    if len(hosts) != 1:
        fail(f"--head {head}: names {len(hosts)} hosts, not one")
    # a site that is no folder name stops here
    store.run_dir(store.root(store_root), site, req.run_id)

    run = RayRun(req, store.root(store_root), site, head=hosts[0], job=job)
    manifest = asyncio.run(run.go(obj.ssh_settings(), obj.fanout))
    if as_json:
        echo_json(manifest.to_json())
    else:
        for h in manifest.hosts:
            say(f"  {h.host} {h.worker or ''}: {h.status}" + (f": {h.missing_why}" if h.missing_why
                                                              else ""))
            for line in outcome.detail_lines(h, indent="    ", hashes=False):
                echo(line)
        for line in completeness.run_lines(manifest.hosts):
            echo(line)
        if manifest.error:
            echo(f"fleet: {manifest.error}", err=True)
        directory = store.run_dir(store.root(store_root), manifest.site, manifest.run_id)
        echo(f"run {manifest.run_id} {manifest.status}: reports in {directory} "
             f"(fleet reports show {manifest.run_id})")
    sys.exit(run.exit_status())
