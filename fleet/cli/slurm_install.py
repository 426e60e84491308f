"""``fleet slurm``, for a cluster's admins: ``install`` writes (or prints) the prolog, the epilog
and the node config (docs/slurm-admin.md); ``prolog``, ``epilog`` and ``task-prolog`` are the entry
points slurmd runs on each node, fleet's agent run in-process."""

from __future__ import annotations

import sys

import click

from .. import exitcodes
from .context import Context, fail
from .output import echo_json, json_option
from .slurm import cluster_named
from .terminal import echo


@click.group("slurm")
def slurm_group():
    """Slurm integration for admins: install the prolog and epilog; the entry points slurmd runs."""


@slurm_group.command("install")
@click.option("--prefix", default="/etc/fleet", show_default=True,
              help="Where the files go (root-owned).")
@click.option("--python", "python_path", default="/usr/bin/python3", show_default=True,
              help="The compute nodes' Python 3.8+ (by absolute path: prologs get no PATH).")
@click.option("--owned-sysctl", "owned", multiple=True, metavar="NAME=VALUE",
              help="A sysctl jobs may have set for them, with its value (repeatable).")
@click.option("--cluster", help="Take owned_sysctls from this inventory cluster's login host.")
@click.option("--baseline-sysctl", "baseline", multiple=True, metavar="NAME=VALUE",
              help="An owned sysctl's value on the nodes outside jobs "
                   "(default: this machine's now).")
@click.option("--jobs-dir", default="/run/fleet/jobs", show_default=True)
@click.option("--state-dir", default="/var/lib/fleet", show_default=True)
@click.option("--log-file", default="/var/log/fleet/slurm.log", show_default=True)
@click.option("--fail-closed", is_flag=True,
              help="Drain a node whose owned state cannot be put back.")
@click.option("--pause-dcgm", is_flag=True,
              help="Let jobs ask for DCGM profiling to be paused (pre-Hopper).")
@click.option("--qdstrm-importer", type=click.Path(), metavar="PATH",
              help="The QdstrmImporter the epilog finishes reports with "
                   "(root-owned; default: newest under /opt/nvidia).")
@click.option("--finish-timeout", type=click.IntRange(1, 3600), default=120, show_default=True,
              help="Seconds the epilog may spend finishing unfinished reports.")
@click.option("--apply", "do_apply", is_flag=True,
              help="Write the files on this machine (as root).")
@click.option("--no-node-check", is_flag=True,
              help="With --apply: do not check --python on each node through a step "
                   "(Slurm not running yet).")
@json_option
@click.pass_obj
def slurm_install(obj: Context, prefix, python_path, owned, cluster, baseline, jobs_dir, state_dir,
                  log_file, fail_closed, pause_dcgm, qdstrm_importer, finish_timeout, do_apply,
                  no_node_check, as_json):
    """Print (or, with --apply, write) the slurm.conf lines, the wrapper scripts and the node
    config."""
    from ..slurm.install import NodeSetup, apply, baselines, check_options, check_python

    login = cluster_named(obj, None, cluster).login if cluster else None
    sysctls = dict(login.vars.get("owned_sysctls") or {}) if login else {}
    sysctls.update(_sysctl_items("--owned-sysctl", owned))
    given = _sysctl_items("--baseline-sysctl", baseline)
    check_options(sysctls, given, qdstrm_importer)
    check_python(python_path, writing=do_apply, on_nodes=not no_node_check)
    setup = NodeSetup(prefix, python_path, sysctls, jobs_dir, state_dir, log_file, fail_closed,
                      pause_dcgm, qdstrm_importer, finish_timeout, baselines(sysctls, given))
    written = []
    if do_apply:
        try:
            written = [str(path) for path in apply(setup)]
        except OSError as e:
            fail(str(e), exitcodes.FAILED)
    if as_json:
        files = {path: {"mode": f"{mode:o}", "bytes": len(content)}
                 for path, (content, mode) in setup.files().items()}
        return echo_json({"files": files, "written": written, "slurm_conf": setup.slurm_conf()})
    _print_install(setup, written, do_apply)


def _sysctl_items(option: str, items) -> dict:
    """--owned-sysctl's or --baseline-sysctl's NAME=VALUE items (a whole number as an int)."""
    values: dict = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            fail(f"{option} takes NAME=VALUE, not {item!r}")
        values[name] = int(value) if value.lstrip("-").isdigit() else value
    return values


def _print_install(setup, written: list[str], applied: bool) -> None:
    """The files written (with --apply), else each file as it would be written; then the lines
    slurm.conf needs."""
    if applied:
        for path in written:
            echo(f"wrote {path}")
    else:
        for path, (content, mode) in setup.files().items():
            if path == setup.agent:
                echo(f"# {path} ({mode:o}): fleet's node agent, {len(content)} bytes\n")
            else:
                echo(f"# {path} ({mode:o})\n{content.decode()}")
    echo(f"# Add to slurm.conf on every node (then `scontrol reconfigure`):\n{setup.slurm_conf()}",
         nl=False)


def _entry(op: str):
    @slurm_group.command(op, help=f"The Slurm {op}, run by slurmd (see `fleet slurm install`).")
    @click.option("--config", default="/etc/fleet/node.json", show_default=True)
    def run_op(config):
        from ..agent import slurmd

        sys.exit(slurmd.main({"op": op, "config": config}))

    return run_op


for _op in ("prolog", "epilog", "task-prolog"):
    _entry(_op)
