"""Hosts: the inventory, running commands, probing and diagnosing nodes, putting
them back, host keys."""

from __future__ import annotations

import asyncio
import sys

import click

from .. import exitcodes
from .context import Context, exclude_option, fail
from .output import echo_json, json_option
from .parsing import WorkloadCommand
from .terminal import echo

# --- inventory ---

@click.group()
def inventory():
    """Read and check the inventory."""


@inventory.command("list")
@click.argument("targets", required=False)
@exclude_option
@json_option
@click.pass_obj
def inventory_list(obj: Context, targets, exclude, as_json):
    """List the hosts that TARGETS name (default: all), with their merged variables."""
    hosts = obj.select(targets, exclude)
    if as_json:
        _echo_listing_json(obj.inventory, hosts)
    else:
        _echo_host_table(hosts)


def _echo_listing_json(inv, hosts) -> None:
    """The selected hosts as JSON, with the groups that hold any of them (only those hosts)."""
    groups = {g: [h for h in members if h in {x.name for x in hosts}]
              for g, members in inv.groups.items()}
    echo_json({"sources": inv.sources, "hosts": [h.to_json() for h in hosts],
               "groups": {g: m for g, m in groups.items() if m}})


def _echo_host_table(hosts) -> None:
    """The selected hosts as a table: name, address, user, groups and how fleet reaches each."""
    rows = [(h.name, h.address + (f":{h.port}" if h.port else ""), h.user or "", ",".join(h.groups),
             h.connection)
            for h in hosts]
    widths = [max([len(r[i]) for r in rows] + [len(t)])
              for i, t in enumerate(("HOST", "ADDRESS", "USER", "GROUPS"))]
    echo("  ".join(t.ljust(w) for t, w in zip(("HOST", "ADDRESS", "USER", "GROUPS"), widths))
         + "  VIA")
    for r in rows:
        echo("  ".join(c.ljust(w) for c, w in zip(r, widths)) + f"  {r[4]}")


@inventory.command("check")
@json_option
@click.pass_obj
def inventory_check(obj: Context, as_json):
    """Validate the inventory; exit 2 naming file and line on the first error."""
    inv = obj.inventory
    groups = [g for g, hosts in inv.groups.items() if g != "all" and (hosts or g != "ungrouped")]
    lines, refused = _routes(obj, list(inv.hosts.values()))
    if as_json and not refused:
        return echo_json({"sources": inv.sources, "hosts": len(inv.hosts), "groups": groups,
                          "warnings": inv.warnings, "connections": lines})
    for warning in inv.warnings:  # variables kept as the site's, which fleet will not use
        echo(f"fleet: warning: {warning}", err=True)
    for line in lines if not as_json else ():
        echo(line)
    if refused:
        for line in refused[:-1]:
            echo(f"fleet: {line}", err=True)
        fail(refused[-1])
    echo(f"ok: {len(inv.hosts)} hosts in {len(groups)} groups ({', '.join(inv.sources)})")


def _routes(obj: Context, hosts) -> tuple[list[str], list[str]]:
    """Per host, how fleet will connect (user, port, key, jump hosts); and the hosts whose ssh
    arguments hold an option fleet cannot honour."""
    from ..inventory.connection import ConnectionOptionError, describe
    from ..transport.ssh import SSHTransport

    transport = SSHTransport(obj.ssh_settings())
    lines, refused = [], []
    for h in hosts:
        try:
            lines.append(describe(h, transport.route(h) if h.connection == "ssh" else {}))
        except ConnectionOptionError as e:
            refused.append(str(e))
    return lines, refused


# --- exec ---

@click.command("exec", cls=WorkloadCommand, leading=1)
@click.argument("targets")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@exclude_option
@click.option("--json", "as_json", is_flag=True,
              help="One JSON envelope per host as it finishes (JSON lines).")
@click.option("--timeout", type=float,
              help="Seconds before the command is stopped (SIGTERM) on a host.")
@click.option("-S", "--maxrc", is_flag=True,
              help="Exit with the largest of the hosts' statuses (as pdsh -S); "
              "one host's status is always its own.")
