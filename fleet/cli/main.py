"""The command line: parse, call the library, print. No logic a test would need to reach through it."""

from __future__ import annotations

import asyncio
import json
import sys

import click

from .. import __version__, exitcodes
from .nightly import nightly, run_cmd, schedule
from .slurm import cancel, gather_on_slurm, jobs, profile_on_slurm, slurm_group, slurm_options
from ..inventory import Inventory, InventoryError, TargetError, load, local_inventory


class Context:
    def __init__(self, inventories: tuple[str, ...], ssh_config: str | None, known_hosts: str | None,
                 fanout: int):
        self.inventories, self.fanout = inventories, fanout
        self._ssh = (ssh_config, known_hosts)
        self._inventory: Inventory | None = None

    @property
    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = load(self.inventories) if self.inventories else local_inventory()
        return self._inventory

    def select(self, targets: str | None, exclude: tuple[str, ...]):
        return self.inventory.select([targets] if targets else [], exclude)

    def ssh_settings(self):
        from ..transport.settings import SSHSettings

        return SSHSettings.from_env(*self._ssh)

    def fanout_for_run(self):
        from ..transport import Fanout

        return Fanout(self.ssh_settings(), concurrency=self.fanout)


_fail = exitcodes.fail


class _Group(click.Group):
    """Turns inventory, target and store errors into one clear line and exit status 2."""

    def invoke(self, ctx: click.Context):
        from ..store import CatalogError

        try:
            return super().invoke(ctx)
        except (InventoryError, TargetError, CatalogError) as e:
            _fail(str(e))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fleet")
@click.option("-i", "--inventory", "inventories", multiple=True, envvar="FLEET_INVENTORY",
              type=click.Path(), help="Ansible-style YAML inventory file or directory (repeatable). "
              "Without one, fleet works on this machine alone.")
@click.option("--ssh-config", envvar="FLEET_SSH_CONFIG", help="ssh_config file (default ~/.ssh/config).")
@click.option("--known-hosts", envvar="FLEET_KNOWN_HOSTS", help="known_hosts file (default: as ssh_config says).")
@click.option("-f", "--fanout", default=64, show_default=True, type=click.IntRange(1, 4096),
              help="Hosts worked on at once.")
@click.pass_context
def main(ctx: click.Context, inventories, ssh_config, known_hosts, fanout):
    """Profile GPU workloads with Nsight across shared servers and Slurm clusters."""
    ctx.obj = Context(tuple(inventories), ssh_config, known_hosts, fanout)


# --- inventory ---

@main.group()
def inventory():
    """Read and check the inventory."""


@inventory.command("list")
@click.argument("targets", required=False)
@click.option("-x", "--exclude", multiple=True, help="Hosts, groups or ranges to leave out.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document with every host and its merged variables.")
@click.pass_obj
def inventory_list(obj: Context, targets, exclude, as_json):
    """List the hosts that TARGETS name (default: all), with their merged variables."""
    hosts = obj.select(targets, exclude)
    if as_json:
        groups = {g: [h for h in members if h in {x.name for x in hosts}]
                  for g, members in obj.inventory.groups.items()}
        click.echo(json.dumps({"sources": obj.inventory.sources, "hosts": [h.to_json() for h in hosts],
                               "groups": {g: m for g, m in groups.items() if m}}, indent=2, default=str))
        return
    rows = [(h.name, h.address + (f":{h.port}" if h.port else ""), h.user or "", ",".join(h.groups), h.connection)
            for h in hosts]
    widths = [max([len(r[i]) for r in rows] + [len(t)]) for i, t in enumerate(("HOST", "ADDRESS", "USER", "GROUPS"))]
    click.echo("  ".join(t.ljust(w) for t, w in zip(("HOST", "ADDRESS", "USER", "GROUPS"), widths)) + "  VIA")
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)) + f"  {r[4]}")


@inventory.command("check")
@click.pass_obj
def inventory_check(obj: Context):
    """Validate the inventory; exit 2 naming file and line on the first error."""
    inv = obj.inventory
    groups = [g for g in inv.groups if g != "all"]
    click.echo(f"ok: {len(inv.hosts)} hosts in {len(groups)} groups ({', '.join(inv.sources)})")


# --- exec ---

