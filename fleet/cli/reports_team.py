"""``fleet reports`` on the team store (fleet/store/team/): the same commands and columns as on the
embedded store, with the owner of each run, and ``push`` and ``share``, which
only a team store has."""

from __future__ import annotations

import sys
from pathlib import Path

from .. import exitcodes
from .context import fail
from .output import echo_json, print_table
from .terminal import echo, say


def team_store():
    """The team store named (options, environment, site file), or None: the embedded store then."""
    from ..store.team.config import resolve

    return resolve()


def local_store(store_root, run_ids: list[str]):
    """Where ``stats``, ``compare``, ``ranks`` and ``open`` read runs: with a team store, a private
    copy of those runs (fleet/store/team/read.py:materialize); else the embedded store as given."""
    team = team_store()
    if team is None:
        return store_root
    from ..store.team import read

    try:
        return str(read.materialize(team, run_ids))
    except LookupError as e:
        fail(str(e))


def ls(team, *, host, since, tool, status, user, shared, as_json) -> None:
    from ..store.team import read

    filters = dict(host=host, since=since, tool=tool, status=status, user=user, shared=shared)
    if as_json:
        return echo_json(read.reports(team, **filters))
    print_table(["RUN", "OWNER", "HOST", "TOOL", "STATUS", "SHA256", "NAME"],
                read.report_table(team, **filters), status_column=4)


def show(team, run_id: str, as_json: bool) -> None:
    from ..store.team import read

    try:
        owner, m, groups = read.manifest(team, run_id)
    except LookupError as e:
        fail(str(e))
    if as_json:
        return echo_json({"owner": owner, "shared_with": groups, **m.to_json()})
    shared = f", shared with {', '.join(groups)}" if groups else ""
    say(f"run {m.run_id} ({m.status}), site {m.site}, owner {owner}{shared}, at {m.started}: "
        f"{m.asked.said()}")
    for h in m.hosts:
        who = h.host + (f" rank {h.rank}" if h.rank is not None
                        else "") + (f" {h.worker}" if h.worker else "")
        say(f"  {who}: {h.status}" + (f" ({h.missing_why})" if h.missing_why else ""))
        for r in h.reports:
            say(f"      {r.status:<21} {(r.sha256 or '')[:12]:<12}  "
                f"{Path(r.stored or r.remote).name}")


def pull(team, run_id: str, dest: str, as_json: bool) -> None:
    from ..store.team import read

    try:
        pulled = read.pull(team, run_id, Path(dest))
    except LookupError as e:
        fail(str(e))
    for p in pulled:
        if p.target is None:
            echo(f"{p.host}/{p.name}: {p.problem}", err=True)
        elif not as_json:
            echo(str(p.target))
    if as_json:
        echo_json({"run_id": run_id, "copied": [{"host": p.host, "path": str(p.target),
                                                 "verified": True}
                                                for p in pulled if p.target is not None]})
    sys.exit(exitcodes.for_parts(p.target is None for p in pulled))


def rm(team, run_id: str, dry_run: bool, as_json: bool) -> None:
    from ..store.team import read

    if dry_run:
        owner, m, _ = read.manifest(team, run_id)
        files = sum(len(h.reports) for h in m.hosts)
        return echo(f"would remove run {run_id} ({owner}'s, {files} files) from the team store")
    try:
        gone = read.remove(team, run_id)
    except LookupError as e:
        fail(str(e))
    if as_json:
        return echo_json({"run_id": run_id, "removed_objects": gone})
    echo(f"removed run {run_id} from the team store ({gone} objects)")


def push(team, store_root, run_ids: tuple[str, ...], as_json: bool) -> None:
    from .. import store
    from ..store.team import read

    def said(run_id, done, why):
        if as_json:
            return
        if why is not None:
            echo(f"{run_id}: not pushed ({why})", err=True)
        elif done.unchanged:
            echo(f"{run_id}: already in the team store, unchanged")
        else:
            resumed = (f", {done.resumed_parts} part(s) of a cut upload kept" if done.resumed_parts
                       else "")
            echo(f"{run_id}: pushed ({done.sent} file(s) sent, "
                 f"{done.already_there} already there{resumed})")

    report = read.push_runs(team, store.root(store_root), list(run_ids) or None, on_run=said)
    if as_json:
        echo_json({"pushed": [{"run_id": p.run_id, "sent": p.sent, "already_there": p.already_there,
                               "unchanged": p.unchanged} for p in report.pushed],
                   "not_pushed": [{"run_id": r, "why": why} for r, why in report.failed]})
    elif not report.failed:
        echo(f"{len(report.pushed)} run(s) in the team store")
    sys.exit(exitcodes.for_parts([bool(report.failed)]))


def share(team, run_id: str, group: str, as_json: bool) -> None:
    from ..store.team import read

    try:
        groups = read.share(team, run_id, group)
    except LookupError as e:
        fail(str(e))
    if as_json:
        return echo_json({"run_id": run_id, "shared_with": groups})
    echo(f"run {run_id} is shared with {', '.join(groups)}")