@click.pass_obj
def exec_(obj: Context, targets, command, exclude, as_json, timeout, maxrc):
    """Run COMMAND on every host TARGETS names; identical outputs are shown once.

    COMMAND's arguments reach the host exactly as given (quoted for its shell):
    for pipes or redirection run a shell yourself, `fleet exec all -- sh -c 'a | b'`.
    """
    from .output import echo_json_line, print_gathered, progress, summary

    hosts = obj.select(targets, exclude)

    with progress(len(hosts), "exec", enabled=not as_json) as advance:
        # --json streams: each host's line as soon as it is done, for thousands of hosts
        on_result = (lambda r: echo_json_line(r.to_json())) if as_json else advance
        results = obj.over_pool(lambda fan: fan.run_all(hosts, list(command), timeout=timeout,
                                                        on_result=on_result, last_use=True))
    if not as_json:
        print_gathered(results)
        if len(results) > 1 or not results[0].ok:
            echo(summary(results), err=True)
    sys.exit(exitcodes.for_exec(results, maxrc=maxrc))


# --- probe and doctor ---

partition_options = [
    click.option("--partition", "-p",
                 help="Probe this Slurm partition's compute nodes, as a "
                      "short job (one step a node)."),
    click.option("--nodes", "-N", type=click.IntRange(1),
                 help="With --partition: this many of its nodes (default all)."),
    click.option("--cluster",
                 help="With --partition: which cluster, when the inventory describes several."),
]


def with_partition_options(command):
    for option in reversed(partition_options):
        command = option(command)
    return command


def _probe(obj: Context, targets, exclude, as_json, environment_check=False, partition=None,
           nodes=None, cluster=None):
    from .. import agentcall
    from .output import progress

    if partition is None and (nodes is not None or cluster is not None):
        fail("--nodes and --cluster choose compute nodes of a Slurm "
             "partition: give --partition too")
    if partition is not None:
        if targets or exclude:
            fail("give TARGETS (inventory hosts) or --partition (a Slurm "
                 "partition's compute nodes), not both")
        return _probe_partition(obj, partition, nodes, cluster, environment_check)
    hosts = obj.select(targets, exclude)

    with progress(len(hosts), "probe", enabled=not as_json) as advance:
        return hosts, obj.over_pool(lambda fan: agentcall.probe(fan, hosts,
                                                                environment_check=environment_check,
                                                                on_result=advance, last_use=True))


def _probe_partition(obj: Context, partition, nodes, cluster_name, environment_check):
    from ..slurm.cluster import choose
    from ..slurm.jobs import SlurmError
    from ..slurm.probe import probe_partition

    cluster = choose(obj.inventory, partition, cluster_name, embedded=not obj.inventories)

    try:
        found = obj.over_pool(lambda fan: probe_partition(fan, cluster, partition, nodes,
                                                          environment_check=environment_check))
    except SlurmError as e:
        fail(str(e), exitcodes.of_error(e))
    return [h for h, _ in found], [r for _, r in found]


@click.command()
@click.argument("targets", required=False)
@exclude_option
@with_partition_options
@json_option
@click.pass_obj
def probe(obj: Context, targets, exclude, partition, nodes, cluster, as_json):
    """The GPUs of each node and who is on them (user, pid, memory); MIG, MPS, DCGM.
    With --partition, the compute nodes of a Slurm partition."""
    from ..agentcall import probed_document
    from ..lab.doctor import render_probe

    hosts, results = _probe(obj, targets, exclude, as_json, partition=partition, nodes=nodes,
                            cluster=cluster)
    if as_json:
        echo_json({"nodes": [{"host": h.name, "error": r.error, "error_kind": r.error_kind,
                              "state": probed_document(r)} for h, r in zip(hosts, results)]})
    else:
        for h, r in zip(hosts, results):
            echo(render_probe(h.name, r), nl=False, err=r.error is not None)
    sys.exit(exitcodes.for_results(results))


@click.command()
@click.argument("targets", required=False)
@exclude_option
@with_partition_options
@json_option
@click.option("--strict", is_flag=True,
              help="Exit 4 when a way to profile is degraded, 5 when one is refused.")
@click.pass_obj
def doctor(obj: Context, targets, exclude, partition, nodes, cluster, as_json, strict):
    """Per node: the five problems (placement, wrapping, collection, permissions,
    neighbours) and, for each way to profile, ok, degraded or refused, with why and what to do.

    Without an inventory it examines this machine.
    """
    from ..lab.doctor import diagnosis, render_doctor, worst

    hosts, results = _probe(obj, targets, exclude, as_json, environment_check=True,
                            partition=partition, nodes=nodes, cluster=cluster)
    diagnoses = [diagnosis(h, r) for h, r in zip(hosts, results)]
    if as_json:
        echo_json({"nodes": diagnoses})
    else:
        echo("\n".join(render_doctor(d) for d in diagnoses), nl=False)
    sys.exit(exitcodes.for_doctor(results, worst(diagnoses), strict=strict))