@main.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("targets")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("-x", "--exclude", multiple=True, help="Hosts, groups or ranges to leave out.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host (JSON lines).")
@click.option("--timeout", type=float, help="Seconds before the command is stopped (SIGTERM) on a host.")
@click.pass_obj
def exec_(obj: Context, targets, command, exclude, as_json, timeout):
    """Run COMMAND on every host TARGETS names; identical outputs are shown once.

    COMMAND's arguments reach the host exactly as given (quoted for its shell):
    for pipes or redirection run a shell yourself, `fleet exec all -- sh -c 'a | b'`.
    """
    from .output import print_gathered, print_json_lines, progress, summary

    hosts = obj.select(targets, exclude)

    async def go():
        async with obj.fanout_for_run() as fan:
            with progress(len(hosts), "exec", enabled=not as_json) as advance:
                return await fan.run_all(hosts, list(command), timeout=timeout, on_result=advance)

    results = asyncio.run(go())
    if as_json:
        print_json_lines(results)
    else:
        print_gathered(results)
        if len(results) > 1 or not results[0].ok:
            click.echo(summary(results), err=True)
    sys.exit(exitcodes.for_results(results))


# --- probe and doctor ---

def _probe(obj: Context, targets, exclude, as_json, environment_check=False):
    from ..lab import probe as probe_mod
    from .output import progress

    hosts = obj.select(targets, exclude)

    async def go():
        async with obj.fanout_for_run() as fan:
            with progress(len(hosts), "probe", enabled=not as_json) as advance:
                return await probe_mod.probe(fan, hosts, environment_check=environment_check, on_result=advance)

    return hosts, asyncio.run(go())


@main.command()
@click.argument("targets", required=False)
@click.option("-x", "--exclude", multiple=True, help="Hosts, groups or ranges to leave out.")
@click.option("--json", "as_json", is_flag=True, help="The agent's document for every node.")
@click.pass_obj
def probe(obj: Context, targets, exclude, as_json):
    """The GPUs of each node and who is on them (user, pid, memory); MIG, MPS, DCGM."""
    from ..lab.doctor import render_probe

    hosts, results = _probe(obj, targets, exclude, as_json)
    if as_json:
        click.echo(json.dumps({"nodes": [{"host": h.name, "error": r.error, "error_kind": r.error_kind,
                                          "state": r.extra.get("state")} for h, r in zip(hosts, results)]},
                              indent=2))
    else:
        for h, r in zip(hosts, results):
            click.echo(render_probe(h.name, r), nl=False, err=r.error is not None)
    sys.exit(exitcodes.for_results(results))


@main.command()
@click.argument("targets", required=False)
@click.option("-x", "--exclude", multiple=True, help="Hosts, groups or ranges to leave out.")
@click.option("--json", "as_json", is_flag=True, help="Findings and verdicts of every node as JSON.")
@click.option("--strict", is_flag=True, help="Exit 4 when a way to profile is degraded, 5 when one is refused.")
@click.pass_obj
def doctor(obj: Context, targets, exclude, as_json, strict):
    """Per node: the five problems (placement, wrapping, collection, permissions,
    neighbours) and, for each way to profile, ok, degraded or refused, with why and what to do.

    Without an inventory it examines this machine.
    """
    from ..lab.doctor import diagnosis, render_doctor, worst

    hosts, results = _probe(obj, targets, exclude, as_json, environment_check=True)
    diagnoses = [diagnosis(h, r) for h, r in zip(hosts, results)]
    if as_json:
        click.echo(json.dumps({"nodes": diagnoses}, indent=2))
    else:
        click.echo("\n".join(render_doctor(d) for d in diagnoses), nl=False)
    code = exitcodes.for_results(results)
    if strict and code == exitcodes.OK:
        code = {"refused": exitcodes.REFUSED, "degraded": exitcodes.DEGRADED}.get(worst(diagnoses), exitcodes.OK)
    sys.exit(code)


# --- profile and repair ---

@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--hosts", "hosts_", help="Hosts or ranges to profile on.")
@click.option("--group", "group", help="Inventory group to profile on.")
@click.option("-x", "--exclude", multiple=True, help="Hosts, groups or ranges to leave out.")
@click.option("--tool", type=click.Choice(["nsys", "ncu"]), default="nsys", show_default=True)
@click.option("--gpu", "gpus", multiple=True, type=int, help="GPU index the workload runs on (repeatable); "
              "it gets CUDA_VISIBLE_DEVICES and the neighbour check covers it. Default: every GPU.")
