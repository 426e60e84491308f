"""``fleet reports``: the report store and its catalog, from the command line."""

from __future__ import annotations

import sys

import click

from .. import exitcodes
from .parsing import Day
from .context import fail, store_option, stored_run
from .output import echo_json, json_option
from .reports_ranks import reports_ranks
from .terminal import echo, say, visible

@click.group()
def reports():
    """The report store and its catalog."""


reports.add_command(reports_ranks)


@reports.command("ls")
@store_option
@click.option("--host", help="Only reports from this host.")
@click.option("--since", type=Day(), help="Only runs started on or after this date (YYYY-MM-DD).")
@click.option("--tool", type=click.Choice(["nsys", "ncu"]))
@click.option("--status", type=click.Choice(["complete", "finished-from-qdstrm", "summary",
                                             "export", "missing",
                                            "refused", "running"]))
@click.option("--user", help="Only runs of this person (team store).")
@click.option("--shared", is_flag=True, help="Only runs shared with a group (team store).")
@json_option
def reports_ls(store_root, host, since, tool, status, user, shared, as_json):
    """List the catalogued reports (the team store's that you may see, when one is named)."""
    from .. import store
    from . import reports_team

    team = reports_team.team_store()
    if team is not None:
        return reports_team.ls(team, host=host, since=since, tool=tool, status=status, user=user,
                               shared=shared, as_json=as_json)
    if user or shared:
        fail("--user and --shared need a team store (docs/team-store.md); the "
             "embedded store holds your runs alone")
    rows = store.reports(store.root(store_root), host=host, since=since, tool=tool, status=status)
    if as_json:
        return echo_json(rows)
    from .output import print_table

    print_table(["RUN", "HOST", "TOOL", "STATUS", "SHA256", "PATH"],
                [[r["run_id"], _who(r), r["tool"], r["status"], (r["sha256"] or "")[:12], r["path"]]
                 for r in rows],
                status_column=3)


def _who(row: dict) -> str:
    """A row's host, and a Ray worker's actor (``vm Trainer trainer-0``), printable: the job named
    it."""
    from ..safenames import CONTROL

    actor = (row.get("worker") or "").split(" on ", 1)[0]
    return CONTROL.sub("?", f"{row['host']} {actor}" if actor else row["host"])


@reports.command("show")
@click.argument("run_id")
@store_option
@json_option
def reports_show(run_id, store_root, as_json):
    """A run's manifest: request, hosts, reports, what is missing and why."""
    from . import reports_team

    if (team := reports_team.team_store()) is not None:
        return reports_team.show(team, run_id, as_json)
    m = stored_run(store_root, run_id)
    if as_json:
        return echo_json(m.to_json())
    tool = m.asked.tool
    say(f"run {m.run_id} ({m.status}), site {m.site}, by {m.user} at {m.started}: "
        f"{m.asked.said()}")
    for h in m.hosts:
        who = h.host + (f" rank {h.rank}" if h.rank is not None else "") + (f" {h.worker}"
                                                                            if h.worker else "")
        say(f"  {who}: {h.status}" + (f" ({h.missing_why})" if h.missing_why else "")
             + (f"; {h.gpu}, driver {h.driver}, {tool} {h.tool_version}" if h.gpu else ""))
        for g in h.given_up:
            say(f"      gave up: {g}")
        for r in h.reports:
            say(f"      {r.status:<21} {(r.sha256 or '')[:12]:<12}  {r.stored or r.remote}")


@reports.command("pull")
@click.argument("run_id")
@click.argument("dest", type=click.Path())
@store_option
@json_option
def reports_pull(run_id, dest, store_root, as_json):
    """Copy a run's reports out of the store into DEST/HOST/, checked against their sha256."""
    from pathlib import Path

    from .. import store
    from . import reports_team

    if (team := reports_team.team_store()) is not None:
        return reports_team.pull(team, run_id, dest, as_json)

    try:
        pulled = store.pull(store.root(store_root), run_id, Path(dest))
    except LookupError as e:
        fail(str(e))
    for p in pulled:
        if p.target is None:
            echo(f"{p.host}: {p.problem}", err=True)
        elif not as_json:
            echo(f"{p.target}" + (f"  {p.problem}" if p.problem else ""))
    if as_json:
        echo_json({"run_id": run_id, "copied": [{"host": p.host, "path": str(p.target),
                                                 "verified": p.problem is None}
                                                for p in pulled if p.target is not None]})
    # a file the node never wrote is said, and is not a failed copy
    sys.exit(exitcodes.for_parts(p.problem is not None and not p.missing for p in pulled))


@reports.command("rm")
@click.argument("run_id")
@store_option
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
@click.option("--force", is_flag=True,
              help="Remove a run whose manifest says it is still running (its fleet "
              "was stopped and will not save it again).")
@json_option
def reports_rm(run_id, store_root, dry_run, force, as_json):
    """Delete run RUN_ID (an exact id, never a pattern): its folder and its catalog rows. A run
    still running is refused, unless --force."""
    from .. import store
    from . import reports_team

    if (team := reports_team.team_store()) is not None:
        return reports_team.rm(team, run_id, dry_run, as_json)

    try:
        gone = store.remove_run(store.root(store_root), run_id, dry_run=dry_run, force=force)
    except LookupError as e:
        fail(str(e))
    if as_json:
        return echo_json({"run_id": run_id, "removed": str(gone.directory), "dry_run": dry_run,
                          "files": gone.files, "catalog_rows": gone.catalog_rows})
    echo(f"{'would remove' if dry_run else 'removed'} {gone.directory} ({gone.files} files, "
         f"{gone.catalog_rows} catalog rows)")