@click.command()
@click.argument("targets")
@exclude_option
@click.option("--dry-run", is_flag=True, help="Say what would be put back; change nothing.")
@json_option
@click.pass_obj
def repair(obj: Context, targets, exclude, dry_run, as_json):
    """Put back what killed runs left changed on TARGETS (owned sysctls, DCGM pause)."""
    from .. import agentcall
    from ..agent.bundle import bundle

    hosts = obj.select(targets, exclude)
    payload = bundle()
    args = {"mode": "repair", **({"dry_run": True} if dry_run else {})}
    answers = obj.over_pool(lambda fan: fan.each(hosts, lambda h: fan.run(h, agentcall.agent_argv(
        h, args),
                                                                          input=payload),
                                                 last_use=True))
    results = [agentcall.read_repair(h, r) for h, r in zip(hosts, answers)]
    if as_json:
        echo_json({"dry_run": dry_run, "hosts": [
            {"host": h.name, **({"error": r.error} if r.error
                                else {"value": r.extra["repair"].to_json()})}
            for h, r in zip(hosts, results)]})
    else:
        for h, r in zip(hosts, results):
            _say_repaired(h.name, r, dry_run)
    sys.exit(exitcodes.for_results(results))


def _say_repaired(host: str, r, dry_run: bool) -> None:
    """A host's line: what was (or would be) put back, or why the host could not say."""
    if r.error:
        echo(r.error if r.error.startswith(f"{host}:") else f"{host}: {r.error}", err=True)
        return
    done = r.extra["repair"]
    restored = ", ".join(f"{k}={v}" for k, v in done.restored.items()) or "nothing to put back"
    resumed = "; DCGM profiling " + ("would be " if dry_run else "") + "resumed"
    echo(f"{host}: " + ("would put back " if dry_run and done.restored else "") + restored
         + (resumed if done.dcgm_resumed else ""))


# --- hosts ---

@click.group()
def hosts():
    """Manage what fleet knows about hosts (SSH host keys)."""


@hosts.command("trust")
@click.argument("targets")
@exclude_option
@click.option("--yes", is_flag=True, help="Accept without asking.")
@json_option
@click.pass_obj
def hosts_trust(obj: Context, targets, exclude, yes, as_json):
    """Fetch the host keys of TARGETS, show their fingerprints, record the accepted ones."""
    from ..transport import hostkeys
    from ..transport.ssh import SSHTransport

    chosen = [h for h in obj.select(targets, exclude) if h.connection == "ssh"]
    ssh = SSHTransport(obj.ssh_settings())

    async def fetch():
        return await asyncio.gather(*(hostkeys.offered_key(ssh, h) for h in chosen))

    def say(line: str, err: bool = False) -> None:  # with --json, stdout holds the document alone
        echo(line, err=err or as_json)

    offered = asyncio.run(fetch())
    accept = []
    for k in offered:
        if k.state == "error":
            say(f"{k.host}: cannot fetch its key: {k.error}", err=True)
        elif k.state == "known":
            say(f"{k.host}: {k.fingerprint} already trusted")
        elif k.state == "changed":  # as ssh does: the old key goes only by hand
            say(f"{k.host}: {k.fingerprint} DIFFERS from the key recorded in {k.file}; not "
                f"accepted. Once checked, remove the old one (ssh-keygen -R '{k.pattern}' -f "
                f"{k.file}) and trust again.", err=True)
        else:
            say(f"{k.host}: {k.fingerprint} -> {k.file}")
            accept.append(k)
    if accept and not yes:
        if not sys.stdin.isatty():
            fail("not accepting keys without a terminal to confirm on; pass --yes")
        if not click.confirm(f"Trust {len(accept)} host key(s)?", default=False, err=as_json):
            fail("nothing recorded", exitcodes.FAILED)
    hostkeys.record(accept)  # a KnownHostsError is a FleetError: one line, exit FAILED
    if as_json:
        echo_json({"keys": [{"host": k.host, "state": k.state, "fingerprint": k.fingerprint,
                             "file": k.file,
                             "recorded": k in accept, "error": k.error} for k in offered]})
    sys.exit(exitcodes.for_host_keys(k.state for k in offered))