@click.option("--gpu-metrics", is_flag=True, help="nsys: sample GPU metrics (counters; refused beside tenants).")
@click.option("--allow-own", is_flag=True, help="Your own other processes on the GPU are not tenants.")
@click.option("--pause-dcgm", is_flag=True, help="Pause DCGM profiling for the run on pre-Hopper GPUs (owned nodes).")
@click.option("--wait", "lock_wait", type=float, default=0.0, help="Seconds to wait for another run's GPU lock.")
@click.option("--timeout", type=float, help="Seconds, then the profiler is stopped (SIGTERM) and its report kept.")
@click.option("-X", "--profiler-arg", "profiler_args", multiple=True, help="Extra argument for nsys/ncu (repeatable).")
@click.option("--docker", "docker_image", help="Lab servers: run the workload and the node's profiler in this "
              "Docker image, with the least privilege the plan needs.")
@click.option("--store", "store_root", type=click.Path(), envvar="FLEET_STORE",
              help="Report store (default ~/.local/share/fleet/store): SITE/DAY/RUN-ID/HOST/.")
@click.option("--site", default="lab", show_default=True, help="Store folder for this group of machines.")
@click.option("--dry-run", is_flag=True, help="Print each node's plan (commands, sysctls, locks, refusals); touch nothing.")
@click.option("--json", "as_json", is_flag=True, help="Every host's plan, result and reports as JSON.")
@slurm_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def profile(obj: Context, hosts_, group, exclude, tool, gpus, gpu_metrics, allow_own, pause_dcgm, lock_wait,
            timeout, profiler_args, docker_image, store_root, site, dry_run, as_json, command, **slurm):
    """Profile COMMAND with nsys or ncu on lab servers (--hosts, --group) or in a Slurm
    batch job (--partition), leaving every node as it was.

    ncu and GPU metrics are refused on a GPU with any other tenant. Ctrl-C stops the
    profiler with SIGTERM so the report is finished; a second Ctrl-C leaves the
    nodes (or the job) to finish on their own.
    """
    from ..lab import profile as profile_mod
    from .. import store
    from .interrupt import stop_on_signals
    from ..plan import ProfileRequest, profiler_args_error

    if (why := profiler_args_error(tool, tuple(profiler_args))):
        _fail(why)
    req = ProfileRequest(tool=tool, command=tuple(command), run_id=profile_mod.new_run_id(),
                         gpus=tuple(gpus) or None, gpu_metrics=gpu_metrics, allow_own=allow_own,
                         pause_dcgm=pause_dcgm, profiler_args=tuple(profiler_args), timeout=timeout,
                         lock_wait=lock_wait, docker_image=docker_image)
    if slurm.get("partition") or slurm.get("cluster"):
        if hosts_ or group:
            _fail("--partition/--cluster (a Slurm job) and --hosts/--group (lab servers) do not mix")
        if docker_image:
            _fail("on Slurm, containers are --container-image (pyxis) or --apptainer")
        if gpus:
            _fail("on Slurm, ask for GPUs with --gpus or --gres; --gpu picks a GPU on a lab server")
        if timeout or lock_wait:
            _fail("on Slurm, the job's --time bounds the run (the profilers stop --stop-before seconds ahead); "
                  "--timeout and --wait are for lab servers")
        return profile_on_slurm(obj, req, slurm, store_root=store_root, site=None if site == "lab" else site,
                                dry_run=dry_run, as_json=as_json)
    targets = ",".join(t for t in (hosts_, group) if t)
    if not targets:
        _fail("name where to profile: --hosts H or --group G (lab servers), or --partition P (Slurm)")
    hosts = obj.select(targets, exclude)

    def write(stream: str, text: str) -> None:
        (sys.stderr if stream == "stderr" or as_json else sys.stdout).write(text)

    async def go():
        stop = stop_on_signals("stopping the profilers (SIGTERM), waiting for their reports")
        from .output import byte_progress

        async with obj.fanout_for_run() as fan:
            with byte_progress(enabled=not as_json and not dry_run) as gathering:
                return await profile_mod.profile(fan, hosts, req, store_root=store.root(store_root), site=site,
                                                 dry_run=dry_run, write=write, stop=stop, gathering=gathering)

    try:
        manifest = asyncio.run(go())
    except KeyboardInterrupt:  # the second Ctrl-C
        _fail(f"left the nodes to finish on their own; bring the reports home later with: fleet gather {req.run_id}",
              130)
    if as_json:
        click.echo(json.dumps(profile_mod.json_doc(manifest), indent=2, default=str))
    else:
        for h in manifest.hosts:
            click.echo(profile_mod.render(h), nl=False, err=h.status not in ("ok", "planned"))
    sys.exit(exitcodes.for_run(manifest))


