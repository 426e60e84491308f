"""``fleet reports``: the report store and its catalog, from the command line."""

from __future__ import annotations

import sys

from typing import TYPE_CHECKING

import click

from .. import exitcodes
from .parsing import Day
from .context import store_option
from .output import echo_json, json_option

if TYPE_CHECKING:
    from ..store.manifest import RunManifest


def _manifest(store_root: str | None, run_id: str) -> "RunManifest":
    from .. import store

    try:
        return store.load_run(store.root(store_root), run_id)
    except LookupError as e:
        click.echo(f"fleet: {e}", err=True)
        sys.exit(exitcodes.USAGE)


@click.group()
def reports():
    """The report store and its catalog."""


@reports.command("ls")
@store_option
@click.option("--host", help="Only reports from this host.")
@click.option("--since", type=Day(), help="Only runs started on or after this date (YYYY-MM-DD).")
@click.option("--tool", type=click.Choice(["nsys", "ncu"]))
@click.option("--status", type=click.Choice(["complete", "finished-from-qdstrm", "summary", "missing", "refused",
                                            "running"]))
@json_option
def reports_ls(store_root, host, since, tool, status, as_json):
    """List the catalogued reports."""
    from .. import store

    rows = store.reports(store.root(store_root), host=host, since=since, tool=tool, status=status)
    if as_json:
        return echo_json(rows)
    from .output import print_table

    print_table(["RUN", "HOST", "TOOL", "STATUS", "SHA256", "PATH"],
                [[r["run_id"], r["host"], r["tool"], r["status"], (r["sha256"] or "")[:12], r["path"]] for r in rows],
                status_column=3)


@reports.command("show")
@click.argument("run_id")
@store_option
@json_option
def reports_show(run_id, store_root, as_json):
    """A run's manifest: request, hosts, reports, what is missing and why."""
    m = _manifest(store_root, run_id)
    if as_json:
        return echo_json(m.to_json())
    tool = m.request.get("tool")
    click.echo(f"run {m.run_id} ({m.status}), site {m.site}, by {m.user} at {m.started}: "
               f"{tool} -- {' '.join(m.request.get('command') or [])}")
    for h in m.hosts:
        who = h.host + (f" rank {h.rank}" if h.rank is not None else "") + (f" {h.worker}" if h.worker else "")
        click.echo(f"  {who}: {h.status}" + (f" ({h.missing_why})" if h.missing_why else "")
                   + (f"; {h.gpu}, driver {h.driver}, {tool} {h.tool_version}" if h.gpu else ""))
        for g in h.given_up:
            click.echo(f"      gave up: {g}")
        for r in h.reports:
            click.echo(f"      {r.status:<21} {(r.sha256 or '')[:12]:<12}  {r.stored or r.remote}")


@reports.command("pull")
@click.argument("run_id")
@click.argument("dest", type=click.Path())
@store_option
@json_option
def reports_pull(run_id, dest, store_root, as_json):
    """Copy a run's reports out of the store into DEST/HOST/, checked against their sha256."""
    import shutil
    from pathlib import Path

    from ..store.collect import sha256_of

    manifest = _manifest(store_root, run_id)
    code = exitcodes.OK
    copied = []
    for h in manifest.hosts:
        for r in h.reports:
            if r.status == "missing":
                continue
            if not r.verified:  # a summary that did not come home: the run's reports are still whole
                click.echo(f"{h.host}: {Path(r.stored).name} is not in the store ({r.error})", err=True)
                continue
            target = Path(dest) / h.host / Path(r.stored).name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(r.stored, target)
            ok = sha256_of(target) == r.sha256
            code = code if ok else exitcodes.FAILED
            copied.append({"host": h.host, "path": str(target), "sha256": r.sha256, "verified": ok})
            if not as_json:
                click.echo(f"{target}{'' if ok else '  SHA256 MISMATCH: the stored copy is damaged'}")
    if as_json:
        echo_json({"run_id": run_id, "copied": copied})
    sys.exit(code)


@reports.command("rm")
@click.argument("run_id")
@store_option
@json_option
def reports_rm(run_id, store_root, as_json):
    """Delete a run's reports and manifest from the store and the catalog."""
    from .. import store

    _manifest(store_root, run_id)  # says so clearly when there is no such run
    removed = store.remove_run(store.root(store_root), run_id)
    if as_json:
        return echo_json({"run_id": run_id, "removed": str(removed)})
    click.echo(f"removed {removed}")


@reports.command("compare")
@click.argument("run_a")
@click.argument("run_b")
@store_option
@click.option("--top", type=int, default=15, show_default=True)
@json_option
def reports_compare(run_a, run_b, store_root, top, as_json):
    """The GPU kernels whose total time changed most from RUN_A to RUN_B (nsys runs)."""
    from .. import store

    for run in (run_a, run_b):
        _manifest(store_root, run)
    rows = store.compare(store.root(store_root), run_a, run_b)[:top]
    if as_json:
        return echo_json(rows)
    click.echo(f"{'A ms':>10} {'B ms':>10} {'change':>8}  kernel")
    for r in rows:
        change = f"{r['change'] * 100:+.1f}%" if r["change"] is not None else "new"
        click.echo(f"{r['a_ns'] / 1e6:10.3f} {r['b_ns'] / 1e6:10.3f} {change:>8}  {r['kernel']}")


@reports.command("reindex")
@store_option
@json_option
def reports_reindex(store_root, as_json):
    """Rebuild the catalog from the runs' manifests."""
    from .. import store

    n, skipped = store.reindex(store.root(store_root))
    if as_json:
        return echo_json({"runs": n, "left_out": skipped})
    for why in skipped:
        click.echo(f"fleet: left out {why}", err=True)
    click.echo(f"catalogued {n} runs")