full_names_option = click.option("--full-names", is_flag=True,
                                 help="Kernel names in full, as the profiler wrote "
                                      "them (shortened by default).")


def _stats_failed(e) -> None:
    """The line of a run that cannot be shown; its reasons come from nodes: :func:`fail` escapes
    them."""
    fail(str(e), e.exit_status)


@reports.command("compare")
@click.argument("run_a")
@click.argument("run_b")
@store_option
@click.option("--top", type=click.IntRange(1), default=15, show_default=True,
              help="Rows of the table.")
@full_names_option
@json_option
def reports_compare(run_a, run_b, store_root, top, full_names, as_json):
    """The GPU kernels whose total time changed most from RUN_A to RUN_B (two runs of one tool).
    A run that left no reports, or runs of different tools, are refused with the reason."""
    from .. import store
    from ..store import comparison, stats
    from .reports_team import local_store

    store_root = local_store(store_root, [run_a, run_b])
    a, b = (stored_run(store_root, run) for run in (run_a, run_b))
    try:
        found = comparison.compare_runs(store.root(store_root), a, b)
    except stats.StatsError as e:
        _stats_failed(e)
    rows = found.rows[:top]
    if as_json:
        return echo_json(rows)
    for note in found.header() + found.notes():
        echo(visible(note))
    echo(f"{'A ms':>10} {'B ms':>10} {'change':>8}  kernel")
    for r in rows:
        change = f"{r['change'] * 100:+.1f}%" if r["change"] is not None else "new"
        name = r["kernel"] if full_names else r["short_name"]
        echo(f"{r['a_ns'] / 1e6:10.3f} {r['b_ns'] / 1e6:10.3f} {change:>8}  {visible(name)}")


@reports.command("stats")
@click.argument("run_id")
@click.argument("which", metavar="[HOST|RANK]", required=False)
@store_option
@click.option("--top", type=click.IntRange(1), default=10, show_default=True,
              help="Rows of each table.")
@full_names_option
@json_option
def reports_stats(run_id, which, store_root, top, full_names, as_json):
    """A run's top GPU kernels, CUDA API calls and NVTX ranges by total time, from the summaries
    in the store; one column per host or rank (or only HOST, or RANK). A run that left none
    says why in one line, and exits 10."""
    from .. import store
    from ..store import stats
    from .reports_team import local_store

    store_root = local_store(store_root, [run_id])
    m = stored_run(store_root, run_id)
    try:
        found = stats.run_stats(store.root(store_root), m, which)
    except stats.StatsError as e:
        _stats_failed(e)
    if as_json:
        return echo_json(found.to_json(top))
    from .output import print_stats

    print_stats(found, top, full_names)


@reports.command("open")
@click.argument("run_id")
@click.argument("which", metavar="[HOST|RANK]", required=False)
@store_option
@json_option
def reports_open(run_id, which, store_root, as_json):
    """Open a run's reports (or HOST's, or RANK's) in nsys-ui or ncu-ui when it is on PATH;
    otherwise print the command that would, with the reports' paths."""
    from .. import store
    from ..store import viewer
    from .reports_team import local_store

    store_root = local_store(store_root, [run_id])
    m = stored_run(store_root, run_id)
    try:
        opening = viewer.open_reports(store.root(store_root), m, which)
    except viewer.StatsError as e:
        fail(str(e))
    except OSError as e:  # found on PATH but would not start
        fail(opening_failed(e), exitcodes.FAILED)
    if as_json:
        return echo_json({"run_id": run_id, "viewer": opening.viewer,
                          "opened": opening.pid is not None,
                          "pid": opening.pid, "command": opening.command,
                          "reports": opening.reports})
    if opening.pid is not None:
        echo(f"opened {len(opening.reports)} report(s) in {opening.viewer} (pid {opening.pid})")
    else:
        echo(f"{opening.viewer} is not on PATH; open the report(s) with:\n  {opening.shell_line()}")
    for path in opening.reports:
        echo(f"  {path}")


def opening_failed(e: OSError) -> str:
    return f"the viewer would not start: {e.strerror or e}" + (f" ({e.filename})" if e.filename
                                                               else "")


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
        echo(f"fleet: left out {why}", err=True)
    echo(f"catalogued {n} runs")


@reports.command("push")
@click.argument("run_ids", nargs=-1)
@store_option
@json_option
def reports_push(run_ids, store_root, as_json):
    """Send runs of the embedded store to the team store (all finished runs without RUN_IDS): every
    file verified against its sha256, the catalog's rows last; pushing again changes nothing."""
    from . import reports_team
    from .team import team_store_or_fail

    reports_team.push(team_store_or_fail(), store_root, run_ids, as_json)


@reports.command("share")
@click.argument("run_id")
@click.argument("group")
@json_option
def reports_share(run_id, group, as_json):
    """Let the members of GROUP (a role of the team catalog you belong to) see run RUN_ID of
    yours."""
    from . import reports_team
    from .team import team_store_or_fail

    reports_team.share(team_store_or_fail(), run_id, group, as_json)