@main.command()
@click.argument("run_id")
@click.option("--store", "store_root", type=click.Path(), envvar="FLEET_STORE")
@click.pass_obj
def gather(obj: Context, run_id, store_root):
    """Bring home what run RUN_ID left on its nodes (after fleet was killed, or a failed transfer)."""
    from ..lab import profile as profile_mod
    from .. import store

    try:
        if store.load_run(store.root(store_root), run_id).slurm is not None:
            return gather_on_slurm(obj, run_id, store_root)
    except LookupError as e:
        _fail(str(e))

    async def go():
        async with obj.fanout_for_run() as fan:
            return await profile_mod.gather(fan, obj.inventory.hosts, store.root(store_root), run_id)

    manifest = asyncio.run(go())
    for h in manifest.hosts:
        click.echo(f"{h.host}: {h.status}" + (f" ({h.missing_why})" if h.missing_why else ""))
        for r in h.reports:
            click.echo(f"  {r.stored} ({'verified' if r.verified else r.error})")
    sys.exit(exitcodes.for_run(manifest))


@main.command()
@click.argument("targets")
@click.option("-x", "--exclude", multiple=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def repair(obj: Context, targets, exclude, as_json):
    """Put back what killed runs left changed on TARGETS (owned sysctls, DCGM pause)."""
    from ..lab import probe as probe_mod
    from ..agent.bundle import bundle

    hosts = obj.select(targets, exclude)

    async def go():
        async with obj.fanout_for_run() as fan:
            payload = bundle()
            return await fan.each(hosts, lambda h: fan.run(h, probe_mod.agent_argv(h, {"mode": "repair"}),
                                                           input=payload))

    results = asyncio.run(go())
    for h, r in zip(hosts, results):
        doc = json.loads(r.stdout) if r.exit_status is not None and r.stdout.strip() else {"error": r.error}
        if as_json:
            click.echo(json.dumps({"host": h.name, **doc}))
        elif doc.get("error"):
            click.echo(f"{h.name}: {doc['error']}", err=True)
        else:
            done = doc["value"]
            restored = ", ".join(f"{k}={v}" for k, v in done["restored"].items()) or "nothing to put back"
            click.echo(f"{h.name}: {restored}" + ("; DCGM profiling resumed" if done["dcgm_resumed"] else ""))
    sys.exit(exitcodes.for_results(results))


# --- hosts ---

@main.group()
def hosts():
    """Manage what fleet knows about hosts (SSH host keys)."""


@hosts.command("trust")
@click.argument("targets")
@click.option("-x", "--exclude", multiple=True)
@click.option("--yes", is_flag=True, help="Accept without asking.")
@click.pass_obj
def hosts_trust(obj: Context, targets, exclude, yes):
    """Fetch the host keys of TARGETS, show their fingerprints, record the accepted ones."""
    from ..transport import hostkeys
    from ..transport.ssh import SSHTransport

    chosen = [h for h in obj.select(targets, exclude) if h.connection == "ssh"]
    ssh = SSHTransport(obj.ssh_settings())

    async def fetch():
        return await asyncio.gather(*(hostkeys.offered_key(ssh, h) for h in chosen))

    offered = asyncio.run(fetch())
    code = exitcodes.OK
    accept = []
    for k in offered:
        if k.state == "error":
            click.echo(f"{k.host}: cannot fetch its key: {k.error}", err=True)
            code = exitcodes.UNREACHABLE
        elif k.state == "known":
            click.echo(f"{k.host}: {k.fingerprint} already trusted")
        elif k.state == "changed":  # as ssh does: the old key goes only by hand
            click.echo(f"{k.host}: {k.fingerprint} DIFFERS from the key recorded in {k.file}; not accepted. "
                       f"Once checked, remove the old one (ssh-keygen -R '{k.pattern}' -f {k.file}) "
                       "and trust again.", err=True)
            code = exitcodes.FAILED
        else:
            click.echo(f"{k.host}: {k.fingerprint} -> {k.file}")
            accept.append(k)
    if accept and not yes:
        if not sys.stdin.isatty():
            _fail("not accepting keys without a terminal to confirm on; pass --yes")
        if not click.confirm(f"Trust {len(accept)} host key(s)?", default=False):
            _fail("nothing recorded", exitcodes.FAILED)
    hostkeys.record(accept)
    sys.exit(code)


from .reports import reports  # noqa: E402  (a group of its own, registered here)

main.add_command(reports)
main.add_command(jobs)
main.add_command(cancel)
main.add_command(slurm_group)
main.add_command(run_cmd)
main.add_command(schedule)
main.add_command(nightly)

if __name__ == "__main__":  # pragma: no cover
    main()
